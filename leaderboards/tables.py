"""One scenario's leaderboard table, built from stored records only (no rendering here).

Layout, left to right: rank, the defense (both pinned on the page), its verdict band
(bench/evaluation/verdicts.py: what the worst case means on its own) and key topology, then the metric
columns in tabs: "overview" (each family's two headline strongest-attack metrics and utility), "worst
case" (every strongest-attack metric), one tab per attack, run-level privacy, utility, cost, and all.

- Strongest attack (RobustBench's AutoAttack idea): for every privacy metric an attack reports,
  the worst case for the defended client over every attack that ran on that defense. Reference
  attacks (random guessing) are floors, never a worst case. "Blocked" counts as protection only
  when every attack of the families that report the metric was blocked on that defense; one that
  ran, failed or reported no number keeps the cell from reading as protected. The first strongest
  column is the ranking key (rank 1 = least leakage; blocked ranks best, failed and missing last).
  A rank is relative to this table; the verdict band is not.
- A blocked, diverged or failed attack is one merged cell; its reason is a footnote, said once per
  table. A diverged group (training became non-finite) is no protection and no error: its privacy
  cells say "diverged", its utility columns hold the last finite global model's.
- Attack-level metrics show mean +- std over the attacked uploads (attack_repeats) and a stored 95%
  interval: the metric's own (membership AUROC's bootstrap over records) or else a percentile bootstrap of
  the mean over the attacked uploads (bench/run/cells.py); metrics that are a property
  of the run or of the view (accuracy, epsilon, costs, kde_mi) show once per defense. A column no row
  has a number in (a metric unavailable everywhere) is left out and its reason stated once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from leaderboards import cells as C
from bench.evaluation.calibration import Calibration, calibrate
from bench.evaluation.formats import SELF_UNITS, is_number
from bench.evaluation.schema import attack_label, defense_label, family, schema_of
from bench.evaluation.usefulness import useless
from bench.evaluation.verdicts import BLOCKED, NONE, Verdict, band, worst

FAMILY_ORDER = ("image", "text", "membership", "label", "")   # order of the strongest columns
HEADLINE = ("psnr", "ssim", "lpips", "rouge1", "exact_match", "rouge2", "mia_auroc", "mia_tpr_at_1fpr", "lnacc",
            "leacc", "label_acc")   # within a family, the headline metrics first (the first column ranks)
LEAD = 4   # rank, defense, verdict, key topology: the columns before the metric columns
OVERVIEW = 2   # worst-case metrics per attack family on the overview tab (the headline ones, HEADLINE order)
RUN_TABS = (("privacy", "runpriv", "run-level privacy"), ("utility", "utility", "utility"), ("cost", "cost", "cost"))


_OK = Calibration(True, "")


def sources(rec: dict[str, Any], who: str) -> dict[str, str]:
    """The defense's or attack's description and paper/code links as the record stored them."""
    return dict(rec.get("details", {}).get("sources", {}).get(who, {}))


@dataclass
class Column:
    key: str                  # metric name
    group: str                # "strongest", an attack label, or a run group
    header: str               # display name
    unit: str
    arrow: str
    lower_is_better: bool | None
    description: str = ""
    fmt: str = "{:.3f}"
    index: int = 0            # position among the table's columns (what the page's sorter uses)
    tabs: str = ""            # the tabs that show this column

    @property
    def direction(self) -> str:
        """The first click sorts best-first: descending when higher is better for the client."""
        return "desc" if self.lower_is_better is False else "asc"

    @property
    def shown_unit(self) -> str:
        return "" if self.unit in SELF_UNITS else self.unit


@dataclass
class Group:
    name: str
    title: str
    family: str = ""
    columns: list[Column] = field(default_factory=list)
    tabs: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    kind: str = "attack"      # "strongest", "attack" or "run"
    tab_title: str = ""
    nocal: str = ""           # an attack that fails on the undefended row: why its cells give no verdict


def _column(m, group: str) -> Column:
    return Column(m.name, group, m.header, m.unit, m.arrow, m.lower_is_better, m.description, m.fmt)


def _attack_level(m) -> bool:
    level = getattr(m, "per_attack", None)
    return (m.per_target and m.kind == "privacy") if level is None else level


def scenario_table(records: list[dict[str, Any]], info: dict[str, Any] | None = None) -> dict[str, Any]:
    """`info`: the suite's page info (which rows are untrained, chance accuracy), from which, with the records'
    own account of which row is undefended, the attacks' calibration (bench/evaluation/calibration.py) and the rows'
    utility (bench/evaluation/usefulness.py) follow."""
    info = info or {}
    schema = schema_of(records)
    cal = calibrate(records, attack_label)
    flat = useless(records, info, records[0]["scenario"], defense_label) if records else {}
    attacks = list(dict.fromkeys(attack_label(r) for r in records))
    first = {a: next(r for r in records if attack_label(r) == a) for a in attacks}
    families = {a: family(first[a]) for a in attacks}
    notes, dropped = C.Notes(), {}
    groups: list[Group] = []
    reported: dict[str, set[str]] = {}   # metric -> families of the (non-reference) attacks reporting it
    for i, att in enumerate(attacks):
        mine = [r for r in records if attack_label(r) == att]
        present = {k for r in mine for k in r["metrics"]}
        cols = []
        for name, m in schema.items():
            if name not in present or not _attack_level(m):
                continue
            if not any(is_number(r["metrics"].get(name)) for r in mine):   # unavailable everywhere: said once
                why = next((r["metrics"][name] for r in mine if isinstance(r["metrics"].get(name), str)), None)
                if why:
                    dropped.setdefault(f"{m.title or name}: {why}", []).append(att)
                    continue
            cols.append(_column(m, att))
        if not cols:   # nothing reported (every cell failed or blocked): a status column keeps the reasons visible
            cols = [Column("status", att, "status", "", "", None, "the cell's status")]
        groups.append(Group(att, att, families[att], cols, f"a{i} all", sources(first[att], "attack"),
                            tab_title=att))
        if families[att] != "reference":
            for c in cols:
                if c.key in schema and schema[c.key].kind == "privacy" and any(
                        is_number(r["metrics"].get(c.key)) for r in mine):
                    reported.setdefault(c.key, set()).add(families[att])
    ordered = sorted(reported, key=lambda k: (min(FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 9
                                                  for f in reported[k]),
                                              HEADLINE.index(k) if k in HEADLINE else len(HEADLINE),
                                              list(schema).index(k)))
    def primary(k):
        return min(FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 9 for f in reported[k])

    # the overview keeps each family's first OVERVIEW worst-case metrics; the rest sit in "worst case"
    head = [k for k in ordered if [m for m in ordered if primary(m) == primary(k)].index(k) < OVERVIEW]
    strongest = Group("strongest", "strongest attack (worst case over attacks)", "",
                      [_column(schema[k], "strongest") for k in head], "overview worst all", kind="strongest")
    more = Group("strongest-more", "strongest attack, more metrics", "",
                 [_column(schema[k], "strongest") for k in ordered if k not in head], "worst all", kind="strongest")
    present = {k for r in records for k in r["metrics"]}
    run_groups = []
    for kind, tab, title in RUN_TABS:
        cols = [_column(m, tab) for name, m in schema.items()
                if m.kind == kind and name in present and not _attack_level(m)]
        if cols:
            tabs = f"{tab} all" + (" overview" if kind == "utility" else "")
            run_groups.append(Group(tab, title, "", cols, tabs, kind="run", tab_title=title))
    all_groups = [g for g in (strongest, more) if g.columns] + groups + run_groups
    index = LEAD
    for g in all_groups:
        for c in g.columns:
            c.index, c.tabs = index, g.tabs
            index += 1
    added = set(info.get("added") or ())   # rows an extending suite adds to its base's evaluation
    rows = [_row(d, [r for r in records if defense_label(r) == d], all_groups, reported, families, schema, notes,
                 cal, flat.get(d, "")) | {"added": d in added} for d in dict.fromkeys(defense_label(r) for r in records)]
    _rank(rows, strongest.columns[0] if strongest.columns else None)
    if sum(families[a] != "reference" for a in attacks) < 2:   # one attack: "by" would repeat its name in every cell
        for row in rows:
            for cell in row["cells"]:
                cell.pop("by", None)
    tabs = [("overview", "overview")] if any("overview" in g.tabs.split() for g in all_groups) else []
    tabs += [("worst", "worst case, every metric")] if more.columns else []
    tabs += [(g.tabs.split()[0], g.tab_title) for g in groups + run_groups] + [("all", "all columns")]
    for g in groups:
        if g.name in cal and not cal[g.name].ok:
            g.nocal = cal[g.name].text
    return {"groups": all_groups, "rows": rows, "rank_key": strongest.columns[0].header if strongest.columns else "",
            "calibration": [{"attack": a, "ok": c.ok, "why": c.why} for a, c in cal.items()], "no_utility": flat,
            "tabs": tabs, "default_tab": tabs[0][0], "notes": notes.items(),
            "dropped": [{"text": t, "attacks": a} for t, a in dropped.items()]}


def ranks(records: list[dict[str, Any]], info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each row's rank in the table of one scenario's records ("" where it has none): what `leakbench verify` keeps
    when a recomputed cell takes its record's place (bench/run/verify.py)."""
    return {row["defense"]: row["rank"] for row in scenario_table(records, info)["rows"]}


