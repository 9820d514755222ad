"""One scenario's leaderboard table, built from stored records only (no rendering here).

Layout, left to right: the defense (a sticky column on the page), its key topology, the
strongest-attack columns, each attack's own columns, then the run-level columns.

- Strongest attack (RobustBench's AutoAttack idea): for every privacy metric an attack reports,
  the worst case for the defended client over every attack that ran on that defense. Reference
  attacks (random guessing) are floors, never a worst case. "Blocked" counts as protection only
  when every attack of the families that report the metric was blocked on that defense; one that
  ran, failed or reported no number keeps the cell from reading as protected. The first strongest
  column is the ranking key (rank 1 = least leakage; blocked ranks best, failed and missing last).
- A blocked, diverged or failed attack is one merged cell carrying its reason. A diverged group
  (training became non-finite) is no protection and no error: its privacy cells say "diverged",
  its utility columns hold the last finite global model's, and `diverged_round` says when.
- Attack-level metrics show mean +- std over the attacked uploads (attack_repeats); metrics
  that are a property of the run or of the view (accuracy, epsilon, costs, kde_mi) show once per defense.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from leaderboards.schema import family, schema_of

FAMILY_ORDER = ("image", "text", "membership", "label", "")   # order of the strongest columns
HEADLINE = ("psnr", "ssim", "lpips", "rouge1", "rouge2", "exact_match", "mia_auroc", "mia_tpr_at_1fpr", "lnacc",
            "leacc", "label_acc")   # within a family, the headline metrics first (the first column ranks)
LEAD = 4   # defense, rank, key topology, colluders: the columns before the metric columns


def defense_label(rec: dict[str, Any]) -> str:
    return _label(rec["defense"], rec["defense_params"], rec["scenario"])


def attack_label(rec: dict[str, Any]) -> str:
    return _label(rec["attack"], rec["attack_params"], rec["scenario"])


def _label(name: str, params: dict[str, Any], scenario: str) -> str:
    """name(k=v, ...); a parameter given per scenario (a table keyed by scenario names) shows this scenario's value."""
    shown = {k: (v[scenario] if isinstance(v, dict) and scenario in v else v) for k, v in params.items()}
    return name + ("(" + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) + ")" if shown else "")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class Column:
    key: str                  # metric name
    group: str                # "strongest", an attack label, or "run"
    header: str               # display name
    unit: str
    arrow: str
    lower_is_better: bool | None
    description: str = ""
    index: int = 0            # position among the table's columns (what the page's sorter uses)


@dataclass
class Group:
    name: str
    title: str
    family: str = ""
    columns: list[Column] = field(default_factory=list)


def _column(m, group: str) -> Column:
    return Column(m.name, group, m.title, m.unit, m.arrow, m.lower_is_better,
                  m.description)


def _attack_level(m) -> bool:
    level = getattr(m, "per_attack", None)
    return (m.per_target and m.kind == "privacy") if level is None else level


def worst(values: list[tuple[float, str]], lower_is_better: bool | None) -> tuple[float, str]:
    """The value most favourable to the attacker: max when lower is better for the client, else min."""
    pick = min if lower_is_better is False else max
    return pick(values, key=lambda v: v[0])


def scenario_table(records: list[dict[str, Any]]) -> dict[str, Any]:
    schema = schema_of(records)
    attacks = list(dict.fromkeys(attack_label(r) for r in records))
    families = {a: family(next(r for r in records if attack_label(r) == a)) for a in attacks}
    groups: list[Group] = []
    reported: dict[str, set[str]] = {}  # metric -> families of the (non-reference) attacks reporting it
    for att in attacks:
        present = {k for r in records if attack_label(r) == att for k, v in r["metrics"].items()}
        cols = [_column(m, att) for name, m in schema.items() if name in present and _attack_level(m)]
        if not cols:  # nothing reported (every cell failed or blocked): a status column keeps the reasons visible
            cols = [Column("status", att, "status", "", "", None, "the cell's status")]
        groups.append(Group(att, att, families[att], cols))
        if families[att] != "reference":
            for c in cols:
                if c.key in schema and schema[c.key].kind == "privacy" and any(is_number(r["metrics"].get(c.key)) for r in records
                                           if attack_label(r) == att):
                    reported.setdefault(c.key, set()).add(families[att])
    ordered = sorted(reported, key=lambda k: (min(FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 9
                                                  for f in reported[k]),
                                              HEADLINE.index(k) if k in HEADLINE else len(HEADLINE),
                                              list(schema).index(k)))
    strongest = Group("strongest", "strongest attack (worst case over attacks)", "",
                      [_column(schema[k], "strongest") for k in ordered])
    present = {k for r in records for k in r["metrics"]}
    run_cols = [_column(m, "run") for kind in ("privacy", "utility", "cost") for name, m in schema.items()
                if m.kind == kind and name in present and not _attack_level(m)]
    all_groups = ([strongest] if strongest.columns else []) + groups + ([Group("run", "run (once per defense)", "",
                                                                              run_cols)] if run_cols else [])
    index = LEAD
    for g in all_groups:
        for c in g.columns:
            c.index = index
            index += 1
    rows = [_row(dlabel, [r for r in records if defense_label(r) == dlabel], all_groups, reported, families, schema)
            for dlabel in dict.fromkeys(defense_label(r) for r in records)]
    _rank(rows, strongest.columns[0] if strongest.columns else None)
    return {"groups": all_groups, "rows": rows, "rank_key": strongest.columns[0].header if strongest.columns else ""}


