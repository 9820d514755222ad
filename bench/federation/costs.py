"""Cost meter: wall time of real library calls, accumulated per named cost."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


class CostMeter:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    @contextmanager
    def time(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[key] += time.perf_counter() - start
            self.counts[key] += 1

    def charge(self, key: str, seconds: float) -> None:
        """One call's seconds measured in pieces (a sum folded upload by upload)."""
        self.totals[key] += seconds
        self.counts[key] += 1

    def mean(self, key: str) -> float:
        """Mean seconds per timed call (e.g. per client upload), 0 when never timed."""
        return self.totals[key] / self.counts[key] if self.counts.get(key) else 0.0
