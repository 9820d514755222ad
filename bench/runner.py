"""One runner for the CLI and the pytest plugin.

Cells sharing a scenario and a defense share one federated run (the attacks replay
against the recorded uploads). A group's cells are written to the store as soon as it finishes. A
failing cell is recorded with its one-line reason and does not stop the others; the
run's exit status reports it. Groups are independent, so the executor is a seam
(bench/executors.py: in process, a process pool, or Ray); the driver alone claims groups and
writes the store, whichever executor computes them. A group with any selected cell missing is
recomputed whole, so a group's rows always come from one federated run (its run id is in
each record's environment); each group is claimed in the store (bench/claims.py), so concurrent
runs into one --out compute it once.

A stored cell is reused only when it finished and was computed by the same code (package
version and code fingerprint, bench/version.py); `force` recomputes everything selected,
`only` selects cells by label pattern, `dry_run` reports what would run and runs nothing.
"""
from __future__ import annotations

import fnmatch
import os
import platform
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from bench.claims import Claims, group_id, new_run_id
from bench.executors import Job, check_options, make_executor
from bench.registry import ATTACKS, DEFENSES, METRICS
from bench.spec import Cell, Suite
from bench.store import Store


@dataclass(frozen=True)
class RunSummary:
    ok: int
    blocked: int
    failed: int
    skipped: int
    stale: int = 0                                   # recomputed because the code changed
    failures: tuple[tuple[str, str], ...] = ()       # (cell label, one-line reason)
    plan: tuple[tuple[str, str], ...] = ()           # dry run: (cell label, new | stale | done | forced)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def environment() -> dict[str, Any]:
    from bench.version import code_fingerprint, package_version
    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count(), "leakbench": package_version(), "fingerprint": code_fingerprint(),
            "device": compute_device()}


def compute_device() -> str:
    """The torch device the cell ran on, with the GPU's name (not part of the cell id: bench/compute.py)."""
    from bench.compute import device
    dev = device()
    return f"cuda ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "cpu"


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


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _record(cell: Cell, status: str, reason: str, metrics: dict, details: dict | None = None) -> dict[str, Any]:
    from bench.defense import KEY_TOPOLOGIES
    details = dict(details or {})
    details.setdefault("key_topology", DEFENSES.get(cell.defense.name).key_topology)
    details["decrypts_single_upload"] = KEY_TOPOLOGIES[details["key_topology"]]
    return {"cell_id": cell.cell_id, "suite": cell.suite, "scenario": cell.scenario.name,
            "defense": cell.defense.name, "defense_params": cell.defense.params, "attack": cell.attack.name,
            "attack_params": cell.attack.params, "status": status, "reason": reason, "metrics": metrics,
            "details": details, "config": cell.config(), "environment": environment()}


def score_cell(cell: Cell, run) -> dict[str, Any]:
    """Run the cell's attack on every attacked upload of the run and compute every applicable metric."""
    attack = ATTACKS.get(cell.attack.name)(**cell.attack.params)
    reason = attack.blocked(run.targets[0].view, run.targets[0].knowledge)
    run_values = dict(run.metrics)
    if reason is not None:
        details = dict(run.details) | {"sent_in_clear": sent_in_clear(run.targets[0].view, set())}
        return _record(cell, "blocked", f"blocked by design: {reason}", _run_metrics(run_values), details)
    from metrics.schema import Evidence
    per_target: dict[str, list] = {}
    evidence: dict[str, object] = {}   # metrics' extra details (raw scores, intervals), first upload's
    texts, info = [], []
    attack_time, thumb = 0.0, None
    read: set[str] = set()
    for i, target in enumerate(run.targets):
        start = time.perf_counter()
        rec = attack.run(target.view, target.knowledge, seed=cell.scenario.seed * 1000 + i)
        attack_time += time.perf_counter() - start
        read |= set(rec.read_meta)
        if i == 0 and rec.images is not None:   # ground truth next to the reconstruction, for the page
            from bench.thumbnails import thumbnail
            thumb = thumbnail(rec.images, target.truth.x)
        for m in METRICS.entries():
            if m.obj.per_target:
                ev = Evidence(rec, target.truth, target.view, target.knowledge, run_values)
                value = m.obj.compute(ev)
                if value is not None:
                    per_target.setdefault(m.name, []).append(value)
                    if i == 0 and m.obj.details is not None:
                        evidence.update(m.obj.details(ev))
        if i == 0:
            evidence.update(rec.extra.get("details", {}))
        if rec.texts is not None:   # recovered sentences beside the references they were matched to
            info.append({k: v for k, v in rec.extra.items() if isinstance(v, (bool, int, float, str))})
            matched, reference = rec.extra.get("_matched", (None, None))
            texts.append({"recovered": list(rec.texts), "matched": matched, "reference": reference})
    run_values["attack_s"] = attack_time / len(run.targets)
    metrics = _run_metrics(run_values)
    for name, values in per_target.items():
        unavailable = [v for v in values if isinstance(v, str)]
        metrics[name] = unavailable[0] if unavailable else float(np.mean(values))
    details = dict(run.details)
    details["per_target"] = {k: v for k, v in per_target.items()}
    details.update(evidence)
    if any(info):
        details["attack_info"] = info
    if texts:
        details["texts"] = texts
    details["sent_in_clear"] = sent_in_clear(run.targets[0].view, read)
    if thumb:
        details["thumbnail"] = thumb
    return _record(cell, "ok", "", metrics, details)


