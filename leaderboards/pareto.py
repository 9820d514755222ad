"""The Pareto front every page draws, with the uncertainty of each coordinate taken into account.

Two rows whose numbers differ by less than their intervals are not told apart by the evidence, so a point is
dominated only where another beats it beyond both intervals on some axis and is not beaten so on any: on each
axis `q` beats `p` when q's whole interval lies on the better side of p's whole interval; overlapping
intervals tie. A point without an interval has the interval of its value alone, so without intervals this is the
usual front (ties on an axis never dominate). Blocked rows are points like any other: placing them (at the
axis' floor or ceiling) is the caller's, deciding whether they dominate is this module's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Point:
    """One row's position; `lower_x` / `lower_y`: whether less is better on that axis. An interval is
    (low, high) around the value, None where the value has none."""

    x: float
    y: float
    x_ci: tuple[float, float] | None = None
    y_ci: tuple[float, float] | None = None


def _span(value: float, ci: tuple[float, float] | None) -> tuple[float, float]:
    return (min(ci[0], value), max(ci[1], value)) if ci else (value, value)


def _beats(q: tuple[float, float], p: tuple[float, float], lower: bool) -> bool:
    """q's interval lies wholly on the better side of p's."""
    return q[1] < p[0] if lower else q[0] > p[1]


def dominated_by(q: Point, p: Point, lower_x: bool, lower_y: bool) -> bool:
    """Whether q dominates p beyond the intervals: q beats p on an axis and p beats q on none."""
    qx, qy, px, py = _span(q.x, q.x_ci), _span(q.y, q.y_ci), _span(p.x, p.x_ci), _span(p.y, p.y_ci)
    wins = _beats(qx, px, lower_x) or _beats(qy, py, lower_y)
    losses = _beats(px, qx, lower_x) or _beats(py, qy, lower_y)
    return wins and not losses


def front(points: Sequence[Point], lower_x: bool = True, lower_y: bool = True) -> list[bool]:
    """For each point, whether no other point dominates it (`dominated_by`)."""
    return [not any(dominated_by(q, p, lower_x, lower_y) for j, q in enumerate(points) if j != i)
            for i, p in enumerate(points)]
