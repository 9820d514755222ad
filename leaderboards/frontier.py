"""The privacy-utility frontier on the front page, from the records of a sweep suite: each tunable defense at several
settings in one utility scenario per attack family, beside the undefended row.

One panel per (scenario, family of an attack calibrated there) in a scenario that measures utility
(bench/evaluation/usefulness.py). Every (defense, parameters) row of the scenario is a point: across, its utility loss
against the undefended row with the 95% interval as a bar (bench/evaluation/utility_loss.py); up, the strongest
calibrated attack's worst case on the family's headline metric (the grid's headline: PSNR for images, AUROC for
membership, ...), oriented so that up is more leakage; its HE time per round as the marker's area. The Pareto
front (no other point has less loss and less leakage, one of them strictly) is marked and joined by a step line.
A row every calibrated attack of the family found blocked by design sits on the floor; a diverged row, or one no
calibrated attack judged, is listed in the panel's table and not placed. The panels are inline SVG drawn here:
each point is a link to its record's scenario, with a tooltip; the table beside each gives the same numbers to
screen readers. Built generically from records: nothing here names a defense or an attack.
"""
from __future__ import annotations

import math
from typing import Any

from bench.evaluation.calibration import calibrate, calibrated, record_verdict
from bench.evaluation.formats import is_number
from leaderboards.grid import HE_TIME, headline
from leaderboards.safe import site_href
from bench.evaluation.schema import attack_label, defense_label, family, schema_of
from bench.evaluation.usefulness import measures_utility
from bench.evaluation.utility_loss import diverged_text, run_of, undefended_run, utility_loss

WIDTH, HEIGHT = 440, 300
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 14, 46
RADIUS, GROWTH = 4.0, 9.0   # marker radius without HE, and the most it grows (area proportional to HE time)


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """For each (loss, leakage) point, lower better in both: whether no other point is at least as good in both
    and strictly better in one."""
    return [not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points) for p in points]


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.4g}"


def _point(d: str, mine: list[dict], run: dict | None, plain: dict | None, key: str, shown, schema) -> dict:
    """One row of a panel: its strongest calibrated attack on the family's headline, utility loss and HE time."""
    loss = utility_loss(run, plain) if run is not None else None
    times = [run["metrics"][k] for k in HE_TIME if run is not None and is_number(run["metrics"].get(k))]
    point = {"name": d, "loss": loss, "he": sum(times) if times else None, "value": None, "blocked": False,
             "by": "", "verdict": None, "why": "", "record": run}
    ok = [r for r in mine if r["status"] == "ok" and is_number(r["metrics"].get(key))]
    if loss is not None and loss["diverged"] is not None:
        point["why"] = loss["text"]
    elif ok:
        rec = (min if shown.lower_is_better is False else max)(ok, key=lambda r: r["metrics"][key])
        point.update(value=rec["metrics"][key], by=attack_label(rec), verdict=record_verdict(rec, schema), record=rec)
    elif mine and all(r["status"] == "blocked" for r in mine):
        point.update(blocked=True, why="blocked by design", record=mine[0])
    elif any(r["status"] == "diverged" for r in mine):
        point["why"] = diverged_text(next(r for r in mine if r["status"] == "diverged"))
    else:
        point["why"] = "no calibrated attack of this family judged it" if not mine else mine[0]["status"]
    point["placed"] = (point["value"] is not None or point["blocked"]) and loss is not None and loss["loss"] is not None
    return point


def _layout(points: list[dict], shown) -> dict[str, Any]:
    """Pixel positions, axes and the Pareto step line of one panel's placed points."""
    placed = [p for p in points if p["placed"]]
    sign = -1.0 if shown.lower_is_better is False else 1.0   # up is more leakage
    values = [p["value"] for p in placed if not p["blocked"]] or [0.0]
    xs = [p["loss"]["loss"] for p in placed]
    xs += [v for p in placed if p["loss"]["interval"] for v in p["loss"]["interval"]]
    x0, x1 = min(xs), max(xs)
    pad = (x1 - x0) * 0.06 or 0.01
    x0, x1 = x0 - pad, x1 + pad
    c0, c1 = min(sign * v for v in values), max(sign * v for v in values)
    span = (c1 - c0) or abs(c1) or 1.0
    floor = c0 - 0.15 * span if any(p["blocked"] for p in placed) else None
    c0, c1 = (floor if floor is not None else c0) - 0.06 * span, c1 + 0.06 * span
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return round(LEFT + (x - x0) / (x1 - x0) * inner_w, 1)

    def py(c: float) -> float:
        return round(TOP + (c1 - c) / (c1 - c0) * inner_h, 1)

    largest = max((p["he"] or 0.0 for p in placed), default=0.0)
    for p in placed:
        c = floor if p["blocked"] else sign * p["value"]
        p["cost"] = -math.inf if p["blocked"] else c
        p.update(cx=px(p["loss"]["loss"]), cy=py(c),
                 r=round(RADIUS + (GROWTH * math.sqrt(p["he"] / largest) if largest and p["he"] else 0.0), 1))
        if p["loss"]["interval"]:
            p["bar"] = [px(v) for v in p["loss"]["interval"]]
    for p, on in zip(placed, pareto_front([(p["loss"]["loss"], p["cost"]) for p in placed])):
        p["front"] = on
    front = sorted((p for p in placed if p["front"]), key=lambda p: p["cx"])
    step = []
    for a, b in zip(front, front[1:]):
        step += [(a["cx"], a["cy"]), (b["cx"], a["cy"])]
    step += [(front[-1]["cx"], front[-1]["cy"])] if front else []
    low, high = sorted((sign * c0, sign * c1))
    cticks = [c for c in (sign * v for v in ticks(low, high)) if c0 <= c <= c1]
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            "bottom": HEIGHT - BOTTOM, "largest_he": largest,
            "xticks": [{"at": px(x), "text": _label(x)} for x in ticks(x0, x1) if x0 <= x <= x1],
            "yticks": [{"at": py(c), "text": _label(sign * c)} for c in cticks],
            "floor": py(floor) if floor is not None else None,
            "step": " ".join(f"{x},{y}" for x, y in step) if len(front) > 1 else ""}


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
                points.append(_point(d, [r for r in mine if defense_label(r) == d], run, plain, key, schema[key],
                                     schema))
            if sum(p["placed"] for p in points) < 2:
                skipped.append(f"{s} ({fam}): fewer than two rows can be placed")
                continue
            layout = _layout(points, schema[key])
            for i, p in enumerate(points, 1):
                p["n"] = i
                p["href"] = site_href(name, fragment=f"{p['record']['suite']}--{s}") if p["record"] else ""
            metric = next(p["loss"]["metric"] for p in points if p["placed"])
            panels.append({"id": f"frontier-{len(panels)}", "scenario": s, "family": fam, "key": key,
                           "shown": schema[key], "points": points, "metric": metric,
                           "plain": plain["metrics"].get(metric) if plain else None,
                           "plain_text": next(p["loss"]["plain_text"] for p in points if p["placed"]), **layout,
                           "xlabel": "accuracy lost vs undefended (points)" if metric == "accuracy"
                           else f"{metric} ratio to undefended",
                           "href": site_href(name, fragment=f"{recs[0]['suite']}--{s}")})
    return {"name": name, "panels": panels, "skipped": skipped}