def sent_in_clear(view, read: set[str]) -> list[dict[str, Any]]:
    """The view's metadata as the record lists it: key, size, public layout, and whether this
    cell's attack read it; a page shows the entries no attack read as "sent in the clear, not attacked"."""
    return [{"key": k, "bytes": len(v), "layout": view.layouts.get(k, "opaque"), "attacked": k in read}
            for k, v in sorted(view.meta.items())]


def _run_metrics(run_values: dict[str, Any]) -> dict[str, Any]:
    from metrics.schema import Evidence
    out = {}
    for m in METRICS.entries():
        if not m.obj.per_target:
            value = m.obj.compute(Evidence(run=run_values))
            if value is not None:
                out[m.name] = value
    return out


def federate(cell: Cell, data_root: str | None, on_round: Callable[[str], None] | None = None):
    """The federated run shared by every cell of the cell's group; on_round hears "round r/R" as they finish."""
    from bench.budget import apply_budget
    from bench.datasets import load_dataset, resolve_data_root
    from bench.federation import run_federation

    sc = cell.scenario
    data = load_dataset(sc.dataset, resolve_data_root(data_root), max_train=sc.max_train, max_test=sc.max_test,
                        seed=sc.seed, seq_len=sc.seq_len)
    defense = DEFENSES.get(cell.defense.name)(**cell.defense.params)
    apply_budget(defense, sc, data_root)
    return run_federation(sc, data, defense, progress=on_round)


def preflight(suite: Suite, data_root: str | None) -> None:
    """Load-time checks for datasets and models that ask for them (`checked_at_load`): the data loads and
    the scenario's model builds on it (e.g. no sentence longer than the model's positions, weight files
    installed); a fault raises a one-line DataError / SpecError before any cell runs."""
    import json

    from bench.datasets import load_dataset, resolve_data_root
    from bench.models import build_model
    from bench.registry import DATASETS, MODELS
    from bench.scenario import SpecError

    root = resolve_data_root(data_root)
    seen = set()
    for sc in suite.scenarios:
        checked = (getattr(r.get(n), "checked_at_load", False) for r, n in ((DATASETS, sc.dataset), (MODELS, sc.model)))
        if not any(checked):
            continue
        key = (sc.dataset, sc.max_train, sc.max_test, sc.seed, sc.seq_len, sc.model,
               json.dumps(sc.model_params, sort_keys=True, default=str))
        if key in seen:
            continue
        seen.add(key)
        data = load_dataset(sc.dataset, root, max_train=sc.max_train, max_test=sc.max_test, seed=sc.seed,
                            seq_len=sc.seq_len)
        try:
            build_model(sc.model, data, **sc.model_params)
        except (TypeError, ValueError) as err:
            raise SpecError(f"scenario '{sc.name}': {one_line(err).split(': ', 1)[-1]}") from None


def failed(cell: Cell, err: BaseException, run=None) -> dict[str, Any]:
    """Record of a cell that raised: the one-line reason, and the run's metrics when the run itself finished."""
    if os.environ.get("LEAKBENCH_TRACEBACK"):
        traceback.print_exception(err)
    return _record(cell, "failed", one_line(err), _run_metrics(dict(run.metrics)) if run else {})


def run_group(cells: list[Cell], data_root: str | None, run_id: str | None = None,
              on_round: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Federate once for the group's scenario and defense, then score each attack cell.

    Every record carries the federated run's id in its environment (stored, kept out of the rendered
    results so they stay deterministic), so a group's rows can be seen to share one run."""
    run_id = run_id or new_run_id()
    for record in _group_records(cells, data_root, on_round):
        record["environment"] = {**record["environment"], "run_id": run_id}
        yield record


