"""The one-screen summary above the core grid: defenses x attack families, each family on the model of round 0
and on the trained model, then utility loss with its 95% interval and HE cost.

Built from the grid (leaderboards/grid.py), never from records directly, so it cannot disagree with the detail
below it: a family cell is the worst calibrated verdict over the grid's columns of that family and stage (a
column is "trained" when its cells attack a round in the second half of training), and links to the grid cell
that gave it. Where no column of the family judges the row at that stage, the cell says why in the grid's own
words (diverged at round r, no verdict, n/a, not run), or "–" where no attack of the family ran at that stage.
Rows come in the grid's order (leaderboards/ordering.py).
"""
from __future__ import annotations

from typing import Any

from leaderboards.grid import STAGES
from bench.evaluation.verdicts import LEVELS

SHORT = {"leak": "leaks", "partial": "partly", "resisted": "resists", "blocked": "blocked"}
FALLBACK = ("diverged", "failed", "ok", "uncal", "missing", "na")   # a cell without a verdict shows the first found


def _family_cell(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst verdict among the grid cells of one family and stage, with a link to the cell that gave it."""
    if not cells:
        return {"kind": "none", "level": "", "text": "–", "title": "no attack of this family ran at this stage"}
    judged = [c for c in cells if c["kind"] in ("ok", "blocked") and c["verdict"].level in LEVELS]
    if judged:
        top = max(judged, key=lambda c: LEVELS.index(c["verdict"].level))
        verdict = top["verdict"]
        return {"kind": "verdict", "level": verdict.level, "text": SHORT[verdict.level],
                "title": f"{verdict.text}: {verdict.why}" if verdict.why else verdict.text, "href": f"#{top['id']}"}
    first = next((c for kind in FALLBACK for c in cells if c["kind"] == kind), cells[0])
    return {"kind": first["kind"], "level": "", "text": first["verdict"].text, "title": first["verdict"].why,
            "href": f"#{first['id']}"}


def summarize(core: dict[str, Any]) -> dict[str, Any]:
    """The summary of a grid: its families with their stages, and one row per grid row."""
    columns = core["columns"]
    families = list(dict.fromkeys(c["family"] for c in columns))
    pairs = [(f, s) for f in families for s in STAGES]
    rows = []
    for row in core["rows"]:
        cells = [_family_cell([cell for col, cell in zip(columns, row["cells"])
                               if col["family"] == f and col["stage"] == s]) for f, s in pairs]
        rows.append({"name": row["name"], "defense": row["defense"], "id": row["id"],
                     "params": row["name"][len(row["defense"]):].strip("()"), "no_utility": row["no_utility"],
                     "cells": cells, "utility": row["utility"][0] if row["utility"] else None, "he": row["he"]})
    return {"families": families, "stages": STAGES, "rows": rows}
