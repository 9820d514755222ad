"""One runner for the CLI and the pytest plugin.

Cells sharing a scenario and a defense share one federated run (the attacks replay
against the recorded uploads). A group's cells are written to the store as soon as it finishes. A
failing cell is recorded with its one-line reason and does not stop the others; the
run's exit status reports it. Groups are independent, so the executor is a seam
(bench/run/executors.py: in process, a process pool, or Ray); the driver alone claims groups and
writes the store, whichever executor computes them. A group with any selected cell missing is
recomputed whole, so a group's rows always come from one federated run (its run id is in
each record's environment); each group is claimed in the store (bench/run/leases.py), so concurrent
runs into one --out compute it once.

A stored cell is reused only when it finished and was computed by the same code (each component its record lists,
code, plugins, libraries and data files, has today's value: bench/run/version.py); `force` recomputes everything selected,
`only` selects cells by label pattern, `dry_run` reports what would run and runs nothing.

An output directory holding an export (results.json, pages.json: a committed leaderboard) but no store is
seeded from it first, so a run there resumes the leaderboard: only missing, failed or stale cells run. `reuse`
names other output directories whose finished cells (same cell id, current components) are copied instead of
computed, each noting its source folder (details' `copied_from`, shown on its page): suites that share a
scenario compute its cells once. Every record read from an export or another folder is checked before the store
is opened (bench/protocol/records.py says what that catches), so a refused one leaves nothing written.
"""
from __future__ import annotations

import difflib
import fnmatch
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.protocol.records import DIGEST, RecordError, check_record, sealed
from bench.run.cells import failed
from bench.run.executors import Job, check_options, make_executor
from bench.run.leases import Claims, group_id, new_run_id
from bench.run.spec import Cell, Suite
from bench.run.store import FINISHED, Store
from bench.run.upgrade import adopt
from bench.evaluation.exports import load_pages, load_records


@dataclass(frozen=True)
class RunSummary:
    ok: int
    blocked: int
    failed: int
    skipped: int
    stale: int = 0                                   # recomputed because the code changed
    failures: tuple[tuple[str, str], ...] = ()       # (cell label, one-line reason)
    plan: tuple[tuple[str, str], ...] = ()           # dry run: (cell label, new | stale | done | forced)
    diverged: int = 0                                # the group's training diverged (an outcome, exit 0)
    seeded: int = 0                                  # cells a new store took from the export beside it
    reused: int = 0                                  # cells copied from another output directory (--reuse)
    retired: int = 0                                 # stored cells of the suite no cell of it matches any more
    upgraded: int = 0                                # stored cells of an older schema kept as today's (upgrade.py)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def selected(cell: Cell, pattern: str | None) -> bool:
    """--only: a glob over the cell label scenario/defense/attack, or a substring of it.

    The label is tried with its parameters ("s/dp-fedavg(clip=1.0)/idlg(steps=100)") and with
    names only ("s/dp-fedavg/idlg"), so "*/idlg" selects iDLG whatever its parameters."""
    if not pattern:
        return True
    labels = (cell.label, f"{cell.scenario.name}/{cell.defense.name}/{cell.attack.name}")
    if any(ch in pattern for ch in "*?["):
        return any(fnmatch.fnmatchcase(label, pattern) for label in labels)
    return any(pattern in label for label in labels)


def select(suite: Suite, pattern: str | None) -> list[Cell]:
    """The cells `pattern` selects; a pattern that selects none is refused (ValueError) with the closest labels,
    since running nothing and exiting 0 reads as success."""
    chosen = [c for c in suite.cells if selected(c, pattern)]
    if pattern and not chosen:
        labels = list(dict.fromkeys(label for c in suite.cells for label in (
            c.label, f"{c.scenario.name}/{c.defense.name}/{c.attack.name}")))
        near = difflib.get_close_matches(pattern, labels, n=3, cutoff=0.0)
        raise ValueError(f"--only {pattern!r} selects none of the {len(suite.cells)} cells of suite "
                         f"'{suite.name}'; did you mean {' or '.join(repr(n) for n in near)}?")
    return chosen


def _group(cells: list[Cell]) -> list[list[Cell]]:
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.group_key, []).append(cell)
    return list(groups.values())


BEAT_S = 60.0   # how often the driver renews its claims on the groups in flight


def _store_group(job: Job, result: list[dict[str, Any]] | BaseException, data_root: str | None,
                 store: Store, tally: Callable[[str, str, str], None]) -> None:
    """Write a finished job's records; a job that raised becomes failed cells with its one-line reason,
    and a record computed by other code (a cluster node with another version) is refused the same way."""
    from bench.run.version import moved

    records = [failed(c, result) for c in job.cells] if isinstance(result, BaseException) else result
    for cell, record in zip(job.cells, records):
        other = moved(record["environment"], data_root and Path(data_root), absent=False)
        if record["status"] != "failed" and other:
            theirs = record["environment"].get("fingerprint")
            record = failed(cell, RuntimeError(f"computed by other code (fingerprint {theirs}: {', '.join(other)} "
                                               "differ from this process's); install this leakbench and its libraries "
                                               "on every worker"))
        record["environment"] = {**record["environment"], "run_id": job.run_id}
        store.put(record)
        tally(record["status"], cell.label, record["reason"])


