"""Cost meter: the CPU and wall seconds of real library calls, accumulated per named cost (bench/crypto/clock.py)."""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

from bench.crypto.clock import Spent, now, since


class CostMeter:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)   # CPU seconds
        self.walls: dict[str, float] = defaultdict(float)    # wall seconds
        self.counts: dict[str, int] = defaultdict(int)

    @contextmanager
    def time(self, key: str) -> Iterator[None]:
        start = now()
        try:
            yield
        finally:
            self.charge(key, since(start))

    def charge(self, key: str, spent: Spent) -> None:
        """One call's seconds, possibly measured in pieces (a sum folded upload by upload)."""
        self.totals[key] += spent.cpu
        self.walls[key] += spent.wall
        self.counts[key] += 1

    def mean(self, key: str) -> float:
        """Mean CPU seconds per timed call (e.g. per client upload), 0 when never timed."""
        return self.totals[key] / self.counts[key] if self.counts.get(key) else 0.0

    def mean_wall(self, key: str) -> float:
        """Mean wall seconds per timed call, 0 when never timed."""
        return self.walls[key] / self.counts[key] if self.counts.get(key) else 0.0
