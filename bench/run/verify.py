"""`leakbench verify DIR`: re-check a results folder by recomputing the cells that decide what its pages show.

A digest is a checksum against accidental edits, not a signature: anyone can reseal an edited record
(bench/protocol/records.py). So, as RobustBench and HELM earn trust by re-running the evaluation, `verify`
recomputes cells from their stored configs with the running code, through the path a run takes
(bench/run/cells.py run_group), and compares each with its record.

Which cells: by default every cell that decides something a page shows, chosen from the page's structure and
never from the values the cells store (bench/evaluation/deciding.py: every cell of a calibrated attack, every
undefended row's cell, the cells utility, HE cost and the notes' numbers are read from); the caller passes their
ids. `sample` adds that many cells of the rest, drawn at random (seeded); `only` narrows both to the cells whose
label matches. Before anything runs, `plan` states how many cells and rows will be recomputed and about how long
it takes here: each row's stored federated run time once (its longest record's `wall_s`) plus each cell's stored
attack time per upload times its uploads, scaled up where the records used more torch threads than this machine
has CPUs; rows run one after another.

The tolerance per metric, derived from what the metric measures (bench/run/tolerance.py):

metric                         reproduces when the recomputed     why
                               value is within
-----------------------------  ---------------------------------  -----------------------------------------------------
accuracy (and its personal     5 test samples: 5 / test_samples   a prediction flips where two logits lie within float
and own-label forms)                                              error: across two CPUs whose torch dispatched other
                                                                  kernels (AVX-512 and AVX2 paths, MKL), core's label
                                                                  scenario's accuracies moved by 1 to 5 of 500 test
                                                                  samples, the most any accuracy moved; with the
                                                                  numerical path pinned most cells reproduce bit for
                                                                  bit, so 5 (1 % of 500) is a ceiling, not an allowance
PSNR                           0.5 dB                             an iterative reconstruction on another float path
                                                                  ends elsewhere in the same basin; 0.5 dB is 12 % in
                                                                  squared error, far inside the 12 dB between the cuts
SSIM, LPIPS                    0.01                               the same on their [0, 1] scale, inside the 0.2-0.4
                                                                  between their cuts
label acc., IRec, exact        one item of one attacked batch:    they count the batch's labels (sentences, images): one
match, images recovered        1 / (B x uploads)                  item is their resolution, and a float path moves at
                                                                  most the one nearest its rounding
LnAcc, LeAcc                   one label: 2 / (C x uploads), C =  one wrong label moves two class counts of C
                               1 / chance_accuracy; else exact
label F1, client class F1      exact                              F1 over a handful of present classes: one label moves
                                                                  it far
membership AUROC               m + n of the m n member/non-       AUROC is the share of ordered pairs, so one pair is
                               member pairs swapped:              its resolution on the sample; a float path moves a
                               (m + n) / (m n)                    score at most past its neighbour: one swap per sample
TPR at a low FPR, FPR at a     1 / m, 1 / n, (1 / m + 1 / n) / 2  one member (non-member) across the threshold
TPR, balanced accuracy
bytes of a run that sent       relative 1e-3                      SEAL compresses each serialized ciphertext, whose
ciphertexts                                                       coefficients are fresh randomness, so its length
                                                                  moves with every encryption: one vector encrypted 20
                                                                  times at N = 8192, [60, 40, 60] took 235,025-235,150
                                                                  bytes (0.05 %); at (60, 49) nothing compresses
other bytes, whole numbers,    exact                              counts and facts of the protocol: no float path
test samples, chance, status,                                     changes them
blocked or diverged reason,
family, threat model,
undefended
times (schema: timing)         never compared                     a machine's speed
perplexity                     relative e^(r x ln p) - 1          it is e^loss: the loss's own tolerance r carried
                                                                  through (0.49 % at perplexity 134, not 0.1 %)
any other number (epsilon,     relative r = 1e-3 (--tolerance     float noise of a mean over a few hundred values
KDE MI, fractions, costs)      REL); in a randomized run 5e-3
an estimate of leakage         relative 0.25                      a run whose recomputations differ from each other
(schema kind privacy) without                                     draws randomness no seed fixes: CKKS encryption's
a rule above, in a randomized                                     fresh noise, decrypted into the model, moves every
run                                                               later update. SHE-LoRA's membership row (CKKS at
                                                                  N = 8192, [60, 40, 60], 2^40), computed nine times
                                                                  with the same code, threads and pinning: round 1's
                                                                  120 encryptions took identical inputs, its first
                                                                  decryption already differed (2.21585e-5 and
                                                                  2.21552e-5), and at the end the loss spanned
                                                                  4.8986-4.9152 (sd 0.10 %; perplexity 134.1-136.3),
                                                                  KDE MI of the protected part 0.0910-0.1045 (sd
                                                                  4.7 %), KDE MI 0.0675-0.0782 (sd 5.1 % over seven);
                                                                  0.25 and 5e-3 are 3.4 and 3.6 standard deviations
                                                                  of the difference of two runs
a rate over N samples          two binomial standard errors,      another model scores every sample, so more than one
(accuracy, per-item, TPR, FPR, 2 sqrt(p (1 - p) / N), where wider crosses a threshold: in that row TPR at 5 % FPR read
balanced acc.) in a randomized                                    7 and 10 of 128 members in two runs (record: 8)
run
a stored 95 % interval         both bounds at its metric's        it is shown beside the value. Never "anywhere in the
                               tolerance                          interval": a value forged inside its own interval
                                                                  (PSNR 63.11 -> 6.0 dB in [5.4, 94.7]) does not
                                                                  reproduce

In every case the recomputed record must give the same verdict band for each banded metric
(bench/evaluation/verdicts.py), the same record verdict, the same utility flag (bench/evaluation/usefulness.py)
and, where the caller passes `ranks` (the CLI: leaderboards/tables.py), the same rank to every row of its
scenario's table. `--tolerance METRIC=ABS` replaces one metric's entry. The tolerances are for the device the
record names (its environment): on a GPU an iterative reconstruction follows another float path altogether.

The run is the whole row's: every cell of the row in the folder takes part in the federated run (they decide
what it draws: membership candidates, a malicious server's exchange), only the chosen ones are scored, with as
many torch threads as the record says computed it, whatever this machine's default: the thread count orders
float reductions, and a model trained over rounds amplifies that past any per-metric tolerance (core's trained
MNIST MLP row recomputed at 2 threads where its records used 1: KDE MI 0.688 -> 0.693, SPEAR's images recovered
13 -> 15 of 24, iLRG's label F1 0.49 -> 0.54, all in the same verdict band; the same row reproduces at 1 thread,
and the trained LoRA row's DAGER cell, then at DAGER's default thresholds, reproduced at either count).
`--threads` overrides it, to measure that. A row in which a chosen cell differs is recomputed once more: where
the two runs agree the difference stands (a forgery, a bug, another float path); where they differ from each other
the row is randomized, each of its cells is compared with both runs at the table's randomized entry, and the
report says what the two runs differ in. Each chosen cell
reads reproduced, differs (what moved, stored, recomputed, the tolerance) or stale: computed by other code (its
fingerprint is not the running code's, or its config no longer rebuilds), not compared; `force` compares it
anyway. Nothing is written to the folder; the report (`Report.checked`, `--report FILE`) is what a page shows
(bench/evaluation/verification.py).
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime
import fnmatch
import multiprocessing as mp
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from bench.evaluation.verification import Checked
from bench.federation.scenario import Scenario, SpecError, build
from bench.protocol.records import config_id, digest
from bench.run.recompute import machine, recompute_row
from bench.run.runner import selected
from bench.run.spec import Cell, Component, Suite
from bench.run.tolerance import Difference, Tolerance, differences, randomized, timing

SAMPLED = "drawn at random from the cells that decide nothing on the page"
Ranks = Callable[[list[dict[str, Any]]], dict[str, Any]]   # one scenario's records -> each row's rank


@dataclass
class Outcome:
    """What verify found for one stored cell."""

    record: dict[str, Any]
    label: str
    state: str                                   # reproduced, differs or stale
    chosen: str = ""                             # what the cell decides on the page, or SAMPLED
    why: str = ""                                # stale: whose code; differs: the differences in words
    differences: list[Difference] = field(default_factory=list)
    tolerances: dict[str, str] = field(default_factory=dict)   # metric -> the tolerance it was compared at
    seconds: float = 0.0                         # its row's whole recomputation, on the row's first cell
    threads: int | None = None                   # the torch threads that recomputed it (None: not recomputed)

    def to_json(self, where: str, date: str) -> dict[str, Any]:
        """The report's outcome: `where` (this machine) and `date` recomputed it, with its torch threads."""
        return {"cell_id": self.record["cell_id"], "label": self.label, "digest": digest(self.record),
                "state": self.state, "chosen": self.chosen, "why": self.why, "tolerances": self.tolerances,
                "differences": [[d.what, d.stored, d.recomputed, d.tolerance] for d in self.differences],
                "seconds": round(self.seconds, 3), "date": date,
                "machine": where + (f", {self.threads} torch thread(s)" if self.threads else "")}