def _drive(pending: list[list[Cell]], pool, data_root: str | None, store: Store, claims: Claims,
           current: Callable[[dict[str, Any]], bool], force: bool, tally: Callable[[str, str, str], None],
           poll_s: float) -> None:
    """Keep the executor's slots full of claimed groups and store each group's records as it finishes.

    A group another run holds is set aside and retried once the rest is done (by then it is usually
    finished there and skipped here); a group another run finished meanwhile is skipped unless forced."""
    inflight: dict[str, Job] = {}
    busy: list[list[Cell]] = []
    progressed = False
    try:
        while pending or busy or inflight:
            while pending and len(inflight) < pool.slots:
                cells = pending.pop(0)
                grp = group_id(cells)
                if not claims.claim(grp):
                    busy.append(cells)
                elif not force and all(store.finished(c.cell_id, current) for c in cells):
                    claims.release(grp)
                    progressed = True
                    for c in cells:
                        tally("skipped", c.label, "")
                else:
                    inflight[grp] = Job(cells, new_run_id(), grp, data_root)
                    pool.submit(inflight[grp])
            if inflight:
                for job, result in pool.wait(BEAT_S):
                    _store_group(job, result, data_root, store, tally)
                    claims.release(inflight.pop(job.group).group)
                    progressed = True
                for grp in inflight:
                    claims.beat(grp)
            elif busy:
                if not progressed:
                    time.sleep(poll_s)   # every remaining group is being computed by another run
                pending, busy, progressed = busy, [], False
    finally:
        for grp in inflight:
            claims.release(grp)


def exported(directory: Path) -> tuple[str, list[dict[str, Any]]]:
    """The file an output directory's records come from and its records, each checked: its store's, else its
    export's (results.json); a directory with neither, or a record that cannot be trusted, is refused in one line
    (ValueError)."""
    if (directory / "leakbench.sqlite").is_file():
        store = Store(directory / "leakbench.sqlite")
        try:
            return str(store.path), [check_record(rec, str(store.path), i) for i, rec in enumerate(store.records())]
        finally:
            store.close()
    if (directory / "results.json").is_file():
        return str(directory / "results.json"), load_records(directory)
    raise ValueError(f"--reuse '{directory}' holds neither leakbench.sqlite nor results.json; pass an output "
                     "directory of `leakbench run`")


def refuse_undigested(where: str, records: list[dict[str, Any]], current: Callable[[dict[str, Any]], bool]) -> None:
    """A record without a digest that claims the running code computed it (`current`) had its digest removed (this
    code seals every record it writes): refused (RecordError), since it would be copied or seeded as done. An
    undigested record of other code is stale, so recomputed rather than trusted."""
    for rec in records:
        env = rec.get("environment") or {}
        if DIGEST not in env and current(env):
            raise RecordError(f"{where}: cell {rec['cell_id']} cannot be trusted (it claims this code's fingerprint "
                              "but carries no digest, which this code always writes); restore the file from git or "
                              "recompute the cell")


