"""Paper-vs-ours rows (RobustBench's idea): a suite TOML may state what a paper reports,

    [[paper]]
    metric = "lnacc"             # a metric name
    reported = 0.99              # the paper's number, or a range [lo, hi] it gives
    source = "iLRG Table 2"      # where it is reported
    scenario = "..."             # optional filters on the stored records, as in [[figures]]
    defense = "plaintext"
    attack = "ilrg"
    where = { ratio = 0.1 }      # optional filter on metrics or parameters; a list of values gives one
                                 # row per value (the same reported number beside each, e.g. per attack path)
    baseline = { defense = "fedhe-full" }   # optional: compare the ratio baseline / this row instead
    note = "..."                 # optional
    reported_by = "paper"        # who reported the number: "paper" (default) or "official code" (a rerun of the
                                 # authors' code on the same inputs)
    tolerance = 0.1              # relative: ours agrees when within this fraction of the reported value (or range)

and the page shows reported, ours (mean over the matching stored cells, or the ratio of the baseline's
mean to it: scenario and attack filters carry over to the baseline, `where` does not) and ours /
reported (against the nearer end of a range; 1 inside it), and whether they agree at the stated tolerance.
Both numbers are written alike: the metric's unit and format from the records' schema, or "x" with one
decimal for a ratio; ours / reported keeps two significant digits, so a small ratio never reads 0.00.
"""
from __future__ import annotations

from itertools import product
from typing import Any

from bench.evaluation.formats import is_number, number
from bench.evaluation.pages import IDENTITY, TOLERANCE, lookup, reported_range
from bench.evaluation.schema import schema_of


def _matching(spec: dict[str, Any], records: list[dict[str, Any]]) -> list[float]:
    values = [lookup(r, spec["metric"]) for r in records if r["status"] == "ok"
              and not any(spec.get(k) and r[k] != spec[k] for k in IDENTITY)
              and all(lookup(r, k) == v for k, v in spec.get("where", {}).items())]
    return [float(v) for v in values if is_number(v)]


def _where(spec: dict[str, Any]) -> str:
    where = ", ".join(f"{k}={spec[k]}" for k in IDENTITY if spec.get(k))
    return (where + "".join(f", {k}={v}" for k, v in spec.get("where", {}).items())).strip(", ")


def _each_where(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec once per combination of its list-valued `where` entries."""
    where = spec.get("where", {})
    choices = [v if isinstance(v, list) else [v] for v in where.values()]
    return [{**spec, "where": dict(zip(where, combo))} for combo in product(*choices)] if where else [spec]


def paper_rows(specs: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    schema = schema_of(records)
    rows = []
    for spec in (one for given in specs for one in _each_where(given)):
        lo, hi = reported_range(spec["reported"]) or (float("nan"), float("nan"))
        values = _matching(spec, records)
        ours = sum(values) / len(values) if values else None
        shown = schema.get(spec["metric"])
        title = shown.header if shown else spec["metric"]
        base = spec.get("baseline")
        if base is not None:
            other = _matching({**{k: spec[k] for k in ("metric", "scenario", "attack") if k in spec}, **base}, records)
            ours = (sum(other) / len(other)) / ours if other and ours else None
            values = values if other else []
            title = f"{title} ratio, {base.get('defense') or _where(base)} / {spec.get('defense') or 'this row'}"

            def write(v, mark="×"):
                return "–" if v is None else f"{v:,.1f}{mark}"
        else:
            def write(v, mark=""):
                return number(v, shown.unit, shown.fmt) if shown else ("–" if v is None else f"{v:.3g}")
        reported = write(lo) if lo == hi else f"{write(lo, '')}–{write(hi)}"
        nearer = lo if ours is not None and ours < lo else hi
        ratio = None if ours is None else 1.0 if lo <= ours <= hi else (ours / nearer if nearer else None)
        tol = float(spec.get("tolerance", TOLERANCE))
        rows.append({"metric": title, "source": spec.get("source", ""), "where": _where(spec),
                     "scenario": spec.get("scenario", ""), "reported": reported, "reported_sort": lo,
                     "ours": write(ours), "ours_sort": ours if ours is not None else "", "cells": len(values),
                     "note": spec.get("note", ""), "ratio": ratio, "within": lo != hi and ratio == 1.0,
                     "ratio_text": "–" if ratio is None else f"{ratio:.2f}" if abs(ratio) >= 0.1 else f"{ratio:.2g}",
                     "reported_by": spec.get("reported_by", "paper"), "tolerance": tol,
                     "agrees": None if ratio is None else abs(ratio - 1.0) <= tol})
    return rows
