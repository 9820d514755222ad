"""Numbers in a suite's notes by reference, so that a recomputation updates the prose with the tables.

    iLRG recovers every label ({= cifar10-lenet-labels-b32/plaintext/ilrg label_acc =}) ...

A reference `{= CELL METRIC =}` is replaced, when the page renders, by that cell's value of METRIC written as its
table writes it (the metric's unit and format). CELL names one record of the suite: its full label
`scenario/defense(params)/attack(params)`, the same with names only where that is unambiguous, or a glob (`*`)
that matches exactly one cell. METRIC is a metric the record reports; `METRIC ci` gives its stored 95% interval
("[lo, hi]"); `status` gives the cell's status, with its round where it diverged. A reference that names no cell
of the suite, or several, is refused when the suite loads (`check_references`, one line, exit 2); at render, a
cell of the suite not computed yet (a run narrowed by --only, one still running) reads "(not computed)", and
several records or a metric the record lacks fail the render with one line naming it (`NoteError`). A value of
an unverified record (bench/protocol/records.py's reading rule) reads "(unverified)" after it.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from bench.evaluation.formats import interval, is_number, number
from bench.evaluation.pages import REFERENCE, NoteError, named_cells, parsed_reference
from bench.evaluation.schema import schema_of
from leaderboards.tables import attack_label, defense_label

def resolve(text: str, records: list[dict[str, Any]], suite: str,
            trusted: Callable[[dict[str, Any]], bool] | None = None) -> str:
    """`text` with every `{= CELL METRIC =}` replaced by the value it names, marked where `trusted` (the reading
    rule) says the record is not."""
    schema = schema_of(records)
    full = {f"{r['scenario']}/{defense_label(r)}/{attack_label(r)}": r for r in records}
    bare: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        bare.setdefault(f"{r['scenario']}/{r['defense']}/{r['attack']}", []).append(r)

    def value(match: re.Match) -> str:
        rec, text = cell_value(match)
        return text if rec is None or trusted is None or trusted(rec) else f"{text} (unverified)"

    def cell_value(match: re.Match) -> tuple[dict[str, Any] | None, str]:
        words, where = parsed_reference(match, suite)
        cell, metric = words[0], words[1]
        hits = named_cells(cell, full, bare)
        if not hits:   # a cell of the suite (checked at load) this folder has no record of yet
            return None, "(not computed)"
        if len(hits) != 1:
            some = ", ".join(sorted(f"{r['scenario']}/{defense_label(r)}/{attack_label(r)}" for r in hits)[:3])
            raise NoteError(f"{where} names {len(hits)} cells{': ' + some if some else ''}; name exactly one "
                            "(its full label, as the suite page's tables list it)")
        rec = hits[0]
        if metric == "status":
            round_ = rec["metrics"].get("diverged_round")
            return rec, f"diverged at round {round_:.0f}" if rec["status"] == "diverged" and is_number(round_) \
                else rec["status"]
        shown = schema.get(metric)
        if shown is None or metric not in rec["metrics"] or (rec["metrics"][metric] is None and len(words) == 2):
            raise NoteError(f"{where}: the cell reports no '{metric}'; its metrics: "
                            f"{', '.join(sorted(rec['metrics'])) or 'none'}")
        if len(words) == 3:
            ci = rec["details"].get(f"{metric}_ci95")
            if not ci:
                raise NoteError(f"{where}: the cell stores no 95% interval of '{metric}'")
            return rec, interval(ci, shown.unit, shown.fmt)
        return rec, number(rec["metrics"][metric], shown.unit, shown.fmt)

    return REFERENCE.sub(value, text)