@dataclass
class Plan:
    """The cells to recompute, each with why it was chosen, and what it will take."""

    records: list[dict[str, Any]]
    cells: dict[str, Cell | None]
    chosen: list[tuple[dict[str, Any], str]]     # (record, what it decides or SAMPLED), in the folder's order
    stale: dict[str, str]                        # cell id -> why it will not be compared
    deciding: int
    sampled: int
    seconds: float                               # estimated time here
    forced: float = 0.0                          # the same with the stale cells recomputed too (--force)

    @property
    def rows(self) -> int:
        return len({_row(r) for r, _ in self.chosen if r["cell_id"] not in self.stale})

    def summary(self, where: str, workers: int = 1) -> str:
        """The line `leakbench verify` states before it starts (`workers` rows at a time)."""
        compared = len(self.chosen) - len(self.stale)
        threads = sorted({str((r.get("environment") or {}).get("threads", "?")) for r, _ in self.chosen})
        at_once = max(1, min(workers, self.rows))
        stale = f"; {len(self.stale)} stale, not compared (about {_hours(self.forced / at_once)} with --force)" \
            if self.stale else ""
        return (f"verify {where}: {compared} of {len(self.records)} cell(s) in {self.rows} row(s) will be recomputed "
                f"({self.deciding} deciding what its pages show, {self.sampled} drawn at random{stale}): about "
                f"{_hours(self.seconds / at_once)} on this machine ({os.cpu_count()} CPUs; the records' stored run and "
                f"attack times at {', '.join(threads)} torch thread(s), {at_once} row(s) at a time)")


