"""The front page's table: the standard evaluation (the `core` suite) as one grid, defenses x attacks.

RobustBench's idea: one protocol, every entry run the same way, so rows compare. Columns are the attacks
(grouped by family, as their records name it); a cell is that attack on that defense in the core scenarios
where it ran, with its verdict band (bench/evaluation/verdicts.py), the metric that drove the band, the headline
value with its 95% interval and the number of attacked uploads, and a link to the scenario's table. A cell
says "no verdict" where the attack fails on the undefended row of its scenario (bench/evaluation/calibration.py),
"n/a" where the defense cannot apply to the scenario (with its declared reason), "blocked by design" where
the view or protocol prevents the attack. Utility (bench/evaluation/usefulness.py) and HE cost come from the same
scenarios; each row counts the applicable attacks it was measured against. An attack run on FedSGD gradients
and on FedAvg deltas gets a column for each, and so does an attack run on the trained model (a cell whose
scenario attacks at a round in the second half of training: attack_round >= rounds / 2) beside its round-0
column. Rows follow leaderboards/ordering.py's stated rule (utility breaks no tie here: a grid row's utility spans
the models of several scenarios; the track summaries, leaderboards/summary.py, compare one model's); a row's
utility is its loss against the undefended row of each scenario that measures utility, with a 95% interval
(bench/evaluation/utility_loss.py).
"""
from __future__ import annotations

from typing import Any, Callable

from bench.evaluation.calibration import calibrate, record_verdict
from bench.evaluation.formats import interval, is_number, number
from leaderboards.ordering import LEAKING, order
from leaderboards.safe import site_href
from bench.evaluation.schema import MALICIOUS, family, schema_of
from leaderboards.tables import FAMILY_ORDER, attack_label, defense_label, sources
from bench.evaluation.usefulness import measures_utility, useless
from bench.evaluation.utility_loss import diverged_text, run_of, undefended_run, utility_loss
from bench.evaluation.verdicts import BANDS, LEVELS, Verdict, worst

GRID_FAMILIES = FAMILY_ORDER[:-1] + ("audit",)
FEDAVG = " · FedAvg update"   # a column of an attack on a local-training delta beside its FedSGD column
TRAINED = " · trained model"  # a column of an attack on the trained model beside its round-0 column
STAGES = ("round 0", "trained")
HEADLINE = ("psnr", "lpips", "rouge1", "exact_match", "token_f1", "mia_auroc", "mia_tpr_at_1fpr", "label_acc", "lnacc",
            "leacc")
FAMILY_HEADLINE = {"audit": ("audited_epsilon", "one_run_epsilon"),   # the audit column's headline is its epsilon
                   "image" + MALICIOUS: ("images_recovered",)}
HE_TIME = ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s")


def headline(recs: list[dict[str, Any]], fam: str) -> str | None:
    """A column's headline: the first metric of its family's list (else the shared list) its records report."""
    present = {k for r in recs if r["status"] == "ok" for k, v in r["metrics"].items() if is_number(v)}
    return next((k for k in FAMILY_HEADLINE.get(fam, ()) + HEADLINE if k in present), None)


def _support(rec: dict[str, Any], fam: str, key: str | None) -> str:
    """What the value rests on: attacked uploads, or the membership candidates / canary trials scored."""
    details = rec["details"]
    if is_number((details.get("one_run_audit") or {}).get("canaries")):
        return f"{details['one_run_audit']['canaries']:.0f} canaries in one upload"
    if is_number(details.get("n_nonmembers")):
        members = details.get("n_members")
        return (f"{members:.0f} members, " if is_number(members) else "") + f"{details['n_nonmembers']:.0f} non-members"
    n = len(details.get("per_target", {}).get(key) or []) if key else 0
    n = n or ((rec.get("config") or {}).get("scenario") or {}).get("attack_repeats", 0)
    word = "trial" if fam == "audit" else "attacked upload"
    return f"{n} {word}{'s' if n != 1 else ''}"


