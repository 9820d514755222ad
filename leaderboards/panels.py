"""One privacy-utility panel's geometry: axes in the units shown, markers, the Pareto front and labels that never
cover each other or a marker, for an inline SVG a reader can read at 1440 px (leaderboards/frontier.py fills it).

Across: utility loss against the undefended row (accuracy lost, 0.01 = 1 point; or the perplexity ratio), with
its 95% interval as a bar. Up: the family's headline metric, oriented so that up is more leakage. A point
every calibrated attack found blocked sits on a floor below the others. Marker area grows with HE time per round.
The Pareto front comes from leaderboards/pareto.py with both intervals (a point is dominated only where another
beats it beyond both), the blocked points at the floor included, and is joined by a step line.

Labels are the points' numbers (the table beside the panel gives their names and values). Each label is placed by
a greedy search: beside its marker first, then further out with a leader line, never over another label, a marker
or the panel's edge; points that share a spot share one label; what finds no room inside goes to a column right of
the plot, joined to its point by a line. Text widths are estimated generously (0.62 em a character), so a
browser's own box stays inside the one reserved here (tests/test_browser.py measures it).
"""
from __future__ import annotations

import math
from typing import Any

from leaderboards.pareto import Point, front

WIDTH, HEIGHT = 680, 400
LEFT, RIGHT, TOP, BOTTOM = 78, 70, 18, 58   # RIGHT holds the column of labels that find no room inside
FONT, AXIS_FONT = 12, 13                    # px: tick and point labels, axis titles
RADIUS, GROWTH = 5.0, 9.0                   # marker radius without HE, and the most it grows
CHAR = 0.62                                 # estimated text width per character, in em
GAP = 2.0                                   # px kept free around a label
RINGS = 8                                   # distances tried around a marker, 12 px apart, before the column
ANGLES = (0, 180, -90, 90, -45, -135, 45, 135, -20, -160, 20, 160, -70, -110, 70, 110)   # degrees, 0: right


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((high - first) / step + 1e-9) + 1)]


def _tick(value: float) -> str:
    return f"{value:.4g}"


def _box(x: float, y: float, text: str) -> tuple[float, float, float, float]:
    """The box a label centred at (x, y) may take (left, top, right, bottom), with its margin."""
    half_w, half_h = len(text) * CHAR * FONT / 2 + GAP, FONT * 0.68 + GAP
    return x - half_w, y - half_h, x + half_w, y + half_h


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _marker_box(p: dict[str, Any]) -> tuple[float, float, float, float]:
    return p["cx"] - p["r"] - 1, p["cy"] - p["r"] - 1, p["cx"] + p["r"] + 1, p["cy"] + p["r"] + 1


def place_labels(groups: list[dict[str, Any]], markers: list[dict[str, Any]], area: tuple, gutter: tuple) -> None:
    """Give each group ({"cx", "cy", "r", "text"}) a label position (lx, ly) and, away from its marker, a leader
    line; nothing overlaps a marker, another label or leaves `area` (left, top, right, bottom); the rest stack in
    `gutter` (x, top, bottom)."""
    taken = [_marker_box(m) for m in markers]
    left_over = []
    for g in sorted(groups, key=lambda g: (g["cy"], g["cx"])):
        spot = None
        half_w, half_h = len(g["text"]) * CHAR * FONT / 2, FONT / 2
        for ring in range(RINGS):
            out = g["r"] + 4 + ring * 12
            for angle in ANGLES:
                cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
                x, y = g["cx"] + cos * (out + half_w * abs(cos)), g["cy"] + sin * (out + half_h * abs(sin))
                box = _box(x, y, g["text"])
                if box[0] >= area[0] and box[1] >= area[1] and box[2] <= area[2] and box[3] <= area[3] \
                        and not any(_overlaps(box, t) for t in taken):
                    spot = (x, y, ring > 0, box)
                    break
            if spot:
                break
        if spot is None:
            left_over.append(g)
            continue
        g.update(lx=round(spot[0], 1), ly=round(spot[1], 1), leader=spot[2])
        taken.append(spot[3])
    y = gutter[1]
    for g in sorted(left_over, key=lambda g: g["cy"]):
        w = len(g["text"]) * CHAR * FONT
        y = max(y, g["cy"] - FONT)
        g.update(lx=round(gutter[0] + w / 2 + GAP, 1), ly=round(y + FONT * 0.68, 1), leader=True)
        y += FONT * 1.4 + 2 * GAP