def reusable(store: Store, cells: list[Cell], current: Callable[[dict[str, Any]], bool],
             sources: list[tuple[str, str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """The finished, sealed records of other output directories ((directory, file, records): `exported`) for cells
    this store lacks, computed by the running code (same cell id, `current`), by cell id, each noting the
    directory it came from. An unverified record (bench/protocol/records.py) is never copied."""
    wanted = {c.cell_id for c in cells if not store.finished(c.cell_id, current)}
    found: dict[str, dict[str, Any]] = {}
    for directory, _, records in sources:
        for rec in records:
            cid = rec["cell_id"]
            if cid in wanted and cid not in found and rec["status"] in FINISHED and sealed(rec) and \
                    current(rec.get("environment") or {}):
                found[cid] = {**rec, "details": {**rec.get("details", {}), "copied_from": directory}}
    return found


def membership(suite: Suite, stored: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The suite's cell ids and page info. Scenarios the load-time checks could not judge (--only selected none
    of their cells and their files are not here) keep what the stored page info says of them: their n/a grid
    points (left out of the membership) and chance accuracy."""
    info = suite.page_info()
    skipped = set(suite.unchecked)
    if skipped:
        for key in ("not_applicable", "chance"):
            kept = {sc: v for sc, v in (stored.get(key) or {}).items() if sc in skipped}
            info[key] = {**kept, **info[key]}
    na = info["not_applicable"]
    return [c.cell_id for c in suite.cells if c.defense.label not in na.get(c.scenario.name, {})
            or c.scenario.name not in skipped], info


def run_suite(suite: Suite, out_dir: str | Path, data_root: str | None = None, workers: int | None = None,
              progress: Callable[..., Any] | None = None, force: bool = False, only: str | None = None,
              dry_run: bool = False, poll_s: float = 1.0, executor: str | Any | None = None,
              ray_address: str | None = None, reuse: list[str | Path] = ()) -> RunSummary:
    """Run every group with a selected cell missing or stale, whole (its cells then share one federated
    run), each group claimed in the store so that concurrent runs into one --out compute it once.

    `executor` is a name (local, process, ray; None: local for one worker, process for more) or an
    executor object (bench/run/executors.py), which the caller then closes."""
    from bench.data.loading import resolve_data_root
    from bench.run.version import is_current

    root = resolve_data_root(data_root)
    root = None if root is None else str(root)
    bar = claims = None

    def on_round(job: Job, msg: str) -> None:
        if bar:
            bar.set_postfix_str(f"{job.where} {msg}", refresh=True)
        if claims:
            claims.beat(job.group)

    own = executor is None or isinstance(executor, str)
    if own:
        check_options(executor, workers, ray_address)
    out = Path(out_dir)
    chosen = select(suite, only)
    known: dict[str, bool] = {}

    def current(env: dict[str, Any]) -> bool:
        """Whether a stored environment is the running code's (each record's components re-hashed: version.py)."""
        key = json.dumps(env.get("components"), sort_keys=True) + str(env.get("fingerprint"))
        if key not in known:
            known[key] = is_current(env, root and Path(root))
        return known[key]
    export = None   # a new store beside an export is seeded from it; exports are read (and checked) first
    if not (out / "leakbench.sqlite").exists() and (out / "results.json").is_file():
        kept = load_records(out)
        export = kept, load_pages(out, kept)
        refuse_undigested(str(out / "results.json"), export[0], current)
    sources = [(str(Path(r)), *exported(Path(r))) for r in reuse]   # checked even when --force copies nothing
    for _, where, records in sources:
        refuse_undigested(where, records, current)
    path = out / "leakbench.sqlite"
    store = Store(path if path.exists() or not dry_run else ":memory:")   # a dry run writes no store
    seeded = store.seed(*export) if export else 0
    # records of an older scenario schema kept as today's cells (stale: their fingerprint is older code's)
    upgraded = adopt(store, suite.name, suite.cells, dry_run=dry_run and path.exists())
    copies = {} if force else reusable(store, chosen, current, sources)
    if not dry_run:
        for rec in copies.values():
            store.put(rec)
    reused = len(copies)
    states = {c.cell_id: "forced" if force else "done" if c.cell_id in copies else
              store.state(c.cell_id, current) for c in chosen}
    pending = [g for g in _group(chosen) if any(states[c.cell_id] != "done" for c in g)]
    stale = sum(states[c.cell_id] == "stale" for g in pending for c in g)
    skipped = len(chosen) - sum(len(g) for g in pending)
    members = membership(suite, store.suite_info(suite.name))
    retired = len(set(store.members(suite.name)) - set(members[0]) - upgraded)
    if dry_run:
        store.close()
        rerun = {c.cell_id for g in pending for c in g}   # a done cell of a pending group reruns with it
        return RunSummary(0, 0, 0, skipped, stale, seeded=seeded, reused=reused, retired=retired,
                          upgraded=len(upgraded), plan=tuple(
            (c.label, "group" if states[c.cell_id] == "done" and c.cell_id in rerun else states[c.cell_id])
            for c in chosen))
    try:   # started only when there is work: a local Ray costs seconds
        pool = (make_executor(executor, workers, ray_address, on_round) if pending else None) if own else executor
    except BaseException:
        store.close()
        raise
    store.set_membership(suite.name, *members)
    counts = {"ok": 0, "blocked": 0, "diverged": 0, "failed": 0, "skipped": skipped}
    failures: list[tuple[str, str]] = []
    bar = progress(total=sum(len(g) for g in pending), desc=f"suite {suite.name}", unit="cell") if progress else None

    def tally(status: str, label: str, reason: str) -> None:
        counts[status] += 1
        if status == "failed":
            failures.append((label, reason))
        if bar:
            bar.update(1)

    claims = Claims(store.path)
    try:
        _drive(pending, pool, root, store, claims, current, force, tally, poll_s)
    finally:
        claims.close()
        if bar:
            bar.close()
        store.close()
        if own and pool is not None:
            pool.close()
    return RunSummary(counts["ok"], counts["blocked"], counts["failed"], counts["skipped"], stale, tuple(failures),
                      diverged=counts["diverged"], seeded=seeded, reused=reused, retired=retired,
                      upgraded=len(upgraded))


__all__ = ["run_suite", "RunSummary", "selected", "select"]
