"""Suite wall time with 2 workers vs 1: the process pool and Ray against the in-process executor.

Run with `pytest tests/benchmarks/test_bench_executors.py -m heavy` (CI: `-m heavy -k smoke`). All
three runs happen in one test, one after the other, each into a fresh --out, with one torch thread
per worker (the 1-worker run too), so the ratio measures groups running side by side. The Ray run
includes starting a local Ray. The three runs' results.json must agree apart from timing metrics.
Target on the `default` suite: >= 1.7x on 2 cores; the smoke variant (one group) only proves the
path works and records its numbers.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

from bench.cli import main
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from tests.test_reproducible import assert_same, comparable

POOLS = ("process", "ray")


def _wall(suite: str, out, **executor) -> float:
    start = time.perf_counter()
    summary = run_suite(load_suite(suite), out, **executor)
    elapsed = time.perf_counter() - start
    assert summary.failed == 0 and summary.skipped == 0, summary.failures
    return elapsed


def _measure(benchmark, suite: str, tmp_path) -> dict[str, float]:
    pytest.importorskip("ray")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = _wall(suite, tmp_path / "local", executor="local")
        two = {kind: _wall(suite, tmp_path / kind, executor=kind, workers=2) for kind in POOLS[:-1]}
        two[POOLS[-1]] = benchmark.pedantic(_wall, args=(suite, tmp_path / POOLS[-1]),
                                            kwargs={"executor": POOLS[-1], "workers": 2}, rounds=1, iterations=1)
    finally:
        torch.set_num_threads(threads)
    for kind in POOLS:   # and the same results, apart from timing metrics
        assert main(["leaderboard", "--out", str(tmp_path / kind)]) == 0
    assert main(["leaderboard", "--out", str(tmp_path / "local")]) == 0
    first = comparable(tmp_path / "local" / "results.json")
    for kind in POOLS:
        assert_same(first, comparable(tmp_path / kind / "results.json"))
    ratios = {kind: one / seconds for kind, seconds in two.items()}
    benchmark.extra_info.update({"suite": suite, "cpus": os.cpu_count(), "one_worker_s": one,
                                 **{f"{k}_2_workers_s": v for k, v in two.items()},
                                 **{f"{k}_speedup": v for k, v in ratios.items()}})
    print(f"\n{suite}: 1 worker {one:.1f}s, " + ", ".join(f"{k} x2 {two[k]:.1f}s ({ratios[k]:.2f}x)" for k in two))
    return ratios


@pytest.mark.heavy
def test_default_suite_two_workers_vs_one(benchmark, tmp_path):
    ratios = _measure(benchmark, "default", tmp_path)
    assert all(r >= 1.7 for r in ratios.values()), ratios


@pytest.mark.heavy
def test_executors_smoke(benchmark, tmp_path):
    ratios = _measure(benchmark, "smoke", tmp_path)
    assert all(r > 0 for r in ratios.values())
