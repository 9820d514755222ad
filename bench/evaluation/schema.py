"""What a page knows of a metric and an attack. A metric's schema (unit, direction, format, kind) comes from
today's registry where it defines the metric, else from the records' snapshots (each record stores one of every
metric it reports) only when they all agree on how a value reads: one record cannot turn a metric's direction
round for the others (a disagreement is a one-line refusal, ValueError). An attack's family and a defense row's
role (undefended) are read from the records, each sealed with its digest."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from bench.protocol.records import UNDEFENDED
from bench.evaluation.formats import number


@dataclass(frozen=True)
class Shown:
    """A metric as its records describe it: header, unit, direction, format, kind, level."""

    name: str
    unit: str
    lower_is_better: bool | None
    kind: str
    description: str = ""
    fmt: str = "{:.3f}"
    per_target: bool = True
    timing: bool = False
    display: str = ""
    per_attack: bool | None = None
    title: str = ""
    flag_above: float | None = None

    @property
    def arrow(self) -> str:
        return "" if self.lower_is_better is None else ("↓" if self.lower_is_better else "↑")

    def format(self, value: Any) -> str:
        """The value as a page writes it: bytes as kB/MB, seconds as s/ms, else the schema's format."""
        return number(value, self.unit, self.fmt)

    @property
    def header(self) -> str:
        """The column header: the display title, words spaced, a unit the cells carry not repeated."""
        text = (self.title or self.name).replace("_", " ")
        return text[:-2] + " time" if self.unit == "s" and text.endswith(" s") else text


def described(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that carry their schema snapshot; an older one is named on stderr and left off the page."""
    kept = []
    for rec in records:
        if "metric_schema" in rec["details"]:
            kept.append(rec)
        else:
            print(f"leakbench: warning: skipping record {rec.get('cell_id')!r}: it predates metric schema snapshots; "
                  "rerun its suite to recompute it", file=sys.stderr)
    return kept


READS = ("unit", "kind", "lower_is_better", "fmt", "per_target", "per_attack", "timing", "flag_above")   # how a
# value reads: what records must agree on where the registry does not define the metric (words may differ)


def schema_of(records: list[dict[str, Any]]) -> dict[str, Shown]:
    """Every metric the records report, by name: the registry's schema where it defines the metric, else the
    records' snapshot, which must be the same in every record that has one (ValueError: one line naming two)."""
    from bench.registry import METRICS

    out: dict[str, Shown] = {}
    first: dict[str, tuple[dict[str, Any], str]] = {}
    for rec in records:
        for name, fields in rec["details"].get("metric_schema", {}).items():
            if name in METRICS:
                fields = METRICS.get(name).snapshot()
            elif name in first:
                seen, where = first[name]
                for key in (k for k in READS if seen.get(k) != fields.get(k)):
                    raise ValueError(f"metric {name!r} reads two ways in these records ({key} {seen.get(key)!r} in "
                                     f"cell {where}, {fields.get(key)!r} in cell {rec['cell_id']}) and no installed "
                                     "metric defines it; recompute or drop the records that disagree")
                continue
            else:
                first[name] = fields, rec["cell_id"]
            if name not in out:
                out[name] = Shown(name=name, **{k: v for k, v in fields.items() if k in Shown.__dataclass_fields__})
    return dict(sorted(out.items()))


def undefended(rec: dict[str, Any]) -> bool | None:
    """Whether the record's defense row carries the trained update unprotected, as the cell stored it (None: a
    record from before it was stored, so unknown)."""
    return rec["details"].get(UNDEFENDED)


MALICIOUS = " · malicious server"


def family(rec: dict[str, Any]) -> str:
    """The attack's family as stored with the record (label, image, text, membership, reference), marked when the
    attack's threat model is a server that modifies the model it sends: its columns and worst cases stand apart
    from the honest-but-curious server's, never mixed into them."""
    fam = rec["details"].get("family", "")
    return fam + MALICIOUS if rec["details"].get("threat_model", "passive") != "passive" and fam else fam


def defense_label(rec: dict[str, Any]) -> str:
    return _label(rec["defense"], rec["defense_params"], rec["scenario"])


def attack_label(rec: dict[str, Any]) -> str:
    return _label(rec["attack"], rec["attack_params"], rec["scenario"])


def _label(name: str, params: dict[str, Any], scenario: str) -> str:
    """name(k=v, ...); a parameter given per scenario (a table keyed by scenario names) shows this scenario's value."""
    shown = {k: (v[scenario] if isinstance(v, dict) and scenario in v else v) for k, v in params.items()}
    return name + ("(" + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) + ")" if shown else "")