def _row(dlabel: str, mine: list[dict[str, Any]], groups: list[Group], reported, families, schema,
         notes: C.Notes, cal: dict[str, Calibration], no_utility: str) -> dict[str, Any]:
    by_attack = {attack_label(r): r for r in mine}
    run = next((r for r in mine if r["status"] == "ok"), next((r for r in mine if r["metrics"]), mine[0]))
    cells: list[dict[str, Any]] = []
    judged: list = []   # the verdict bands of every strongest-column value of every attack that ran
    for g in groups:
        if g.kind == "strongest":
            mine_cells = []
            for c in g.columns:
                reporting = [r for r in mine if families.get(attack_label(r)) in reported.get(c.key, set())]
                relevant = [r for r in reporting if cal.get(attack_label(r), _OK).ok]
                if reporting and not relevant:   # every attack that could judge it fails on the undefended row
                    why = "; ".join(dict.fromkeys(cal[attack_label(r)].text for r in reporting))
                    mine_cells.append({"text": "no verdict", "sort": "", "cls": "uncal", "span": 1,
                                       "note": notes.add(why), "title": why})
                    continue
                mine_cells.append(C.strongest_cell(c, schema[c.key], relevant, attack_label, notes))
                judged += [band(c.key, r["metrics"].get(c.key), c.lower_is_better, r["details"])
                           for r in relevant if r["status"] == "ok"]
        elif g.kind == "run":
            mine_cells = [C.run_cell(run["metrics"].get(c.key), schema[c.key], notes) for c in g.columns]
        elif (rec := by_attack.get(g.name)) is None:
            mine_cells = [{"text": "not run", "sort": "", "cls": "na", "span": len(g.columns)}]
        elif rec["status"] != "ok":
            mine_cells = [C.status_cell(rec["status"], rec["reason"], len(g.columns), notes)]
        else:
            mine_cells = [{"text": "ok", "sort": "", "cls": "", "span": 1} if c.key == "status" else
                          C.value_cell(rec["metrics"].get(c.key), schema[c.key], rec, notes, c.key)
                          for c in g.columns]
            if g.nocal:   # its values stand, greyed, but judge nothing
                mine_cells = [{**cell, "cls": (cell["cls"] + " uncal").strip(), "title": g.nocal} for cell in mine_cells]
        for cell in mine_cells:   # the record each cell shows, so a page can mark it sealed or reproduced
            source = cell.get("record") if g.kind == "strongest" else run if g.kind == "run" else by_attack.get(g.name)
            cells.append({**cell, "tabs": g.tabs, "strongest": g.kind == "strongest",
                          "cell_id": source["cell_id"] if source else None})
    name = mine[0]["defense"]
    return {"defense": dlabel, "name": name, "params": dlabel[len(name):], "sources": sources(mine[0], "defense"),
            "topology": run["details"].get("key_topology", ""),
            "colluders": run["details"].get("decrypts_single_upload", ""), "cells": cells, "records": mine,
            "no_utility": no_utility,
            "verdict": _verdict([c for c in cells if c["strongest"]], judged)}