def _scenario(rec: dict[str, Any]) -> dict[str, Any]:
    return (rec.get("config") or {}).get("scenario") or {}


def _update(rec: dict[str, Any]) -> str:
    return _scenario(rec).get("attack_update", "gradient")


def stage(rec: dict[str, Any]) -> str:
    """"trained" when the cell attacks a round in the second half of its scenario's training, else "round 0"."""
    at, rounds = _scenario(rec).get("attack_round", 0), _scenario(rec).get("rounds")
    return STAGES[1] if is_number(at) and is_number(rounds) and rounds > 0 and at >= rounds / 2 else STAGES[0]


def _column_of(records: list[dict[str, Any]]) -> Callable[[dict[str, Any]], str]:
    """Record -> its column: the attack label, split by the upload it read (FedSGD gradient or FedAvg delta) where
    the same attack ran on both, so the page shows how much of its leakage survives local training, and marked
    when it attacked the trained model."""
    kinds: dict[str, set[str]] = {}
    for r in records:
        kinds.setdefault(attack_label(r), set()).add(_update(r))
    split = {a for a, k in kinds.items() if len(k) > 1}
    return lambda r: (attack_label(r) + (FEDAVG if attack_label(r) in split and _update(r) == "delta" else "")
                      + (TRAINED if stage(r) == STAGES[1] else ""))


def _columns(records: list[dict[str, Any]], column_of) -> list[dict[str, Any]]:
    ids = list(dict.fromkeys(column_of(r) for r in records if family(r) not in ("reference", "")))
    fam = {c: family(next(r for r in records if column_of(r) == c)) for c in ids}
    rank = GRID_FAMILIES + tuple(f + MALICIOUS for f in GRID_FAMILIES)   # the malicious server's columns last
    ids.sort(key=lambda c: (rank.index(fam[c]) if fam[c] in rank else len(rank), c.removesuffix(TRAINED), c))
    schema = schema_of(records)
    cols = []
    for c in ids:
        mine = [r for r in records if column_of(r) == c]
        key, a = headline(mine, fam[c]), attack_label(mine[0])
        rounds = sorted({(_scenario(r).get("attack_round", 0), _scenario(r).get("rounds")) for r in mine}, key=str)
        cols.append({"id": c, "attack": a, "name": mine[0]["attack"], "params": a[len(mine[0]["attack"]):],
                     "upload": FEDAVG.strip(" ·") if FEDAVG in c else "", "family": fam[c], "key": key,
                     "shown": schema.get(key), "stage": stage(mine[0]),
                     "rounds": ", ".join(f"round {at}" + (f" of {n}" if n else "") for at, n in rounds),
                     "scenarios": list(dict.fromkeys(r["scenario"] for r in mine)),
                     "sources": sources(mine[0], "attack")})
    return cols


def _cell(recs: list[dict[str, Any]], col: dict[str, Any], cal: dict, schema, href) -> dict[str, Any]:
    """One (defense, attack) cell over the core scenarios where both ran: the worst band among calibrated ones."""
    judged = [r for r in recs if cal[r["scenario"]].get(col["attack"]) is None or cal[r["scenario"]][col["attack"]].ok]
    ok = [r for r in judged if r["status"] == "ok"]
    if ok:
        rec = max(ok, key=lambda r: LEVELS.index(record_verdict(r, schema).level)
                  if record_verdict(r, schema).level in LEVELS else -1)
        verdict, key, shown = record_verdict(rec, schema), col["key"], col["shown"]
        value = rec["metrics"].get(key) if key else None
        return {"kind": "ok", "verdict": verdict, "sort": LEVELS.index(verdict.level) if verdict.level else "",
                "value": number(value, shown.unit, shown.fmt) if shown and is_number(value) else "",
                "interval": interval(rec["details"].get(f"{key}_ci95"), shown.unit, shown.fmt) if shown else "",
                "support": _support(rec, col["family"], key),
                "metric": shown.header if shown else "", "drives": verdict.why, "href": href(rec)}
    for status in ("diverged", "failed"):
        hit = [r for r in judged if r["status"] == status]
        if hit:
            text = diverged_text(hit[0]) if status == "diverged" else status
            return {"kind": status, "verdict": Verdict("", text, hit[0]["reason"]), "sort": "", "href": href(hit[0])}
    if judged:   # every calibrated scenario blocked it
        reason = judged[0]["reason"].removeprefix("blocked by design: ")
        return {"kind": "blocked", "verdict": Verdict("blocked", "blocked by design", reason), "sort": 0,
                "href": href(judged[0])}
    why = "; ".join(dict.fromkeys(cal[r["scenario"]][col["attack"]].text for r in recs))
    return {"kind": "uncal", "verdict": Verdict("", "no verdict", why), "sort": "", "href": href(recs[0])}


