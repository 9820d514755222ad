"""Chunk-parallel HE: long vectors are encrypted and decrypted on every core, in worker processes.

Why processes and not threads (measured on TenSEAL 0.3.18, N = 8192, 1e6 values, 2 cores):
TenSEAL's bindings hold the GIL for the whole of `ckks_vector(...)`, `serialize()` and `decrypt()`
(none of them uses pybind11's gil_scoped_release), so a thread pool ran 1.0x to 0.5x of serial.
The context's own thread pool (`ts.context(..., n_threads=...)`) serves only ckks_tensor and
vector-matrix products; encrypting one ckks_vector is one single-threaded SEAL call, so the
setting changes nothing here. Two worker processes encrypted 1e6 values 1.75x faster than one
thread; decryption, cheaper per byte moved, gained ~1.25x, still worth it for long vectors.

The chunking and every byte format are the serial path's: the same N/2-slot chunks, each one
`ts.ckks_vector(...).serialize()` in the same frame, in order, so a blob from either path is
interchangeable. (CKKS encryption is randomized and SEAL compresses its output, so two encryptions
of one chunk differ in bytes and by a few dozen bytes in length, serial or not.)

The pool is started lazily once per process with the forkserver start method (never fork: the
parent may hold torch's threads) and reused; workers keep each key's context cached. Its size
is `LEAKBENCH_HE_WORKERS`, else every core this process may run on; 1 keeps all work in-process.
A multiprocessing child (a `--workers N` cell process) always works in-process: its siblings hold
the other cores, and a pool nested in a pool worker hangs that worker's exit (measured with both
forkserver and spawn). Other executors (Ray) should set LEAKBENCH_HE_WORKERS=1 in their workers.
Decryption sends the secret context to the key holder's own child processes only.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from bench.crypto.clock import add_worker_cpu

WORKERS_ENV = "LEAKBENCH_HE_WORKERS"
MIN_PARALLEL_CHUNKS = 16   # below this a warm pool saves under a millisecond or two (measured break-even ~16 decrypts)
TASKS_PER_WORKER = 2       # a little slack for a core that another process is using

_pool: ProcessPoolExecutor | None = None
_pool_key: tuple[int, int] | None = None   # (pid that started it, its size)


def env_count(name: str) -> int | None:
    """A count set in the environment variable `name` (None when unset); a bad one is a one-line ValueError."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {raw!r}")
    return n


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def he_workers() -> int:
    """Worker processes for HE chunks: 1 in a multiprocessing child, else LEAKBENCH_HE_WORKERS, else the
    cores this process may use."""
    n = env_count(WORKERS_ENV)   # checked even in a child, so a bad value fails everywhere alike
    if multiprocessing.parent_process() is not None:
        return 1
    return n or usable_cores()


def _executor(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_key
    key = (os.getpid(), workers)
    if _pool is None or _pool_key != key:
        if _pool is not None and _pool_key[0] == os.getpid():
            _pool.shutdown(wait=False, cancel_futures=True)
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        _pool, _pool_key = ProcessPoolExecutor(max_workers=workers, mp_context=ctx), key
    return _pool


def _bounds(count: int, parts: int) -> list[tuple[int, int]]:
    cuts = [round(k * count / parts) for k in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _cpu_timed(fn: Callable[..., list], *args: Any) -> tuple[list, float]:
    """In a worker: the results and the CPU seconds this process spent computing them."""
    start = time.process_time()
    results = fn(*args)
    return results, time.process_time() - start


def map_chunks(fn: Callable[..., list], shared: tuple, items: Sequence[Any], workers: int | None = None) -> list:
    """`fn(*shared, start, items[a:b])` over contiguous groups of `items`, results concatenated in order.

    `fn` must be a module-level function returning one result per item; `start` is the group's first
    index (for error messages). Runs in-process when there is one worker or too few items to pay for
    the transfers; a pool whose worker died is dropped and the call redone in-process.
    """
    global _pool
    workers = he_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or multiprocessing.parent_process() is not None or len(items) < MIN_PARALLEL_CHUNKS:
        return fn(*shared, 0, list(items))
    pool = _executor(workers)
    groups = _bounds(len(items), workers * TASKS_PER_WORKER)
    try:
        futures = [pool.submit(_cpu_timed, fn, *shared, a, list(items[a:b])) for a, b in groups]
        done = [f.result() for f in futures]
        add_worker_cpu(sum(cpu for _, cpu in done))   # the work's CPU seconds, wherever it ran (bench/crypto/clock.py)
        return [r for results, _ in done for r in results]
    except BrokenProcessPool:
        _pool = None
        return fn(*shared, 0, list(items))