@dataclass
class Report:
    outcomes: list[Outcome]
    plan: Plan
    seconds: float
    machine: str
    date: str

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)

    def checked(self, folder: str, earlier: tuple[dict[str, Any], ...] = ()) -> Checked:
        """What a page takes from the report (bench/evaluation/verification.py), and what --report writes;
        `earlier`: the outcomes of the pieces this one resumed."""
        return Checked(folder, self.machine, self.date, len(self.plan.records),
                       earlier + tuple(o.to_json(self.machine, self.date) for o in self.outcomes))


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


def plan(records: list[dict[str, Any]], deciding: dict[str, str], sample: int | None = 0, only: str | None = None,
         seed: int = 0, force: bool = False, data_root: str | None = None, done: frozenset[str] = frozenset()
         ) -> Plan:
    """The cells `deciding` names (cell id -> what it decides), plus `sample` drawn from the rest (None: all of
    it), both narrowed by `only` and less the cells `done` (ids a resumed report already holds); ValueError when
    `only` matches no stored cell. A cell is stale where its stored
    components are not today's (bench/run/version.py `moved`; a data file this machine lacks is not held against
    it here: the recomputation reads it or fails)."""
    from bench.data.loading import resolve_data_root
    from bench.run.version import moved

    cells = {r["cell_id"]: rebuild(r) for r in records}
    pool = [r for r in records if _matches(r, cells[r["cell_id"]], only)]
    if only and not pool:
        raise ValueError(f"--only {only!r} selects none of the {len(records)} stored cells; patterns match "
                         "scenario/defense/attack labels, e.g. 'cifar10-lenet-labels-b32/*'")
    pool = [r for r in pool if r["cell_id"] not in done]
    rest = [r for r in pool if r["cell_id"] not in deciding]
    drawn = rest if sample is None or sample >= len(rest) else random.Random(seed).sample(rest, sample)
    picked = {r["cell_id"] for r in drawn} | {r["cell_id"] for r in pool if r["cell_id"] in deciding}
    chosen = [(r, deciding.get(r["cell_id"], SAMPLED)) for r in pool if r["cell_id"] in picked]
    stale = {}
    for rec, _ in chosen:
        cell, theirs = cells[rec["cell_id"]], (rec.get("environment") or {}).get("fingerprint")
        if cell is None:
            stale[rec["cell_id"]] = ("its config is of an older schema this code cannot rebuild; check out the "
                                     f"commit of fingerprint {theirs}")
        elif not force and (other := moved(rec.get("environment"), resolve_data_root(data_root), absent=False)):
            stale[rec["cell_id"]] = (f"computed by other code (fingerprint {theirs}; {', '.join(other)} differ from "
                                     f"this code's): recompute with --force or check out the commit of {theirs}")
    compared = [r for r, _ in chosen if r["cell_id"] not in stale]
    rebuilt = [r for r, _ in chosen if cells[r["cell_id"]] is not None]
    return Plan(records, cells, chosen, stale, len(chosen) - len(drawn), len(drawn), _estimate(records, compared),
                _estimate(records, rebuilt))