def layout(points: list[dict[str, Any]], lower_is_better: bool | None, xlabel: str, ylabel: str) -> dict[str, Any]:
    """Positions, axes, the Pareto front and labels of a panel's placed points. A point carries `x` (loss) and
    `x_ci`, `value` and `value_ci` (the headline metric and its interval), `blocked`, `he` (seconds or None) and
    `n` (its number); each placed one gets cx, cy, r, front (and bar, the interval's ends in pixels)."""
    placed = [p for p in points if p["placed"]]
    sign = -1.0 if lower_is_better is False else 1.0   # up is more leakage
    values = [sign * p["value"] for p in placed if not p["blocked"]] or [0.0]
    xs = [p["x"] for p in placed] + [v for p in placed if p.get("x_ci") for v in p["x_ci"]]
    x0, x1 = min(xs), max(xs)
    pad = (x1 - x0) * 0.08 or 0.01
    x0, x1 = x0 - pad, x1 + pad
    c0, c1 = min(values), max(values)
    span = (c1 - c0) or abs(c1) or 1.0
    floor = c0 - 0.18 * span if any(p["blocked"] for p in placed) else None
    c0, c1 = (floor if floor is not None else c0) - 0.08 * span, c1 + 0.08 * span
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM

    def px(x: float) -> float:
        return round(LEFT + (x - x0) / (x1 - x0) * (right - LEFT), 1)

    def py(c: float) -> float:
        return round(TOP + (c1 - c) / (c1 - c0) * (bottom - TOP), 1)

    largest = max((p["he"] or 0.0 for p in placed), default=0.0)
    for p in placed:
        p.update(cx=px(p["x"]), cy=py(floor if p["blocked"] else sign * p["value"]),
                 r=round(RADIUS + (GROWTH * math.sqrt(p["he"] / largest) if largest and p["he"] else 0.0), 1))
        if p.get("x_ci"):
            p["bar"] = [px(v) for v in p["x_ci"]]
    cis = [tuple(sorted(sign * v for v in p["value_ci"])) if p.get("value_ci") and not p["blocked"] else None
           for p in placed]
    pts = [Point(p["x"], -math.inf if p["blocked"] else sign * p["value"], tuple(p["x_ci"]) if p.get("x_ci") else None,
                 ci) for p, ci in zip(placed, cis)]
    for p, on in zip(placed, front(pts, lower_x=True, lower_y=True)):
        p["front"] = on
    on_front = sorted((p for p in placed if p["front"]), key=lambda p: (p["cx"], -p["cy"]))
    step = []
    for a, b in zip(on_front, on_front[1:]):
        step += [(a["cx"], a["cy"]), (b["cx"], a["cy"])]
    step += [(on_front[-1]["cx"], on_front[-1]["cy"])] if on_front else []
    groups: list[dict[str, Any]] = []
    for p in sorted(placed, key=lambda p: p["n"]):   # points that share a spot share one label
        g = next((g for g in groups if abs(g["cx"] - p["cx"]) < 2 and abs(g["cy"] - p["cy"]) < 2), None)
        if g is None:
            groups.append({"cx": p["cx"], "cy": p["cy"], "r": p["r"], "text": str(p["n"]), "points": [p["n"]]})
        else:
            g.update(r=max(g["r"], p["r"]), text=f"{g['text']},{p['n']}")
            g["points"].append(p["n"])
    place_labels(groups, placed, (LEFT + 1, TOP + 1, right - 1, bottom - 1), (right + 6, TOP, bottom))
    low, high = sorted((sign * c0, sign * c1))
    cticks = [c for c in (sign * v for v in ticks(low, high, 6)) if c0 <= c <= c1]
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": right, "top": TOP, "bottom": bottom,
            "font": FONT, "axis_font": AXIS_FONT, "largest_he": largest, "labels": groups,
            "xticks": [{"at": px(x), "text": _tick(x)} for x in ticks(x0, x1, 6) if x0 <= x <= x1],
            "yticks": [{"at": py(c), "text": _tick(sign * c)} for c in cticks],
            "floor": py(floor) if floor is not None else None, "xlabel": xlabel, "ylabel": ylabel,
            "step": " ".join(f"{x},{y}" for x, y in step) if len(on_front) > 1 else ""}
