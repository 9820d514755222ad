"""`leakbench verify DIR`: trust a results folder by recomputing a sample of it.

A digest catches accidents, not intent: anyone can recompute one (bench/protocol/records.py). So, as
RobustBench and HELM earn trust by re-running the evaluation, `verify` recomputes cells of a folder from their
stored configs with the running code, through the same path a run takes (bench/run/cells.py run_group), and
compares every metric with the stored value:

- selection: a seeded random sample of `sample` cells (after `only`, a label pattern as `leakbench run --only`
  takes), plus the headline cell of every row it touches (the row's cell with the most severe verdict, the one
  its verdict rests on); a row (scenario, defense) is one federated run, so its headline cell costs one attack;
- tolerance: exact for counts and labels (bytes, whole numbers, the metrics banded as label recovery), status and
  a blocked or diverged cell's reason; a metric with a stored 95% interval (a bootstrap) reproduces when the
  stored value lies inside the recomputed interval and the two intervals overlap; any other number within
  `Tolerance` (relative RELATIVE, absolute ABSOLUTE by default, per metric on the command line); timing
  metrics are never compared;
- outcome per cell: reproduced, differs (metric, stored, recomputed) or stale: computed by other code (its
  components are not the running code's, bench/run/version.py), so not compared; recompute it with --force or
  check out the fingerprint's commit. A record whose config today's code cannot rebuild into its cell id is stale
  too (--only selects it by its stored names).

The run is the whole row's: every cell of the row in the folder takes part in the federated run (they decide
what it draws: membership candidates, a malicious server's exchange), only the selected ones are scored, with
as many torch threads as the record says computed it (a thread count changes the order of float reductions:
core's labels row on 2 threads reproduces exactly, on 1 its accuracy moves by one of 500 test samples). Nothing
is written to the folder; `leakbench site --verify N` passes what was reproduced to the pages (the reading rule).
"""
from __future__ import annotations

import fnmatch
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from bench.federation.scenario import Scenario, SpecError, build
from bench.protocol.records import config_id, digest
from bench.run.runner import selected
from bench.run.spec import Cell, Component, Suite

RELATIVE = 1e-3    # the float tolerance of reconstructions and every other real-valued metric (README)
ABSOLUTE = 1e-6    # near zero
DEFAULT_SAMPLE = 8
STATES = ("reproduced", "differs", "stale")


@dataclass(frozen=True)
class Tolerance:
    relative: float = RELATIVE
    absolute: float = ABSOLUTE
    per_metric: dict[str, float] = field(default_factory=dict)   # metric -> relative tolerance

    @classmethod
    def parse(cls, texts: list[str]) -> "Tolerance":
        """--tolerance REL (every real-valued metric) or METRIC=REL (one metric), repeatable; ValueError names a bad
        one."""
        relative, per = RELATIVE, {}
        for text in texts:
            name, _, value = text.rpartition("=")
            try:
                number = float(value)
            except ValueError:
                number = -1.0
            if not number >= 0 or not math.isfinite(number):
                raise ValueError(f"--tolerance {text!r}: expected a relative tolerance >= 0 (e.g. 1e-3) or "
                                 "METRIC=REL (e.g. psnr=0.01)")
            if name:
                per[name] = number
            else:
                relative = number
        return cls(relative, ABSOLUTE, per)


@dataclass
class Outcome:
    """What verify found for one stored cell."""

    record: dict[str, Any]
    label: str
    state: str                                   # reproduced, differs or stale
    why: str = ""                                # stale: whose code; differs: the first difference in words
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)   # (metric, stored, recomputed)
    seconds: float = 0.0                         # its row's federated run and its attack, for the row's first cell


@dataclass
class Report:
    outcomes: list[Outcome]
    sampled: int                                  # drawn at random; the rest are headline cells of their rows
    cells: int                                    # cells in the folder
    seconds: float

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return 1 if self.count("differs") else 0

    def marks(self) -> tuple[frozenset[str], dict[str, int]]:
        """What a page takes from the report (leaderboards/site.py): the digests of the records it reproduced,
        which then count as verified, and the counts it states."""
        reproduced = frozenset(digest(o.record) for o in self.outcomes if o.state == "reproduced")
        return reproduced, {"reproduced": len(reproduced), "cells": self.cells, "stale": self.count("stale")}