def _row(dlabel: str, mine: list[dict[str, Any]], groups: list[Group], reported, families, schema) -> dict[str, Any]:
    by_attack = {attack_label(r): r for r in mine}
    run = next((r for r in mine if r["status"] == "ok"), next((r for r in mine if r["metrics"]), mine[0]))
    cells: list[dict[str, Any]] = []
    for g in groups:
        if g.name == "strongest":
            cells += [_strongest(c, mine, reported.get(c.key, set()), families, schema) for c in g.columns]
        elif g.name == "run":
            cells += [_value(run["metrics"].get(c.key), schema[c.key], None) for c in g.columns]
        else:
            rec = by_attack.get(g.name)
            if rec is None:
                cells.append({"text": "not run", "sort": "", "cls": "na", "span": len(g.columns)})
            elif rec["status"] != "ok":
                cells.append({"text": rec["reason"] or rec["status"], "sort": "", "cls": rec["status"],
                              "span": len(g.columns)})
            else:
                cells += [{"text": "ok", "sort": "", "cls": "", "span": 1} if c.key == "status" else
                          _value(rec["metrics"].get(c.key), schema[c.key],
                                 rec["details"].get("per_target", {}).get(c.key)) for c in g.columns]
    return {"defense": dlabel, "topology": run["details"].get("key_topology", ""),
            "colluders": run["details"].get("decrypts_single_upload", ""), "cells": cells, "records": mine}


def _value(value: Any, metric, repeats: list | None) -> dict[str, Any]:
    text = metric.format(value)
    if is_number(value) and repeats and len(repeats) > 1 and all(is_number(v) for v in repeats):
        text += " ± " + metric.format(statistics.pstdev(repeats))
    cell = {"text": text, "sort": value if is_number(value) else "", "cls": "na" if isinstance(value, str) else "",
            "span": 1}
    flag = getattr(metric, "flag_above", None)
    if flag is not None and is_number(value) and value > flag:
        cell.update(cls="flagged", title=f"above {flag}: {metric.description}")
    return cell


def _strongest(col: Column, mine: list[dict[str, Any]], fams: set[str], families, schema) -> dict[str, Any]:
    relevant = [r for r in mine if families.get(attack_label(r)) in fams]
    values = [(r["metrics"][col.key], attack_label(r)) for r in relevant
              if r["status"] == "ok" and is_number(r["metrics"].get(col.key))]
    if values:
        value, by = worst(values, col.lower_is_better)
        cell = _value(value, schema[col.key], None)
        return {**cell, "by": by}
    if any(r["status"] == "ok" for r in relevant):
        text = next((r["metrics"][col.key] for r in relevant if isinstance(r["metrics"].get(col.key), str)),
                    "ran, no value")
        return {"text": text, "sort": "", "cls": "na", "span": 1}
    if any(r["status"] == "diverged" for r in relevant):   # the defense's cost, shown in the utility columns
        return {"text": "diverged", "sort": "", "cls": "diverged", "span": 1,
                "title": next(r["reason"] for r in relevant if r["status"] == "diverged")}
    if any(r["status"] == "failed" for r in relevant):
        return {"text": "failed", "sort": "", "cls": "failed", "span": 1}
    if relevant:  # every attack of these families was blocked by design: protection
        floor = -1e300 if col.lower_is_better is not False else 1e300
        reasons = "; ".join(sorted({r["reason"] for r in relevant}))
        return {"text": "blocked", "sort": floor, "cls": "blocked", "span": 1, "title": reasons}
    return {"text": "not run", "sort": "", "cls": "na", "span": 1}


def _rank(rows: list[dict[str, Any]], key: Column | None) -> None:
    """Order rows by the ranking key (least leakage first) and number them; ties share a rank."""
    if key is None:
        for i, row in enumerate(rows, 1):
            row["rank"] = ""
        return
    sign = -1 if key.lower_is_better is False else 1

    def sort_value(row):
        v = row["cells"][key.index - LEAD]["sort"]  # the strongest group comes first and has no merged cells
        return (0, sign * v) if is_number(v) else (1, 0)

    rows.sort(key=sort_value)
    previous, rank = None, 0
    for i, row in enumerate(rows, 1):
        value = sort_value(row)
        if value[0] == 1:
            row["rank"] = ""
            continue
        if value != previous:
            rank, previous = i, value
        row["rank"] = rank


def clear_not_attacked(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per defense: metadata its uploads' views carried (sent in the clear) that no attack read."""
    out: dict[str, list[str]] = {}
    for dlabel in dict.fromkeys(defense_label(r) for r in records):
        listed: dict[str, int] = {}
        read: set[str] = set()
        for rec in records:
            if defense_label(rec) == dlabel:
                for item in rec["details"].get("sent_in_clear", []):
                    listed[item["key"]] = item["bytes"]
                    if item["attacked"]:
                        read.add(item["key"])
        missed = [f"{key} ({size} B)" for key, size in listed.items() if key not in read]
        if missed:
            out[dlabel] = missed
    return out
