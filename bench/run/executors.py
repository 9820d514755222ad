"""Executors: where a (scenario, defense) group's federated run and attacks are computed.

The runner claims a group, submits it as a Job and stores the records that come back: the
driver alone writes the store, whatever the executor, so resume, skip and claims behave the
same everywhere. An executor only computes; a job that raises (a dead worker, a task Ray
could not run) comes back as the exception, and the runner records it as failed cells.

- `local`: in this process, one group at a time, with per-round progress.
- `process`: a pool of `workers` processes on this machine.
- `ray`: one Ray task per group, on a local Ray started here (num_cpus = workers when given) or
  on an existing cluster (`address`); at most `workers` groups in flight, else one per CPU.

The data root travels as a job argument (resolved on the driver), and so do the settings a run
keeps in its environment (--device; the HE pool size, 1 in a Ray task unless the driver sets one; the
torch threads, LEAKBENCH_THREADS, bench/run/threads.py: every core in the local executor, a share per
worker in a pool, one per Ray task unless the driver sets it). The numerical path's settings
(bench/run/numerics.py) are read when a worker first computes: a pool's workers inherit them, Ray's workers
start with them (its runtime environment).
Every Ray node must see the data root at the same path (a shared file system); a node where that
path does not exist falls back to its own $LEAKBENCH_DATA. Worker code must be the driver's: the
runner rejects records whose components (code, libraries, data) differ from the driver's.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.run.numerics import environment as numerics_env
from bench.run.threads import ENV as THREADS_ENV
from bench.run.threads import share_cores, threads_for

EXECUTORS = ("local", "process", "ray")
RAY_HINT = "pip install 'leakbench[ray]'"


class ExecutorError(ValueError):
    """An executor cannot start (Ray missing, a cluster out of reach, contradictory options)."""


@dataclass(frozen=True, eq=False)
class Job:
    """One group to compute: its cells, the federated run's id, the claim it is held under."""

    cells: list
    run_id: str
    group: str
    data_root: str | None = None
    where: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "where", f"{self.cells[0].scenario.name}/{self.cells[0].defense.label}")


Finished = tuple[Job, "list[dict[str, Any]] | BaseException"]