def columns_for(records: list[dict[str, Any]]) -> tuple[Callable[[dict[str, Any]], str], list[dict[str, Any]]]:
    """(record -> its column id, the columns) of a set of scenarios' records."""
    column_of = _column_of(records)
    return column_of, _columns(records, column_of)


def row_cells(mine: list[dict[str, Any]], d: str, columns: list[dict[str, Any]], column_of, cal: dict, schema,
              na: dict[str, dict[str, str]], href) -> tuple[list[dict[str, Any]], int, int]:
    """One row's cells (its records `mine`, its label `d`) under the columns, with (measured, applicable) counts:
    a column where the defense applies to none of its scenarios is n/a, one where it applies but has no record
    is "not run"."""
    cells, measured, applicable = [], 0, 0
    for col in columns:
        recs = [r for r in mine if column_of(r) == col["id"]]
        reasons = [na[s][d] for s in col["scenarios"] if d in na.get(s, {})]
        if recs:
            cells.append(_cell(recs, col, cal, schema, href))
            applicable, measured = applicable + 1, measured + 1
        elif reasons:
            cells.append({"kind": "na", "verdict": Verdict("", "n/a", reasons[0]), "sort": ""})
        else:
            cells.append({"kind": "missing", "verdict": Verdict("", "not run", "this cell was not computed"),
                          "sort": ""})
            applicable += 1
    for prev, cell in zip(cells, cells[1:]):   # a reason the cell to its left gave is not spelled out again
        cell["repeat"] = (cell["kind"] in ("na", "blocked", "uncal") and prev["kind"] == cell["kind"]
                          and prev["verdict"].why == cell["verdict"].why)
    return cells, measured, applicable


def leaking(columns: list[dict[str, Any]], cells: list[dict[str, Any]]) -> dict[str, Any]:
    """What the ranking rule (leaderboards/ordering.py) reads of a row: `leaks`, the (family, stage) cells in which
    its calibrated verdicts leak; `bands`, each such cell's most severe band (1 partly, 2 recovered); `judged`, how
    many calibrated verdicts it has."""
    verdicts = [((col["family"], col["stage"]), c["verdict"].level) for col, c in zip(columns, cells)
                if c["kind"] in ("ok", "blocked") and c["verdict"].level in LEVELS]
    bands: dict[tuple[str, str], int] = {}
    for k, level in verdicts:
        if level in LEAKING:
            bands[k] = max(bands.get(k, 0), LEAKING[::-1].index(level) + 1)
    return {"leaks": frozenset(bands), "bands": bands, "judged": len(verdicts)}


