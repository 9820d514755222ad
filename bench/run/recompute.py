"""One row recomputed for `leakbench verify` (bench/run/verify.py), in a spawned worker or in process: its whole
federated run at the torch thread count its records state, and the machine that did it, as a report names it.
"""
from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from bench.run.spec import Cell

PINNING = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")   # stated with the machine


def recompute_row(group: list[Cell], scored: list[Cell], data_root: str | None, threads: Any
                  ) -> tuple[list[dict[str, Any]], int, float]:
    """One row's fresh records of the `scored` cells (its whole federated run, the other cells of the row taking
    part), the torch threads it used and its seconds; module level, so a spawned worker can run it."""
    from bench.run.cells import run_group

    with _threads(threads):
        clock = time.perf_counter()
        fresh = list(run_group(group, data_root, scored=scored))
        return fresh, torch.get_num_threads(), time.perf_counter() - clock


def machine() -> str:
    """This machine as a page names the one that reproduced a cell: platform, CPU, cores, torch, the settings that
    pin its numerical path where set."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    pinned = [f"{k}={os.environ[k]}" for k in PINNING if os.environ.get(k)]
    return ", ".join([platform.platform(), cpu, f"{os.cpu_count()} CPUs", f"torch {torch.__version__}", *pinned])


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
