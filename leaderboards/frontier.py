"""The privacy-utility frontier on the front page: one panel per track and attack family, from the track summary's
rows (leaderboards/summary.py), and one per scenario and family of the sweep suite, each tunable defense at several
settings (suite `frontier`).

A point is one row: across, its utility loss against the undefended row of the track's utility scenario (the sweep's
scenario) with the 95% interval as a bar (bench/evaluation/utility_loss.py); up, the strongest calibrated attack's
worst case on the family's headline metric over the track's scenarios (the grid's headline: PSNR for images, AUROC
for membership, ...), oriented so that up is more leakage; its HE time per round as the marker's area. A row every
calibrated attack of the family found blocked by design sits on the floor. A row without a utility loss (a
privacy-only track, diverged, not run in the utility scenario) or that no calibrated attack of the family judged is
listed in the panel's table and not placed. The geometry, the Pareto front with intervals and the labels are
leaderboards/panels.py's; a point links to its row of the summary (a track) or its scenario's table (a sweep), and
the table beside the panel gives the same numbers. Built generically from records: nothing here names a defense or
an attack.
"""
from __future__ import annotations

from typing import Any

from bench.evaluation.calibration import calibrate, calibrated, record_verdict
from bench.evaluation.formats import is_number
from bench.evaluation.schema import attack_label, defense_label, family, schema_of
from bench.evaluation.usefulness import measures_utility
from bench.evaluation.utility_loss import diverged_text, run_of, undefended_run, utility_loss
from leaderboards.grid import HE_TIME, headline
from leaderboards.panels import layout, ticks
from leaderboards.safe import site_href

__all__ = ["frontier", "track_panels", "ticks"]


def _xlabel(metric: str, plain_text: str) -> str:
    if metric == "accuracy":
        return f"accuracy lost vs undefended ({plain_text}); 0.01 = 1 point"
    return f"{metric} ratio to undefended ({plain_text}), ×"


def _ylabel(shown) -> str:
    unit = f" ({shown.unit})" if shown.unit and shown.unit not in ("B", "s") else ""
    return f"{shown.header}{unit}, up: more leakage"


def _he_seconds(run: dict[str, Any] | None) -> float | None:
    times = [run["metrics"][k] for k in HE_TIME if run is not None and is_number(run["metrics"].get(k))]
    return sum(times) if times else None


def _point(name: str, mine: list[dict], loss: dict | None, he: float | None, key: str, shown, schema) -> dict:
    """One row of a panel: its strongest calibrated attack on the family's headline, utility loss and HE time."""
    point = {"name": name, "loss": loss, "he": he, "value": None, "value_ci": None, "blocked": False, "by": "",
             "verdict": None, "why": "", "record": mine[0] if mine else None,
             "x": loss["loss"] if loss else None, "x_ci": loss["interval"] if loss else None}
    ok = [r for r in mine if r["status"] == "ok" and is_number(r["metrics"].get(key))]
    if loss is not None and loss["diverged"] is not None:
        point["why"] = loss["text"]
    elif ok:
        rec = (min if shown.lower_is_better is False else max)(ok, key=lambda r: r["metrics"][key])
        ci = rec["details"].get(f"{key}_ci95")
        point.update(value=rec["metrics"][key], by=attack_label(rec), verdict=record_verdict(rec, schema), record=rec,
                     value_ci=ci if isinstance(ci, list) and len(ci) == 2 and all(is_number(v) for v in ci) else None)
    elif mine and all(r["status"] == "blocked" for r in mine):
        point.update(blocked=True, why="blocked by design", record=mine[0])
    elif any(r["status"] == "diverged" for r in mine):
        point["why"] = diverged_text(next(r for r in mine if r["status"] == "diverged"))
    else:
        point["why"] = "no calibrated attack of this family judged it" if not mine else mine[0]["status"]
    if loss is None and not point["why"]:
        point["why"] = "no utility loss in the utility scenario"
    point["placed"] = (point["value"] is not None or point["blocked"]) and loss is not None \
        and loss["loss"] is not None
    return point


