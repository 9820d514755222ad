"""KDE mutual information on a 20,000-value update: the target is well under a second per call.

Run with `pytest tests/benchmarks/test_bench_kde_mi.py -m heavy` (CI runs it as part of `-k smoke`).
The median of several rounds is asserted, so one slow call on a loaded machine does not decide it.
"""
from __future__ import annotations

import numpy as np
import pytest

from metrics.leakage import kde_mutual_information

TARGET_S = 1.0


@pytest.mark.heavy
def test_kde_mi_smoke(benchmark):
    x = np.random.default_rng(1).normal(size=20_000)
    s = x + 0.5 * np.random.default_rng(2).normal(size=x.size)
    value = benchmark.pedantic(kde_mutual_information, args=(x, s), kwargs={"seed": 5}, rounds=5, iterations=1)
    benchmark.extra_info.update({"values": x.size, "mi": value, "target_s": TARGET_S})
    assert value > 0.0
    assert benchmark.stats.stats.median < TARGET_S, f"median {benchmark.stats.stats.median:.2f}s per call"