def grid(name: str, records: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """The core grid of one output directory (`name`, linked relative to the front page)."""
    schema = schema_of(records)
    column_of, columns = columns_for(records)
    scenarios = list(dict.fromkeys(r["scenario"] for r in records))
    cal = {s: calibrate([r for r in records if r["scenario"] == s], attack_label) for s in scenarios}
    flat = {s: useless([r for r in records if r["scenario"] == s], info, s, defense_label) for s in scenarios}
    judged = {s for s in scenarios if measures_utility([r for r in records if r["scenario"] == s], info, s,
                                                       defense_label)}
    na = info.get("not_applicable") or {}
    untrained = set(info.get("untrained") or ())

    def href(rec):
        return site_href(name, fragment=f"{rec['suite']}--{rec['scenario']}")

    rows = []   # every defense with a record, and those that apply to no core scenario (n/a throughout)
    for d in dict.fromkeys([defense_label(r) for r in records] + [d for s in scenarios for d in na.get(s, {})]):
        mine = [r for r in records if defense_label(r) == d]
        if mine and mine[0]["defense"] in untrained:
            continue   # the untrained model is a yardstick of utility, not a defense
        cells, measured, applicable = row_cells(mine, d, columns, column_of, cal, schema, na, href)
        no_util = "; ".join(f"{s}: {flat[s][d]}" for s in scenarios if d in flat[s])
        utility = _utility([r for r in mine if r["scenario"] in judged], records, href)
        rows.append({"name": d, "defense": mine[0]["defense"] if mine else d,
                     "sources": sources(mine[0], "defense") if mine else {},
                     "cells": cells, "measured": measured, "applicable": applicable, "no_utility": no_util,
                     "topology": next((r["details"].get("key_topology") for r in mine
                                       if r["details"].get("key_topology")), ""),
                     "verdict": worst([c["verdict"] for c in cells if c["kind"] in ("ok", "blocked")])
                     if measured else Verdict("", "n/a" if not applicable else "not run", ""),
                     **leaking(columns, cells), "complete": measured == applicable,
                     "coverage": (measured, applicable), "na": "" if applicable else "applies nowhere",
                     "loss": None,   # its utility spans several models: no tie is broken by it here
                     "utility": utility, "he": _he(mine, href)})
    rows = order(rows)
    for i, row in enumerate(rows):   # anchors the summary above the grid links to
        row["id"] = f"grid-row{i}"
        for j, cell in enumerate(row["cells"]):
            cell["id"] = f"grid-row{i}-col{j}"
    families = []
    for col in columns:
        if families and families[-1]["family"] == col["family"]:
            families[-1]["span"] += 1
        else:
            families.append({"family": col["family"], "span": 1})
    return {"name": name, "columns": columns, "families": families, "rows": rows, "scenarios": scenarios,
            "calibration": {s: [{"attack": a, "ok": c.ok, "why": c.why} for a, c in cal[s].items()] for s in scenarios}}


def _utility(mine, records, href) -> list[dict[str, Any]]:
    """Per core scenario that measures utility: the row's loss against the undefended row's utility there, with its
    95% interval (bench/evaluation/utility_loss.py), the largest relative loss first (a drop in accuracy and a rise in
    perplexity compare as fractions of the undefended value, not in their own units)."""
    out = []
    for s in dict.fromkeys(r["scenario"] for r in mine):
        rec = run_of([r for r in mine if r["scenario"] == s])
        loss = utility_loss(rec, undefended_run([r for r in records if r["scenario"] == s])) if rec else None
        if loss is not None:
            out.append({**loss, "scenario": s, "href": href(rec)})
    return sorted(out, key=lambda u: -u["relative"])


def _he(mine, href) -> dict[str, Any] | None:
    """The largest HE time per round (encrypt + aggregate + decrypt) over the core scenarios, with its upload."""
    best = None
    for rec in mine:
        times = [rec["metrics"][k] for k in HE_TIME if is_number(rec["metrics"].get(k))]
        if times and (best is None or sum(times) > best["seconds"]):
            best = {"seconds": sum(times), "upload": rec["metrics"].get("upload_bytes"), "scenario": rec["scenario"],
                    "href": href(rec)}
    return best


__all__ = ["grid", "BANDS"]