def _matches(rec: dict[str, Any], cell: Cell | None, only: str | None) -> bool:
    """--only over the record's label; a record that no longer rebuilds is matched by its stored label."""
    if cell is not None:
        return selected(cell, only)
    if not only:
        return True
    labels = (_label(rec), f"{rec['scenario']}/{rec['defense']}/{rec['attack']}")
    glob = any(ch in only for ch in "*?[")
    return any(fnmatch.fnmatchcase(x, only) if glob else only in x for x in labels)


def _estimate(records: list[dict[str, Any]], compared: list[dict[str, Any]]) -> float:
    """Seconds: each row's longest stored federated run once plus each compared cell's attack time per upload times
    its uploads, scaled by stored threads over this machine's CPUs where the records used more."""
    cpus = os.cpu_count() or 1
    total = 0.0
    for key in dict.fromkeys(_row(r) for r in compared):
        row = [r for r in records if _row(r) == key]
        mine = [r for r in compared if _row(r) == key]
        run = max(float(r["metrics"].get("wall_s") or 0) for r in row)
        attacks = sum(float(r["metrics"].get("attack_s") or 0) * _uploads(r) for r in mine)
        threads = (mine[0].get("environment") or {}).get("threads")
        scale = max(1.0, threads / cpus) if isinstance(threads, int) and threads > 0 else 1.0
        total += (run + attacks) * scale
    return total


def _uploads(rec: dict[str, Any]) -> int:
    lists = [v for v in (rec["details"].get("per_target") or {}).values() if isinstance(v, list)]
    if lists:
        return max(len(v) for v in lists)
    repeats = ((rec.get("config") or {}).get("scenario") or {}).get("attack_repeats")
    return int(repeats) if isinstance(repeats, (int, float)) and repeats >= 1 else 1


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else \
        f"{seconds:.0f} s"


def _row(rec: dict[str, Any]) -> tuple[str, str, str]:
    """The row a record belongs to: one federated run (suite, scenario, defense with its parameters)."""
    return rec["suite"], rec["scenario"], config_id(rec["config"].get("defense") or {})


