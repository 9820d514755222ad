"""The clocks HE costs are read from: CPU seconds of the work, and wall seconds beside them.

A cost measured in wall seconds follows the machine's load: the same FedHE-Full cell gave encryption x2.2 and
decryption x1.9-2.9 with four busy processes beside it. CPU seconds do not: they count the seconds this process
(every thread of it) and its HE worker processes (bench/crypto/parallel.py reports what each chunk took there)
actually ran the work, whatever else runs. A cost is therefore read as CPU seconds, with the worker count it ran
with recorded, and wall seconds are kept as their own, labelled numbers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

_worker_cpu = 0.0   # CPU seconds HE worker processes spent on this process's chunks so far


@dataclass(frozen=True)
class Spent:
    """CPU and wall seconds: a reading of both clocks, or the difference of two."""

    cpu: float = 0.0
    wall: float = 0.0

    def __add__(self, other: "Spent") -> "Spent":
        return Spent(self.cpu + other.cpu, self.wall + other.wall)

    def __sub__(self, other: "Spent") -> "Spent":
        return Spent(self.cpu - other.cpu, self.wall - other.wall)


def now() -> Spent:
    """Both clocks: this process's CPU time plus its HE workers', and the wall clock."""
    return Spent(time.process_time() + _worker_cpu, time.perf_counter())


def since(start: Spent) -> Spent:
    return now() - start


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, Spent]:
    """(result, seconds spent) of one real call."""
    start = now()
    result = fn(*args)
    return result, since(start)


def add_worker_cpu(seconds: float) -> None:
    """CPU seconds a worker process spent on this process's behalf (bench/crypto/parallel.py)."""
    global _worker_cpu
    _worker_cpu += seconds
