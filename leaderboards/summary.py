"""The front page's summary: one table per track of the standard suite (bench/evaluation/tracks.py), so that every
number of a row comes from the same setting and its utility from the same trained model.

Rows are the suite's defenses (with their parameters); columns the attack families of the track, each on the model
of round 0 and on the trained model (a cell attacks the trained model when its scenario attacks a round in the
second half of training, leaderboards/grid.py's `stage`), then utility loss against the undefended row with its 95%
interval, HE cost per round and the accountant's epsilon, all three read ONLY from the track's utility scenario. A
family cell is the worst calibrated verdict over the track's columns of that family and stage (leaderboards/grid.py's
cells), or why there is none in the grid's own words (diverged at round r, no verdict, n/a, not run). A column
that judges no row (no verdict, not run or n/a throughout) is not drawn and is named under the table with the
reason; a privacy-only track has no utility, HE or epsilon column and says so, and any other column empty for
every row is not drawn either.

Coverage counts (scenario, attack) cells: applicable where the defense applies to the scenario (Defense.applicable,
stored by the run as n/a with its reason), computed where a record holds its outcome (ok, blocked or diverged; a
failed cell is not computed). Ranks: leaderboards/ordering.py; a row with cells not computed is listed unranked.
A row that applies to none of the track's scenarios reads "n/a: reason". Notes come from the track's declaration.

The structure built here is what the page renders and, less its presentation (keys under "view"), what
`summary.json` holds (`as_json`), so the two cannot disagree.
"""
from __future__ import annotations

import math
import os
from typing import Any

from bench.evaluation.calibration import calibrate
from bench.evaluation.formats import is_number
from bench.evaluation.schema import attack_label, defense_label, schema_of
from bench.evaluation.tracks import note_for
from bench.evaluation.usefulness import measures_utility, useless
from bench.evaluation.utility_loss import diverged_round, diverged_text, run_of, undefended_run, utility_loss
from bench.evaluation.verdicts import LEVELS
from leaderboards.grid import GRID_FAMILIES, HE_TIME, STAGES, columns_for, leaking, row_cells
from leaderboards.ordering import RULE, rank
from leaderboards.safe import site_href

SHORT = {"leak": "leaks", "partial": "partly", "resisted": "resists", "blocked": "blocked"}
FALLBACK = ("diverged", "failed", "ok", "uncal", "missing", "na")   # a cell without a verdict shows the first found
STAGE_KEY = {STAGES[0]: "round0", STAGES[1]: "trained"}
COMPUTED = ("ok", "blocked", "diverged")
HE_EXTRAPOLATED = tuple(k.removesuffix("_s") + "_extrapolated_s" for k in HE_TIME)
UNTRACKED = {"name": "every scenario", "privacy_only": True, "central": None, "utility": None, "notes": {},
             "setting": "the suite declares no tracks, so no row's utility is shown: utility compares one trained model"}


