"""Attack calibration: a verdict on a defense needs an attack that breaks the undefended row.

An attack that recovers nothing from a plain upload says nothing about a defense in the same scenario:
"image not recovered" under a defense is then the attack's failure, not the defense's success. So in each
scenario an attack's cells yield verdicts (and count toward worst cases, ranks and the front page) only when
the same attack, with the same parameters, reaches at least the middle band ("partly recovered", "membership
signal") on the undefended row of that scenario. Which rows are undefended each record says itself
(details `undefended`: whether its defense row, with its parameters, uploads the trained update unprotected,
Defense.undefended, stored when the cell was computed and sealed with it), so nothing here names a defense and
no page info can move the yardstick. Otherwise the attack's cells read "no verdict" with the undefended row's
value as the reason. Calibration fails closed: where the records cannot say which row is undefended (records
from before they stored it) or the scenario has none, the attack gives no verdict. Nor does an attack that breaks
the undefended row no better than chance: where the scenario ran a reference floor (random guessing) on that row,
the attack's value of every banded metric the two share must beat the floor's beyond the floor's 95% interval
(a label accuracy of 0.58 at B = 8 reads "partly recovered" by its band, yet guessing 8 classes blind reads 0.59).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from bench.evaluation.schema import MALICIOUS, defense_label, family, schema_of, undefended
from bench.evaluation.verdicts import BANDS, IMAGE, LABELS, MEMBERSHIP, TEXT, band, worst

BREAKS = ("leak", "partial")   # bands of the undefended row that show the attack works in the scenario
FAMILY_BANDS = {"image": IMAGE, "text": TEXT, "membership": MEMBERSHIP, "audit": MEMBERSHIP, "label": LABELS}


@dataclass(frozen=True)
class Calibration:
    ok: bool
    why: str    # the undefended row's result that decided it

    @property
    def text(self) -> str:
        return "" if self.ok else f"no verdict: {self.why}"


def record_verdict(rec: dict[str, Any], schema):
    """The most severe band over the record's banded metrics of its attack's family (an image attack is judged
    on its images, not on the labels it also recovers), or over all of them where it has none of its family's."""
    keys = [k for k in rec["metrics"] if k in BANDS and k in schema]
    words = FAMILY_BANDS.get(family(rec).removesuffix(MALICIOUS))
    own = [k for k in keys if BANDS[k].words == words]
    return worst([band(k, rec["metrics"][k], schema[k].lower_is_better, rec["details"], rec["metrics"])
                  for k in own or keys])


def calibrate(records: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> dict[str, Calibration]:
    """Per attack label of one scenario's records: whether its cells may give verdicts. Reference attacks
    (floors such as random guessing) never do and are left out."""
    schema = schema_of(records)
    out: dict[str, Calibration] = {}
    for att in dict.fromkeys(label(r) for r in records):
        mine = [r for r in records if label(r) == att]
        if family(mine[0]) == "reference":
            continue
        plain = [r for r in mine if undefended(r)]
        if not plain:
            unknown = [r for r in mine if undefended(r) is None]
            out[att] = Calibration(False, f"its records do not say which row is undefended ({defense_label(unknown[0])}"
                                          " predates it): recompute the scenario" if unknown else
                                          "no undefended row in this scenario to calibrate the attack against")
            continue
        ran = [r for r in plain if r["status"] == "ok"]
        if not ran:
            out[att] = Calibration(False, f"its undefended row ({defense_label(plain[0])}) is {plain[0]['status']}")
            continue
        verdict = worst([record_verdict(r, schema) for r in ran])
        who = defense_label(ran[0])
        floor = _no_better_than_chance(ran, [r for r in records if family(r) == "reference" and undefended(r)
                                             and r["status"] == "ok"], schema)
        if verdict.level in BREAKS and floor:
            out[att] = Calibration(False, f"on {who} it is no better than chance ({floor})")
        elif verdict.level in BREAKS:
            out[att] = Calibration(True, f"{who}: {verdict.text} ({verdict.why})")
        elif verdict.level:
            out[att] = Calibration(False, f"the attack fails without a defense here ({who} {verdict.why})")
        else:
            out[att] = Calibration(False, f"its result on {who} has no verdict band")
    return out


def _no_better_than_chance(ran: list[dict[str, Any]], floors: list[dict[str, Any]], schema) -> str:
    """Where the undefended row's cells of an attack do not beat a reference floor's cells of the same row beyond
    the floor's interval, on a banded metric both report: the comparison in words; "" where they beat it."""
    for rec in ran:
        for ref in (f for f in floors if defense_label(f) == defense_label(rec)):
            for key in (k for k in rec["metrics"] if k in BANDS and k in schema and k in ref["metrics"]):
                mine, theirs = rec["metrics"][key], ref["metrics"][key]
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (mine, theirs)):
                    continue
                ci = ref["details"].get(f"{key}_ci95")
                lower = schema[key].lower_is_better   # the defender's side: lower is less leakage
                if lower is None:
                    continue
                edge = (ci[1] if lower else ci[0]) if isinstance(ci, list) and len(ci) == 2 else theirs
                if (mine <= edge) if lower else (mine >= edge):
                    bounds = f" [{ci[0]:.3g}, {ci[1]:.3g}]" if isinstance(ci, list) and len(ci) == 2 else ""
                    return f"{key} {mine:.3g} against {ref['attack']}'s {theirs:.3g}{bounds}"
    return ""


def calibrated(records: list[dict[str, Any]], cal: dict[str, Calibration],
               label: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """The records whose attack may give a verdict (reference floors kept: they never give one)."""
    return [r for r in records if label(r) not in cal or cal[label(r)].ok]
