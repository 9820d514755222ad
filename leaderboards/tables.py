"""One scenario's leaderboard table, built from stored records only (no rendering here).

Layout, left to right: rank, the defense (both pinned on the page), its verdict band
(bench/evaluation/verdicts.py: what the worst case means on its own) and key topology, then the metric
columns in tabs: "overview" (each family's two headline strongest-attack metrics and utility), "worst
case" (every strongest-attack metric), one tab per attack, run-level privacy, utility, cost, and all.

- Strongest attack (RobustBench's AutoAttack idea): for every privacy metric an attack reports,
  the worst case for the defended client over every attack that ran on that defense. Reference
  attacks (random guessing) are floors, never a worst case. "Blocked" counts as protection only
  when every attack of the families that report the metric was blocked on that defense; one that
  ran, failed or reported no number keeps the cell from reading as protected.
- Ranks follow the verdicts, never a value inside a verdict band (RANK_RULE): a row ranks above every
  row whose leaking families (what its worst cases read as recovered or partly: image, text, membership,
  labels) strictly include its own, or, leaking in the same families, whose band is worse in one family
  and better in none; two rows that neither relation orders share a rank. The front page orders its rows
  by the same rule (dominance of leaking families, ties inside a band).
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
from bench.evaluation.verdicts import (BANDS, BLOCKED, IMAGE, LABELS, LEVELS, MEMBERSHIP, NONE, TEXT, Verdict, band,
                                      worst)

FAMILY_ORDER = ("image", "text", "membership", "label", "")   # order of the strongest columns
HEADLINE = ("psnr", "ssim", "lpips", "rouge1", "exact_match", "rouge2", "mia_auroc", "mia_tpr_at_1fpr", "lnacc",
            "leacc", "label_acc")   # within a family, the headline metrics first (the first column ranks)
LEAD = 4   # rank, defense, verdict, key topology: the columns before the metric columns
OVERVIEW = 2   # worst-case metrics per attack family on the overview tab (the headline ones, HEADLINE order)
RUN_TABS = (("privacy", "runpriv", "run-level privacy"), ("utility", "utility", "utility"), ("cost", "cost", "cost"))
LEAKING = ("partial", "leak")   # the verdict levels at which a family leaks
# the family a verdict band speaks of (what leaks): labels read by an image attack leak in the label family
SUBJECT = {IMAGE: "image", TEXT: "text", MEMBERSHIP: "membership", LABELS: "label"}
RANK_RULE = ("Ranked by the verdicts, never by a value inside a verdict band: a row ranks above every row whose "
             "leaking families (image, text, membership, labels: a worst case read as recovered or partly "
             "recovered, exposed or a signal) strictly include its own, and above a row leaking in the same "
             "families whose band is worse in one family and better in none; rows that neither relation orders "
             "share a rank (rank = 1 + the rows above it). A row without utility ranks below every useful row; a "
             "row with an attack failed, diverged or not run, or without any verdict, is listed last, unranked.")


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
    privacy_only = (info.get("privacy_only") or {}).get(records[0]["scenario"], "") if records else ""
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
        if kind == "utility" and privacy_only:   # declared privacy and cost only: no utility column
            continue
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
    return {"groups": all_groups, "rows": rows, "rank_rule": RANK_RULE if strongest.columns else "",
            "calibration": [{"attack": a, "ok": c.ok, "why": c.why} for a, c in cal.items()], "no_utility": flat,
            "tabs": tabs, "default_tab": tabs[0][0], "notes": notes.items(), "privacy_only": privacy_only,
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
    by_family: dict[str, list] = {}   # the same per family they speak of, BLOCKED where an attack was blocked
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
                subject = SUBJECT.get(BANDS[c.key].words) if c.key in BANDS else None
                for r in relevant:
                    verdict = (band(c.key, r["metrics"].get(c.key), c.lower_is_better, r["details"], r["metrics"])
                               if r["status"] == "ok" else BLOCKED if r["status"] == "blocked" else None)
                    if subject:
                        by_family.setdefault(subject, []).append(verdict)
                    if r["status"] == "ok":
                        judged.append(verdict)
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
            "verdict": _verdict([c for c in cells if c["strongest"]], judged),
            "levels": _levels(by_family),
            "complete": not any(c["cls"] in ("failed", "diverged") or c["text"] == "not run"
                                for c in cells if c["strongest"])}


def _levels(by_family: dict[str, list]) -> dict[str, str]:
    """Each family's band on the row (what leaks: image, text, membership, labels, whichever attack read it): the
    most severe band of the worst cases that speak of it, or blocked where every attack that would have measured it
    was blocked by design; a family without an opinion is left out."""
    out = {}
    for fam, verdicts in by_family.items():
        ran = [v for v in verdicts if v is not BLOCKED]
        level = worst(ran).level if ran else BLOCKED.level
        if level in LEVELS:
            out[fam] = level
    return out


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


def beats(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether row a ranks above row b by the verdicts alone (RANK_RULE): a's leaking families are a strict subset
    of b's, or they leak in the same families and a's band is at most b's in every family and below it in one
    (both judged in the same families). Values inside a band never decide."""
    leaks_a = {f for f, level in a["levels"].items() if level in LEAKING}
    leaks_b = {f for f, level in b["levels"].items() if level in LEAKING}
    if leaks_a != leaks_b:
        return leaks_a < leaks_b
    if set(a["levels"]) != set(b["levels"]):
        return False
    pairs = [(LEVELS.index(a["levels"][f]), LEVELS.index(b["levels"][f])) for f in a["levels"]]
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def ranked(row: dict[str, Any]) -> bool:
    """A row takes a rank when every attack on it gave a result and at least one family has a verdict."""
    return bool(row["complete"] and row["levels"])


def _rank(rows: list[dict[str, Any]], key: Column | None) -> None:
    """Number and order the rows by RANK_RULE: rank = 1 + the rows above it (`beats`), a row without utility
    (bench/evaluation/usefulness.py) below every useful row, rows that take no rank (`ranked`) last. Rows that
    share a rank keep the suite's order."""
    if key is None:
        for row in rows:
            row["rank"] = ""
        return
    useful = [r for r in rows if ranked(r) and not r["no_utility"]]
    for row in rows:
        if not ranked(row):
            row["rank"] = ""
            continue
        tier = [r for r in rows if ranked(r) and bool(r["no_utility"]) == bool(row["no_utility"])]
        above = len(useful) if row["no_utility"] else 0
        row["rank"] = 1 + above + sum(beats(other, row) for other in tier if other is not row)
    order = {id(row): i for i, row in enumerate(rows)}
    rows.sort(key=lambda r: (bool(r["no_utility"]), r["rank"] == "", r["rank"] or 0, order[id(r)]))


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