def verify(p: Plan, data_root: str | None = None, tolerance: Tolerance = Tolerance(), ranks: Ranks | None = None,
           progress: Callable[[Outcome], None] | None = None, workers: int = 1, threads: int | None = None) -> Report:
    """Recompute the plan's cells row by row and compare each with its record (the module docstring's table);
    `ranks` gives one scenario's rows their ranks, so a recomputed cell that moves a rank does not reproduce;
    `progress` hears each outcome as it is known. `workers` rows at a time, each in a spawned process (a row is
    one federated run; rows share nothing); `threads` torch threads per row instead of the count each record
    states (another machine's setting). Missing data raises before any cell runs."""
    from bench.run.preflight import check_suite_data

    started = time.perf_counter()
    runnable = [p.cells[r["cell_id"]] for r, _ in p.chosen if r["cell_id"] not in p.stale]
    if runnable:
        check_suite_data(Suite("verify", "", tuple(runnable)), data_root)
    outcomes: list[Outcome] = []

    def tell(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if progress:
            progress(outcome)

    why = dict((r["cell_id"], w) for r, w in p.chosen)
    for rec, chosen in p.chosen:
        if rec["cell_id"] in p.stale:
            tell(Outcome(rec, _label(rec), "stale", chosen, p.stale[rec["cell_id"]]))
    rows = []
    for key in dict.fromkeys(_row(r) for r, _ in p.chosen if r["cell_id"] not in p.stale):
        scored = [r for r, _ in p.chosen if _row(r) == key and r["cell_id"] not in p.stale]
        group = [c for r in p.records if _row(r) == key and (c := p.cells[r["cell_id"]]) is not None]
        count = threads or (scored[0].get("environment") or {}).get("threads")
        rows.append((scored, (group, [p.cells[r["cell_id"]] for r in scored], data_root, count)))

    def judged(scored: list[dict[str, Any]], runs: list[tuple[list[dict[str, Any]], int, float]]) -> bool:
        """Tell the row's outcomes from its recomputations; False, telling nothing, where a cell differs after one
        run: the row runs again, and where the two runs differ from each other (fresh randomness no seed fixes,
        such as CKKS encryption's) each cell is compared with both at the tolerance of a randomized run."""
        spread = randomized([r[0] for r in runs], tolerance)
        tol = tolerance.of_randomized_run(spread) if spread else tolerance
        used, seconds = runs[0][1], sum(r[2] for r in runs)
        found = [[d for fresh, *_ in runs for d in differences(rec, fresh[i], tol) + _rank(rec, fresh[i], p.records,
                                                                                          ranks)]
                 for i, rec in enumerate(scored)]
        if any(found) and len(runs) == 1:
            return False
        for i, rec in enumerate(scored):
            text = "; ".join(dict.fromkeys(map(str, found[i])))
            stored = (rec.get("environment") or {}).get("threads")
            if found[i] and not isinstance(stored, int):
                text += (f" (the record does not say how many torch threads computed it; recomputed with {used}: set "
                         "LEAKBENCH_THREADS to its count)")
            elif found[i] and stored != used:
                text += (f" (recomputed with {used} torch thread(s), the record with {stored}: the thread count orders "
                         "float reductions, so a trained model follows another path; verify without --threads)")
            if spread:
                text = "; ".join(filter(None, [f"a randomized run, two recomputations apart: {spread}", text]))
            tell(Outcome(rec, _label(rec), "differs" if found[i] else "reproduced", why[rec["cell_id"]], text,
                         found[i], _tolerances(rec, runs[0][0][i], tol), seconds if i == 0 else 0.0, used))
        return True

    if workers <= 1 or len(rows) <= 1:
        for scored, job in rows:
            runs = [recompute_row(*job)]
            if not judged(scored, runs):
                judged(scored, runs + [recompute_row(*job)])
    else:
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            pending = {pool.submit(recompute_row, *job): (scored, job, []) for scored, job in rows}
            while pending:
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    scored, job, runs = pending.pop(fut)
                    if not judged(scored, runs + [fut.result()]):
                        pending[pool.submit(recompute_row, *job)] = (scored, job, runs + [fut.result()])
    return Report(outcomes, p, time.perf_counter() - started, machine(), datetime.date.today().isoformat())


def _rank(stored: dict[str, Any], fresh: dict[str, Any], records: list[dict[str, Any]], ranks: Ranks | None
          ) -> list[Difference]:
    """The rows whose rank in the cell's scenario moves when its recomputed record takes the stored one's place."""
    if ranks is None:
        return []
    scenario = [r for r in records if r["suite"] == stored["suite"] and r["scenario"] == stored["scenario"]]
    before = ranks(scenario)
    after = ranks([fresh if r is stored else r for r in scenario])
    return [Difference(f"rank of {row} in {stored['scenario']}", before[row], after.get(row), "same rank")
            for row in before if before[row] != after.get(row)]


def _tolerances(stored: dict[str, Any], fresh: dict[str, Any], tol: Tolerance) -> dict[str, str]:
    """Metric -> the tolerance it was compared at (times left out)."""
    return {name: tol.of(name, stored).text for name in sorted(stored["metrics"])
            if not timing(name, stored, fresh)}


def _label(rec: dict[str, Any]) -> str:
    from bench.evaluation.schema import attack_label, defense_label
    return f"{rec['scenario']}/{defense_label(rec)}/{attack_label(rec)}"


__all__ = ["Outcome", "Plan", "Report", "SAMPLED", "Tolerance", "plan", "rebuild", "verify"]