def compute(cells: list, data_root: str | None, run_id: str,
            on_round: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """A group's records (on_round hears "round r/R" where the job runs in the driver)."""
    from bench.run.cells import run_group

    return list(run_group(cells, data_root, run_id, on_round))


def _ray_compute(fn: Callable, cells: list, data_root: str | None, run_id: str,
                 env: dict[str, str]) -> list[dict[str, Any]]:
    """The Ray task, with the driver's settings, and its data root or this node's $LEAKBENCH_DATA where
    that path is absent."""
    os.environ.update(env)
    share_cores(1, cores=1)   # the task holds one CPU (or the driver's LEAKBENCH_THREADS)
    if data_root is not None and not Path(data_root).is_dir() and os.environ.get("LEAKBENCH_DATA"):
        data_root = os.environ["LEAKBENCH_DATA"]   # this node keeps the data elsewhere
    return fn(cells, data_root, run_id)


def _driver_env() -> dict[str, str]:
    """Settings a run keeps in its environment, all of them sent (a Ray worker serves many jobs): the
    device, the HE pool size, 1 unless set (a task holds one CPU; bench/crypto/parallel.py), and the torch
    threads where the driver sets them (an empty value: the task's one CPU)."""
    return {"LEAKBENCH_DEVICE": os.environ.get("LEAKBENCH_DEVICE") or "cpu",
            "LEAKBENCH_HE_WORKERS": os.environ.get("LEAKBENCH_HE_WORKERS") or "1",
            THREADS_ENV: os.environ.get(THREADS_ENV, "")}


class LocalExecutor:
    """Computes each job in this process when the runner waits for it."""

    def __init__(self, on_round: Callable[[Job, str], None] | None = None, fn: Callable = compute):
        self.slots, self._queue, self._on_round, self._fn = 1, [], on_round, fn
        self.threads = share_cores(1)

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def wait(self, timeout: float) -> list[Finished]:
        job = self._queue.pop(0)
        on_round = (lambda msg: self._on_round(job, msg)) if self._on_round else None
        try:
            return [(job, self._fn(job.cells, job.data_root, job.run_id, on_round))]
        except Exception as err:
            return [(job, err)]

    def close(self) -> None:
        self._queue.clear()


class ProcessExecutor:
    """A pool of worker processes on this machine, each with its share of the cores for torch (Ray
    does the same for its tasks), so that workers do not oversubscribe them. Workers are spawned, not
    forked: a fork inherits torch's and TenSEAL's thread pools dead (a driver that already ran a
    CKKS defense in process crashed its forked workers)."""

    def __init__(self, workers: int, fn: Callable = compute):
        self.slots, self._fn = workers, fn
        self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                            initializer=share_cores, initargs=(workers,))
        self._futures: dict[cf.Future, Job] = {}

    def submit(self, job: Job) -> None:
        try:
            fut = self._pool.submit(self._fn, job.cells, job.data_root, job.run_id)
        except Exception as err:   # a pool broken by an earlier dead worker takes nothing more
            fut = cf.Future()
            fut.set_exception(err)
        self._futures[fut] = job

    def wait(self, timeout: float) -> list[Finished]:
        done, _ = cf.wait(self._futures, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        out = []
        for fut in done:
            job = self._futures.pop(fut)
            err = fut.exception()
            out.append((job, err if err is not None else fut.result()))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    """One Ray task per job. Joins a Ray already initialized in this process (whatever its address) and
    leaves it running; a task whose worker dies is retried once (a group's records are deterministic)."""

    def __init__(self, workers: int | None = None, address: str | None = None, fn: Callable = compute):
        check_options("ray", workers, address)
        import ray

        self._ray, self._fn, self._refs = ray, fn, {}
        self._owner = not ray.is_initialized()
        if self._owner:
            try:
                local = address in (None, "local")
                ray.init(address=address, num_cpus=workers if local else None, include_dashboard=False,
                         log_to_driver=bool(os.environ.get("LEAKBENCH_TRACEBACK")), logging_level=logging.ERROR,
                         runtime_env={"env_vars": numerics_env()})
            except (ConnectionError, ValueError, RuntimeError) as err:
                where = f"--ray-address {address}" if address else "a local Ray"
                raise ExecutorError(f"cannot start {where}: {_first_line(err)}") from None
        self.slots = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(num_cpus=1, max_retries=1)(_ray_compute)
        self._env = _driver_env()

    def submit(self, job: Job) -> None:
        self._refs[self._task.remote(self._fn, job.cells, job.data_root, job.run_id, self._env)] = job

    def wait(self, timeout: float) -> list[Finished]:
        ray = self._ray
        ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
        out = []
        for ref in ready:
            job = self._refs.pop(ref)
            try:
                out.append((job, ray.get(ref)))
            except Exception as err:
                out.append((job, _task_error(err)))
        return out

    def close(self) -> None:
        for ref in self._refs:
            self._ray.cancel(ref, force=True)
        self._refs.clear()
        if self._owner:
            self._ray.shutdown()


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _task_error(err: BaseException) -> BaseException:
    """What the task raised, where Ray kept it (its own wrapper's first line is the task's name), else
    Ray's error (a dead worker, a lost node)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def check_address(address: str) -> None:
    """Fail in seconds where ray.init would wait minutes for a cluster that is not there."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ExecutorError(f"--ray-address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379) or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ExecutorError(f"--ray-address {address}: cannot reach {host}:{port} ({err.strerror or err}); start "
                            "the cluster with `ray start --head` or leave --ray-address out for a local Ray") from None


def check_options(kind: str | None, workers: int | None = None, address: str | None = None) -> str:
    """The executor a run asks for (None: local for one worker, a process pool for more), checked
    before anything runs; contradictory options and a missing Ray are one-line errors."""
    kind = kind or ("process" if (workers or 1) > 1 else "local")
    if kind not in EXECUTORS:
        raise ExecutorError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise ExecutorError(f"--workers must be >= 1, got {workers}; did you mean 1?")
    if address and kind != "ray":
        raise ExecutorError(f"--ray-address needs --executor ray, not {kind}; did you mean --executor ray?")
    if kind == "local" and (workers or 1) > 1:
        raise ExecutorError(f"--executor local runs one group at a time; for --workers {workers} use "
                            "--executor process or ray")
    threads_for(workers or 1)   # a bad LEAKBENCH_THREADS is a one-line error before anything runs
    if kind == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ExecutorError(f"--executor ray needs Ray, which is not installed: {RAY_HINT}") from None
        if address:
            check_address(address)
    return kind


def make_executor(kind: str | None, workers: int | None = None, address: str | None = None,
                  on_round: Callable[[Job, str], None] | None = None, fn: Callable = compute):
    kind = check_options(kind, workers, address)
    if kind == "local":
        return LocalExecutor(on_round, fn)
    if kind == "process":
        return ProcessExecutor(workers or 1, fn)
    return RayExecutor(workers, address, fn)
