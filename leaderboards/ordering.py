"""The front page's ranking rule, stated once and used by every summary and grid: dominance first, no order by a
value inside one verdict band, utility only where its intervals separate, equal rows share a rank, and a row
judged on fewer cells than apply to it is not ranked at all.

A row's leaking cells are the (attack family, stage) cells in which its worst calibrated verdict reads recovered
or partly recovered (exposed or a signal, for membership); stage is the model of round 0 or the trained model.
Row A is better than row B when A's leaking cells are a strict subset of B's; or when they leak in the same cells
and A's band (partly, recovered) is milder in one of them and more severe in none; or when they leak in the same
cells with the same bands and A's utility loss interval lies wholly below B's (a point without an interval is its
own interval). Two verdicts in one band are the same evidence, so a PSNR of 82.6 dB and one of 86.9 dB, both
"recovered", tie, and so do rows whose intervals overlap. "Better" is a strict partial order (a subset order
refined, within each set, by band dominance and then, within equal bands, by an interval order), so ranks built
from it never contradict it: a row's rank is 1 + the number of rows of its group better than it, plus every row of
the groups above. Rows of equal rank are listed by name.

Groups, in order: complete rows whose model has utility; complete rows without it (diverged, or at chance where
the undefended model learns: bench/evaluation/usefulness.py), which rank below every useful row; within each, a
row with no calibrated verdict at all (nothing judged it) below the judged ones. A row with cells not computed
(coverage computed < applicable) is never ranked: a cell not run never leaks, so it would lift its row. Such rows
follow the ranked ones, most computed first; rows that apply nowhere come last.
"""
from __future__ import annotations

from typing import Any

LEAKING = ("leak", "partial")   # the verdict levels that count as leaking

RULE = ("Ranks follow one stated rule: a row ranks above every row that leaks in a strict superset of its cells "
        "(a cell: an attack family on the model of round 0 or on the trained model; leaking: recovered or partly "
        "recovered, exposed or a signal), and above a row leaking in the same cells with a band as severe or more "
        "in each and more severe in one; two verdicts in the same band tie, whatever their values; rows with the "
        "same bands are told apart by utility loss only where their 95% intervals do not overlap; equal rows "
        "share a rank and are listed by name. A row whose model has no utility ranks below every useful row. A row "
        "with cells not computed is not ranked: it is listed below, with its coverage (computed / applicable).")


def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a leaks in a strict subset of b's cells."""
    return a["leaks"] < b["leaks"]


def _span(row: dict[str, Any]) -> tuple[float, float] | None:
    """The row's utility loss interval (its value alone without one), None without a loss."""
    loss, ci = row.get("loss"), row.get("ci")
    if loss is None:
        return None
    return (min(ci[0], loss), max(ci[1], loss)) if ci else (loss, loss)


def _milder(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Leaking in the same cells, a's band is nowhere more severe than b's and somewhere less (partly against
    recovered)."""
    sa, sb = a.get("bands") or {}, b.get("bands") or {}
    return all(sa.get(k, 0) <= sb.get(k, 0) for k in a["leaks"]) and any(sa.get(k, 0) < sb.get(k, 0) for k in a["leaks"])


def better(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a ranks above b: fewer leaking cells by inclusion; else, in the same cells, a milder band in some and a more
    severe one in none; else, in the same bands, a utility loss beyond b's interval."""
    if dominates(a, b):
        return True
    if a["leaks"] != b["leaks"]:
        return False
    if (a.get("bands") or {}) != (b.get("bands") or {}):
        return _milder(a, b)
    sa, sb = _span(a), _span(b)
    return sa is not None and sb is not None and sa[1] < sb[0]


def _group(row: dict[str, Any]) -> tuple[bool, bool]:
    return bool(row.get("no_utility")), not row.get("judged", 1)


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in the stated order, each given `rank` (an int, or None when unranked). A row carries `name`,
    `leaks` (frozenset of its leaking cells), `complete` (every applicable cell computed), and may carry `bands`
    (each leaking cell's severity: 1 partly, 2 recovered), `loss` and
    `ci` (utility loss and its interval), `no_utility`, `judged` (its calibrated cells; 0: none), `coverage`
    ([computed, applicable]) and `na` (a reason: it applies nowhere)."""
    ranked = [r for r in rows if r.get("complete", True) and not r.get("na")]
    out, above = [], 0
    for group in sorted({_group(r) for r in ranked}):
        members = [r for r in ranked if _group(r) == group]
        for r in members:
            r["rank"] = above + 1 + sum(better(o, r) for o in members if o is not r)
        out += sorted(members, key=lambda r: (r["rank"], r["name"]))
        above += len(members)
    rest = [r for r in rows if r not in ranked]
    for r in rest:
        r["rank"] = None
    cov = lambda r: r.get("coverage") or (0, 1)   # noqa: E731
    out += sorted(rest, key=lambda r: (bool(r.get("na")), -(cov(r)[0] / cov(r)[1] if cov(r)[1] else 0), r["name"]))
    return out


def order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in the stated order (the grid's: every row ranked, `rank` set)."""
    return rank(rows)