def _family_cell(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst verdict among the grid cells of one family and stage, linked to the record that gave it."""
    judged = [c for c in cells if c["kind"] in ("ok", "blocked") and c["verdict"].level in LEVELS]
    if judged:
        top = max(judged, key=lambda c: LEVELS.index(c["verdict"].level))
        verdict = top["verdict"]
        return {"kind": "verdict", "level": verdict.level, "text": SHORT[verdict.level],
                "title": f"{verdict.text}: {verdict.why}" if verdict.why else verdict.text, "href": top.get("href")}
    first = next((c for kind in FALLBACK for c in cells if c["kind"] == kind), cells[0])
    return {"kind": first["kind"], "level": "", "text": first["verdict"].text, "title": first["verdict"].why,
            "href": first.get("href")}


def _he(run: dict[str, Any] | None) -> dict[str, Any] | None:
    """HE CPU seconds per round (one client's encryption, the aggregation and the decryption) and one client's
    upload bytes, measured; or, where the record holds only extrapolated times (Paillier on slices), those,
    marked. None where the run spent no HE time."""
    if run is None:
        return None
    m = run["metrics"]
    for keys, extrapolated, upload in ((HE_TIME, False, "upload_bytes"),
                                       (HE_EXTRAPOLATED, True, "upload_bytes_extrapolated")):
        times = [m[k] for k in keys if is_number(m.get(k))]
        if times and sum(times) > 0:
            up = m.get(upload, m.get("upload_bytes"))
            return {"cpu_s_per_round": sum(times), "bytes_per_round": up if is_number(up) else None,
                    "extrapolated": extrapolated}
    return None


def _utility(loss: dict[str, Any] | None, scenario: str) -> dict[str, Any] | None:
    if loss is None:
        return None
    return {"metric": loss["metric"], "value": loss["value"], "loss": loss["loss"],
            "ci": list(loss["interval"]) if loss["interval"] else None, "scenario": scenario,
            "diverged": loss["diverged"]}


def _epsilon(recs: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """The largest accountant epsilon among the records, with its adjacency (details.dp) where stated."""
    dp = [r for r in recs if is_number(r["metrics"].get("epsilon"))]
    if not dp:
        return None, None
    top = max(dp, key=lambda r: r["metrics"]["epsilon"])
    return top["metrics"]["epsilon"], (top["details"].get("dp") or {}).get("adjacency")


def _diverged(recs: list[dict[str, Any]]) -> str:
    """Why a row's training has no utility in some scenario of the track: it diverged there."""
    hit = next((r for r in recs if diverged_round(r) is not None), None)
    return f"training diverged in {hit['scenario']} ({diverged_text(hit)})" if hit else ""


def _pairs(recs: list[dict[str, Any]], planned: dict[str, list[str]], scenarios: list[str]) -> list[tuple[str, str]]:
    """The track's cells a row owes: every (scenario, attack) the suite plans there (its page info; a scenario no
    row has run yet still counts), and every one that ran there for any row."""
    return list(dict.fromkeys([(s, a) for s in scenarios for a in planned.get(s, ())] +
                              [(r["scenario"], attack_label(r)) for r in recs]))


def merged(reasons: list[str]) -> str:
    """Reasons a row is n/a in each of a track's scenarios, read once: the words they share, then what differs
    ("... this scenario samples 4 / 1 / 2")."""
    distinct = list(dict.fromkeys(reasons))
    shared = os.path.commonprefix(distinct)
    shared = shared[:shared.rfind(" ") + 1]
    if len(distinct) == 1 or len(shared) < 20:
        return "; ".join(distinct)
    return shared + " / ".join(r[len(shared):] for r in distinct)


def track_table(name: str, track: dict[str, Any], records: list[dict[str, Any]], info: dict[str, Any],
                labels: list[str], index: int) -> dict[str, Any]:
    """One track's summary over the suite's rows `labels` (records: the whole suite's, verified ones)."""
    untrained = set(info.get("untrained") or ())
    recs = [r for r in records if r["scenario"] in track["scenarios"] and r["defense"] not in untrained]
    schema = schema_of(recs)
    column_of, columns = columns_for(recs)
    cal = {s: calibrate([r for r in recs if r["scenario"] == s], attack_label) for s in track["scenarios"]}
    na = info.get("not_applicable") or {}
    pairs = _pairs(recs, info.get("planned") or {}, track["scenarios"])
    present = list(dict.fromkeys((c["family"], c["stage"]) for c in columns))
    order = GRID_FAMILIES + tuple(f for f, _ in present if f not in GRID_FAMILIES)
    present.sort(key=lambda p: (order.index(p[0]), STAGES.index(p[1])))
    u_name = track["utility"]
    u_recs = [r for r in records if r["scenario"] == u_name] if u_name else []
    plain = undefended_run([r for r in u_recs if r["defense"] not in untrained]) if u_name else None
    metric = next((m for m in ("accuracy", "perplexity") if plain and is_number(plain["metrics"].get(m))), None)
    flat = useless(u_recs, info, u_name, defense_label) if u_name and measures_utility(
        u_recs, info, u_name, defense_label) else {}

    def href(rec):
        return site_href(name, fragment=f"{rec['suite']}--{rec['scenario']}")

    rows = []
    for d in labels:
        mine = [r for r in recs if defense_label(r) == d]
        base = next((r["defense"] for r in records if defense_label(r) == d), d.split("(")[0])
        cells, _, _ = row_cells(mine, d, columns, column_of, cal, schema, na, href)
        owed = [(s, a) for s, a in pairs if d not in na.get(s, {})]
        done = {(r["scenario"], attack_label(r)) for r in mine if r["status"] in COMPUTED}
        reasons = [na[s][d] for s in track["scenarios"] if d in na.get(s, {})]
        n_a = merged(reasons) if len(reasons) == len(track["scenarios"]) else None
        run = run_of([r for r in mine if r["scenario"] == u_name]) if u_name else None
        loss = utility_loss(run, plain) if run is not None else None
        eps, adjacency = _epsilon([run] if run else []) if u_name else _epsilon(mine)
        families: dict[str, dict[str, str]] = {}
        shown = []
        for fam, stage in present:
            cell = _family_cell([c for col, c in zip(columns, cells) if (col["family"], col["stage"]) == (fam, stage)])
            families.setdefault(fam, {})[STAGE_KEY[stage]] = cell["text"]
            shown.append(cell)
        computed = sum(p in done for p in owed)
        rows.append({
            "defense": base, "params": d[len(base):].strip("()"), "rank": None, "coverage": [computed, len(owed)],
            "families": families, "utility": _utility(loss, u_name) if u_name else None,
            "he": _he(run) if u_name else None, "epsilon": eps, "adjacency": adjacency, "na": n_a,
            "note": note_for(track, base, d),
            # what ranks it (leaderboards/ordering.py), then what only the page shows
            "name": d, **leaking(columns, cells), "complete": bool(owed) and computed == len(owed),
            "no_utility": flat.get(d, "") or _diverged(mine), "loss": loss["loss"] if loss else None,
            "ci": loss["interval"] if loss else None,
            "view": {"cells": shown, "loss": loss, "records": mine, "run": run,
                     "undefended": bool(run is not None and plain is not None and defense_label(plain) == d),
                     "href": href(run) if run else (href(mine[0]) if mine else None)}})
    drawn = [any(r["view"]["cells"][i]["kind"] == "verdict" for r in rows) for i in range(len(present))]
    not_drawn = [{"family": f, "stage": st, "why": next((r["view"]["cells"][i]["title"] for r in rows
                                                        if r["view"]["cells"][i]["title"]), "")}
                 for i, (f, st) in enumerate(present) if not drawn[i]]
    for r in rows:   # a column that judges no row is stated below the table, not drawn
        r["view"]["cells"] = [c for c, keep in zip(r["view"]["cells"], drawn) if keep]
        for f, st in ((f, st) for (f, st), keep in zip(present, drawn) if not keep):
            r["families"][f].pop(STAGE_KEY[st])
            if not r["families"][f]:
                del r["families"][f]
    present = [p for p, keep in zip(present, drawn) if keep]
    ranked = rank(rows)
    for i, row in enumerate(ranked):
        row["view"]["id"] = f"track{index}-row{i}"
    plaintext = {"metric": metric, "value": plain["metrics"][metric] if metric else None,
                 "central": track["central"]}
    return {"name": track["name"], "setting": track["setting"], "scenarios": list(track["scenarios"]),
            "privacy_only": track["privacy_only"], "utility_scenario": u_name, "plaintext": plaintext,
            "rows": ranked, "not_drawn": not_drawn,
            "view": {"id": f"track{index}", "columns": [{"family": f, "stage": s} for f, s in present],
                     "groups": [{"family": f, "span": sum(g == f for g, _ in present)} for f in dict.fromkeys(
                         f for f, _ in present)],
                     "show": {k: any(r[k] is not None for r in ranked) for k in ("utility", "he", "epsilon")},
                     "plain_href": href(plain) if plain else None, "records": recs,
                     "ranked": sum(r["rank"] is not None for r in ranked),
                     "scenario_links": [{"name": s, "href": site_href(name, fragment=_anchor(records, s))
                                         if any(r["scenario"] == s for r in records) else None}
                                        for s in track["scenarios"]]}}   # no section yet: no link


def _anchor(records: list[dict[str, Any]], scenario: str) -> str:
    """The scenario's section on its suite's page (leaderboards/render.py's anchor)."""
    suite = next((r["suite"] for r in records if r["scenario"] == scenario), "")
    return f"{suite}--{scenario}"


def summarize(name: str, records: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """Every track of the standard suite's output directory `name` (linked relative to the front page); without
    declared tracks, one privacy-only table over every scenario."""
    untrained = set(info.get("untrained") or ())
    scenarios = list(dict.fromkeys(r["scenario"] for r in records))
    na = info.get("not_applicable") or {}
    tracks = info.get("tracks") or [{**UNTRACKED, "scenarios": scenarios}]
    labels = list(dict.fromkeys([defense_label(r) for r in records if r["defense"] not in untrained]
                                + [d for s in na for d in na[s]]))
    tables = [track_table(name, t, records, info, labels, i) for i, t in enumerate(tracks)]
    inside = {s for t in tracks for s in t["scenarios"]}
    return {"tracks": tables, "untracked": [s for s in scenarios if s not in inside], "rule": RULE,
            "declared": bool(info.get("tracks"))}


JSON_TRACK = ("name", "setting", "scenarios", "privacy_only", "plaintext", "not_drawn")
JSON_ROW = ("defense", "params", "rank", "coverage", "families", "utility", "he", "epsilon", "adjacency", "na", "note")


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN: such a number is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def as_json(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json: the structure the page renders, less its presentation."""
    return _finite({"tracks": [{**{k: t[k] for k in JSON_TRACK},
                                "rows": [{k: r[k] for k in JSON_ROW} for r in t["rows"]]} for t in summary["tracks"]],
                    "untracked": summary["untracked"], "rule": summary["rule"]})