def _group_records(cells: list[Cell], data_root: str | None,
                   on_round: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    try:
        run = federate(cells[0], data_root, on_round)
    except Exception as err:  # recorded per cell and reported by the exit status, never hidden
        for cell in cells:
            yield failed(cell, err)
        return
    for cell in cells:
        try:
            yield score_cell(cell, run)
        except Exception as err:
            yield failed(cell, err, run)


def _group(cells: list[Cell]) -> list[list[Cell]]:
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.group_key, []).append(cell)
    return list(groups.values())


BEAT_S = 60.0   # how often the driver renews its claims on the groups in flight


def _store_group(job: Job, result: list[dict[str, Any]] | BaseException, fingerprint: str, store: Store,
                 tally: Callable[[str, str, str], None]) -> None:
    """Write a finished job's records; a job that raised becomes failed cells with its one-line reason,
    and a record computed by other code (a cluster node with another version) is refused the same way."""
    records = [failed(c, result) for c in job.cells] if isinstance(result, BaseException) else result
    for cell, record in zip(job.cells, records):
        theirs = record["environment"].get("fingerprint")
        if record["status"] != "failed" and theirs != fingerprint:
            record = failed(cell, RuntimeError(f"computed by other code (fingerprint {theirs}, here {fingerprint});"
                                               " install this leakbench on every worker"))
        record["environment"] = {**record["environment"], "run_id": job.run_id}
        store.put(record)
        tally(record["status"], cell.label, record["reason"])


def _drive(pending: list[list[Cell]], pool, data_root: str | None, store: Store, claims: Claims, fingerprint: str,
           force: bool, tally: Callable[[str, str, str], None], poll_s: float) -> None:
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
                elif not force and all(store.finished(c.cell_id, fingerprint) for c in cells):
                    claims.release(grp)
                    progressed = True
                    for c in cells:
                        tally("skipped", c.label, "")
                else:
                    inflight[grp] = Job(cells, new_run_id(), grp, data_root)
                    pool.submit(inflight[grp])
            if inflight:
                for job, result in pool.wait(BEAT_S):
                    _store_group(job, result, fingerprint, store, tally)
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


def run_suite(suite: Suite, out_dir: str | Path, data_root: str | None = None, workers: int | None = None,
              progress: Callable[..., Any] | None = None, force: bool = False, only: str | None = None,
              dry_run: bool = False, poll_s: float = 1.0, executor: str | Any | None = None,
              ray_address: str | None = None) -> RunSummary:
    """Run every group with a selected cell missing or stale, whole (its cells then share one federated
    run), each group claimed in the store so that concurrent runs into one --out compute it once.

    `executor` is a name (local, process, ray; None: local for one worker, process for more) or an
    executor object (bench/executors.py), which the caller then closes."""
    from bench.datasets import resolve_data_root
    from bench.version import code_fingerprint

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
    store = Store(out / "leakbench.sqlite")
    fingerprint = code_fingerprint()
    chosen = [c for c in suite.cells if selected(c, only)]
    states = {c.cell_id: ("forced" if force else store.state(c.cell_id, fingerprint)) for c in chosen}
    pending = [g for g in _group(chosen) if any(states[c.cell_id] != "done" for c in g)]
    stale = sum(states[c.cell_id] == "stale" for g in pending for c in g)
    skipped = len(chosen) - sum(len(g) for g in pending)
    if dry_run:
        store.close()
        rerun = {c.cell_id for g in pending for c in g}   # a done cell of a pending group reruns with it
        return RunSummary(0, 0, 0, skipped, stale, plan=tuple(
            (c.label, "group" if states[c.cell_id] == "done" and c.cell_id in rerun else states[c.cell_id])
            for c in chosen))
    try:   # started only when there is work: a local Ray costs seconds
        pool = make_executor(executor, workers, ray_address, on_round) if own and pending else executor
    except BaseException:
        store.close()
        raise
    store.set_membership(suite.name, [c.cell_id for c in suite.cells], suite.page_info())
    counts = {"ok": 0, "blocked": 0, "failed": 0, "skipped": skipped}
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
        _drive(pending, pool, root, store, claims, fingerprint, force, tally, poll_s)
    finally:
        claims.close()
        if bar:
            bar.close()
        store.close()
        if own and pool is not None:
            pool.close()
    return RunSummary(counts["ok"], counts["blocked"], counts["failed"], counts["skipped"], stale, tuple(failures))


__all__ = ["run_suite", "run_group", "score_cell", "preflight", "RunSummary"]