def _panel(pid: str, points: list[dict], key: str, shown, fam: str, scenario: str, plain, title: str,
           href: str) -> dict[str, Any] | None:
    """A panel of two placed points or more (None: fewer), numbered in the table's order."""
    if sum(p["placed"] for p in points) < 2:
        return None
    for i, p in enumerate(points, 1):
        p["n"] = i
    first = next(p for p in points if p["placed"])
    metric, plain_text = first["loss"]["metric"], first["loss"]["plain_text"]
    return {"id": pid, "title": title, "scenario": scenario, "family": fam, "key": key, "shown": shown,
            "points": points, "metric": metric, "plain": plain, "plain_text": plain_text, "href": href,
            **layout(points, shown.lower_is_better, _xlabel(metric, plain_text), _ylabel(shown))}


def track_panels(name: str, track: dict[str, Any]) -> dict[str, Any]:
    """The panels of one track summary (leaderboards/summary.py's track_table): one per attack family."""
    view = track["view"]
    if track["privacy_only"]:
        return {"name": track["name"], "panels": [], "skipped": ["a privacy-only track measures no utility"]}
    recs = view["records"]
    schema = schema_of(recs)
    judged = []
    for s in track["scenarios"]:
        mine = [r for r in recs if r["scenario"] == s]
        judged += calibrated(mine, calibrate(mine, attack_label), attack_label)
    panels, skipped = [], []
    rows = [r for r in track["rows"] if not r["na"] and r["coverage"][0]]   # n/a or not run here: no point
    for fam in dict.fromkeys(c["family"] for c in view["columns"]):
        mine = [r for r in judged if family(r) == fam]
        key = headline(mine, fam)
        if key is None:
            skipped.append(f"{fam}: no calibrated attack of this family reports a headline metric here")
            continue
        points = []
        for row in rows:
            point = _point(row["name"], [r for r in mine if defense_label(r) == row["name"]], row["view"]["loss"],
                           row["he"]["cpu_s_per_round"] if row["he"] else None, key, schema[key], schema)
            point.update(href=f"#{row['view']['id']}", rank=row["rank"])
            points.append(point)
        panel = _panel(f"{view['id']}-frontier-{len(panels)}", points, key, schema[key], fam,
                       track["utility_scenario"], track["plaintext"]["value"], f"{track['name']} · {fam}",
                       f"#{view['id']}")
        if panel is None:
            skipped.append(f"{fam}: fewer than two rows can be placed")
        else:
            panels.append(panel)
    return {"name": track["name"], "panels": panels, "skipped": skipped}


def frontier(name: str, records: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """The panels of one sweep suite's output directory (`name`, linked relative to the front page)."""
    schema = schema_of(records)
    untrained = set(info.get("untrained") or ())
    panels, skipped = [], []
    for s in dict.fromkeys(r["scenario"] for r in records):
        recs = [r for r in records if r["scenario"] == s]
        if not measures_utility(recs, info, s, defense_label):
            skipped.append(f"{s}: its undefended row has no utility, so it measures no utility loss")
            continue
        judged = calibrated(recs, calibrate(recs, attack_label), attack_label)
        plain = undefended_run(recs)
        rows = list(dict.fromkeys(defense_label(r) for r in recs if r["defense"] not in untrained))
        for fam in dict.fromkeys(family(r) for r in judged if family(r) not in ("reference", "")):
            mine = [r for r in judged if family(r) == fam]
            key = headline(mine, fam)
            if key is None:
                continue
            points = []
            for d in rows:
                run = run_of([r for r in recs if defense_label(r) == d])
                loss = utility_loss(run, plain) if run is not None else None
                point = _point(d, [r for r in mine if defense_label(r) == d], loss, _he_seconds(run), key,
                               schema[key], schema)
                rec = point["record"] or run
                point["href"] = site_href(name, fragment=f"{rec['suite']}--{s}") if rec else ""
                points.append(point)
            panel = _panel(f"frontier-{len(panels)}", points, key, schema[key], fam, s,
                           plain["metrics"].get(points[0]["loss"]["metric"]) if plain and points[0]["loss"] else None,
                           f"{fam} · {s}", site_href(name, fragment=f"{recs[0]['suite']}--{s}"))
            if panel is None:
                skipped.append(f"{s} ({fam}): fewer than two rows can be placed")
            else:
                panels.append(panel)
    return {"name": name, "panels": panels, "skipped": skipped}