def _verdict(strongest: list[dict[str, Any]], judged: list) -> Verdict:
    """The row's absolute band (bench/evaluation/verdicts.py): the most severe over every value of the strongest
    columns' metrics that an attack measured on it; blocked when every such attack was blocked by design."""
    if strongest and all(cell["cls"] == "blocked" for cell in strongest):
        return BLOCKED
    verdict = worst(judged)
    if verdict is NONE and any(cell["cls"] == "diverged" for cell in strongest):
        return Verdict("", "diverged", "training became non-finite: no attack result to judge")
    if verdict is NONE and any(cell["cls"] == "uncal" for cell in strongest):
        return Verdict("", "no verdict", "no attack that ran here breaks the undefended row of this scenario")
    return verdict


def _rank(rows: list[dict[str, Any]], key: Column | None) -> None:
    """Order rows by the ranking key (least leakage first) and number them; ties share a rank. A row without
    utility (bench/evaluation/usefulness.py) ranks below every useful row, however little it leaks."""
    if key is None:
        for row in rows:
            row["rank"] = ""
        return
    sign = -1 if key.lower_is_better is False else 1

    def sort_value(row):
        v = row["cells"][key.index - LEAD]["sort"]  # the strongest group comes first and has no merged cells
        return (bool(row["no_utility"]), 0, sign * v) if is_number(v) else (bool(row["no_utility"]), 1, 0)

    rows.sort(key=sort_value)
    previous, rank = None, 0
    for i, row in enumerate(rows, 1):
        value = sort_value(row)
        if value[1] == 1:
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