def rebuild(rec: dict[str, Any]) -> Cell | None:
    """The cell a stored record was computed as, from its config (None: today's schema cannot rebuild it with the
    same id, an older record's; bench/run/upgrade.py maps what it can)."""
    from bench.run.upgrade import upgrade

    for config in (rec["config"], upgrade(rec["config"])):
        try:
            scenario = build(Scenario, dict(config["scenario"]), f"cell {rec['cell_id']}")
            cell = Cell(rec["suite"], scenario, Component(**config["defense"]), Component(**config["attack"]))
        except (SpecError, TypeError, KeyError):
            continue
        if cell.cell_id == rec["cell_id"] or config_id(cell.config()) == config_id(config):
            return cell
    return None


def headline(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The row's cell its verdict rests on: the finished cell with the most severe verdict (the first on a tie)."""
    from leaderboards.calibration import record_verdict
    from leaderboards.schema import schema_of
    from leaderboards.verdicts import LEVELS

    schema = schema_of(records)

    def severity(rec):
        level = record_verdict(rec, schema).level if rec["status"] == "ok" else ""
        return LEVELS.index(level) if level in LEVELS else -1
    return max(records, key=severity)


def choose(records: list[dict[str, Any]], cells: dict[str, Cell | None], sample: int | None, only: str | None,
           seed: int) -> tuple[list[dict[str, Any]], int]:
    """The records to recompute and how many of them were drawn at random (`sample` None: every selected one)."""
    pool = [r for r in records if _selected(r, cells[r["cell_id"]], only)]
    if only and not pool:
        raise ValueError(f"--only {only!r} selects none of the {len(records)} stored cells")
    drawn = pool if sample is None or sample >= len(pool) else random.Random(seed).sample(pool, sample)
    chosen = {r["cell_id"]: r for r in drawn}
    for key in dict.fromkeys(_row(r) for r in drawn):
        best = headline([r for r in records if _row(r) == key])
        chosen.setdefault(best["cell_id"], best)
    order = {r["cell_id"]: i for i, r in enumerate(records)}
    return sorted(chosen.values(), key=lambda r: order[r["cell_id"]]), len(drawn)


def _selected(rec: dict[str, Any], cell: Cell | None, only: str | None) -> bool:
    """--only on a record: its cell's labels, or, where its config cannot be rebuilt, the stored names."""
    if cell is not None:
        return selected(cell, only)
    names = f"{rec['scenario']}/{rec['defense']}/{rec['attack']}"
    return not only or (fnmatch.fnmatchcase(names, only) if any(ch in only for ch in "*?[") else only in names)


def _row(rec: dict[str, Any]) -> tuple[str, str, str]:
    """The row a record belongs to: one federated run (suite, scenario, defense with its parameters)."""
    return rec["suite"], rec["scenario"], config_id(rec["config"].get("defense") or {})


def differences(stored: dict[str, Any], fresh: dict[str, Any], tol: Tolerance) -> list[tuple[str, Any, Any]]:
    """Where the recomputed record disagrees with the stored one (module docstring: the tolerances)."""
    if stored["status"] != fresh["status"]:
        return [("status", stored["status"], f"{fresh['status']} ({fresh['reason']})" if fresh["reason"]
                 else fresh["status"])]
    out = []
    if stored["status"] in ("blocked", "diverged") and stored["reason"] != fresh["reason"]:
        out.append(("reason", stored["reason"], fresh["reason"]))
    for name in sorted(set(stored["metrics"]) | set(fresh["metrics"])):
        kind = _kind(name, stored, fresh)
        if kind == "timing":
            continue
        a, b = stored["metrics"].get(name), fresh["metrics"].get(name)
        if not _agree(name, kind, a, b, stored["details"], fresh["details"], tol):
            out.append((name, a, b))
    return out


def _kind(name: str, stored: dict[str, Any], fresh: dict[str, Any]) -> str:
    """timing, exact (a count: bytes or a whole number; or a label metric, one whose verdict band speaks of
    labels) or real: from the running code's metric schema (the fresh record's snapshot)."""
    from leaderboards.verdicts import BANDS, LABELS

    entry = fresh["details"].get("metric_schema", {}).get(name) or \
        stored["details"].get("metric_schema", {}).get(name) or {}
    if entry.get("timing"):
        return "timing"
    whole = entry.get("unit") == "B" or str(entry.get("fmt", "")).endswith(".0f}")
    return "exact" if whole or name in BANDS and BANDS[name].words == LABELS else "real"


def _agree(name: str, kind: str, a: Any, b: Any, stored: dict, fresh: dict, tol: Tolerance) -> bool:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if not numbers or kind == "exact":
        return a == b or numbers and math.isnan(a) and math.isnan(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    rel = tol.per_metric.get(name, tol.relative)
    mine, theirs = stored.get(f"{name}_ci95"), fresh.get(f"{name}_ci95")
    if _interval(mine) and _interval(theirs):   # a bootstrap: inside the recomputed interval, intervals overlap
        slack = tol.absolute + rel * max(abs(theirs[0]), abs(theirs[1]))
        return theirs[0] - slack <= a <= theirs[1] + slack and mine[0] <= theirs[1] + slack and \
            theirs[0] - slack <= mine[1]
    return math.isclose(a, b, rel_tol=rel, abs_tol=tol.absolute)


def _interval(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)


def verify(records: list[dict[str, Any]], data_root: str | None = None, sample: int | None = DEFAULT_SAMPLE,
           only: str | None = None, seed: int = 0, tolerance: Tolerance = Tolerance(), force: bool = False,
           progress: Callable[[Outcome], None] | None = None) -> Report:
    """Recompute the chosen records (`choose`) row by row and compare each (`differences`); `progress` hears each
    outcome as it is known. Bad input (a pattern that selects nothing, data that is missing) raises before any
    cell runs."""
    from bench.run.cells import run_group
    from bench.run.preflight import check_suite_data
    from bench.data.loading import resolve_data_root
    from bench.run.version import moved

    started = time.perf_counter()
    cells = {r["cell_id"]: rebuild(r) for r in records}
    chosen, drawn = choose(records, cells, sample, only, seed)
    runnable = [cells[r["cell_id"]] for r in chosen if cells[r["cell_id"]] is not None]
    if runnable:
        check_suite_data(Suite("verify", "", tuple(runnable)), data_root)
    outcomes: list[Outcome] = []

    def tell(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if progress:
            progress(outcome)

    for key in dict.fromkeys(_row(r) for r in chosen):
        mine = [r for r in chosen if _row(r) == key]
        scored = []
        for rec in mine:
            cell, label = cells[rec["cell_id"]], _label(rec)
            theirs = (rec.get("environment") or {}).get("fingerprint")
            if cell is None:
                tell(Outcome(rec, label, "stale", "its config is of an older schema this code cannot rebuild; check "
                                                  f"out the commit of fingerprint {theirs}"))
            elif not force and (other := moved(rec.get("environment"), resolve_data_root(data_root), absent=False)):
                tell(Outcome(rec, label, "stale", f"computed by other code (fingerprint {theirs}; {', '.join(other)} "
                                                  "differ from this code's): recompute with --force or check out the "
                                                  f"commit of {theirs}"))
            else:
                scored.append(rec)
        if not scored:
            continue
        group = [c for r in records if _row(r) == key and (c := cells[r["cell_id"]]) is not None]
        threads = (scored[0].get("environment") or {}).get("threads")
        with _threads(threads):
            clock = time.perf_counter()
            for rec, new in zip(scored, run_group(group, data_root, scored=[cells[r["cell_id"]] for r in scored])):
                found = differences(rec, new, tolerance)
                seconds, clock = time.perf_counter() - clock, time.perf_counter()
                why = "; ".join(f"{m} stored {a!r}, recomputed {b!r}" for m, a, b in found)
                if found and not isinstance(threads, int):
                    why += (f" (the record does not say how many torch threads computed it; recomputed with "
                            f"{torch.get_num_threads()}: set LEAKBENCH_THREADS to its count)")
                tell(Outcome(rec, _label(rec), "differs" if found else "reproduced", why, found, seconds))
    return Report(outcomes, drawn, len(records), time.perf_counter() - started)


@contextmanager
def _threads(count: Any) -> Iterator[None]:
    """Torch's intra-op threads set to the stored count while a row is recomputed (left as they are when the
    record does not say)."""
    before = torch.get_num_threads()
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _label(rec: dict[str, Any]) -> str:
    from leaderboards.schema import attack_label, defense_label
    return f"{rec['scenario']}/{defense_label(rec)}/{attack_label(rec)}"


__all__ = ["DEFAULT_SAMPLE", "Outcome", "Report", "Tolerance", "choose", "differences", "rebuild", "verify"]
