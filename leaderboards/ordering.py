"""The front page's row order: a stated rule that respects dominance, so the order means something once two rows
both leak somewhere.

A row's leaking families are the attack families in which one of its calibrated cells reads recovered or partly
recovered (exposed or a signal, for membership). Row A dominates row B when A's leaking families are a strict
subset of B's: every family that reaches A's clients also reaches B's, and more. The order is a topological sort
of that partial order: a row is placed only when no row left dominates it, and among the rows that may go next,
the smaller share of calibrated cells leaked goes first, then the smaller utility loss, then the name. Two tiers
stand before it: a row whose model has no utility in a scenario that measures it (diverged, or at chance:
bench/evaluation/usefulness.py) ranks below every useful row, and a row without any calibrated verdict (n/a, no
verdict or not run throughout) below every judged row of its group, since it has no evidence to dominate with.
"""
from __future__ import annotations

from typing import Any

LEAKING = ("leak", "partial")   # the verdict levels that count as leaking

RULE = ("Rows are ordered by a rule that respects dominance: a row ranks above every row whose leaking families "
        "(the families in which a calibrated cell reads recovered or partly recovered) strictly include its own; "
        "among rows that no remaining row dominates, the smaller share of calibrated cells leaked ranks first, then "
        "the smaller utility loss (its largest relative loss over the scenarios that measure utility), then the "
        "name. Rows without utility (diverged or at chance where the undefended model learns) rank below every "
        "useful row and, within each of the two groups, rows without any calibrated verdict below the judged ones.")


def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a's leaking families are a strict subset of b's."""
    return a["leaks"] < b["leaks"]


def _tier(row: dict[str, Any]) -> tuple[bool, bool]:
    return bool(row["no_utility"]), not row["judged"]


def _priority(row: dict[str, Any]) -> tuple:
    loss = row["loss"]
    return row["share"], loss is None, loss if loss is not None else 0.0, row["name"]


def order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in the stated order. Each row carries `leaks` (frozenset of families), `judged` (calibrated cells),
    `share` (leaked / judged, 0 when none judged), `loss` (relative utility loss or None), `no_utility`, `name`."""
    out: list[dict[str, Any]] = []
    for tier in sorted({_tier(r) for r in rows}):
        left = [r for r in rows if _tier(r) == tier]
        while left:
            free = [r for r in left if not any(dominates(o, r) for o in left if o is not r)]
            pick = min(free, key=_priority)   # strict subset is acyclic: some row is always free
            out.append(pick)
            left.remove(pick)
    return out
