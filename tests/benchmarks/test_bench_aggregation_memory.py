"""Peak memory of a FedHE-Full round at 2 and 8 clients: the server folds each upload into a running aggregate,
so the peak must not grow with the number of clients (8 clients within 1.35x of 2).

Run with `pytest tests/benchmarks/test_bench_aggregation_memory.py -m heavy` (CI: `-m heavy -k smoke`). Each run
is a fresh subprocess (one HE process, one torch thread) whose peak resident set (ru_maxrss) is read at the end.
The heavy variant is the full ResNet-18 (11.2 M parameters, a 359 MB CKKS upload, as paper-scale's) on the
embedded digits data, so it needs no data root; about 2.5 minutes on 2 cores. The smoke variant (width 8: same
blocks and names, 1/60 of the parameters) only proves the measurement works.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND = 1.35
RUN = """
import json, resource, sys
from bench.data.loading import load_dataset
from bench.federation.engine import run_federation
from bench.federation.scenario import Scenario
from bench.registry import DEFENSES

clients, width = int(sys.argv[1]), int(sys.argv[2])
sc = Scenario(name="memory", dataset="digits", model="resnet18", model_params={"width": width}, num_clients=clients,
              clients_per_round=clients, rounds=1, max_train=16 * clients, max_test=16, batch_size=16,
              attack_batch_size=4)
data = load_dataset("digits", None, max_train=sc.max_train, max_test=sc.max_test)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
run = run_federation(sc, data, DEFENSES.get("fedhe-full")())
print(json.dumps({"peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "setup_peak_bytes": before,
                  "upload_bytes": run.metrics["upload_bytes"], "seconds": run.metrics["wall_s"]}))
"""


def _peak(clients: int, width: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LEAKBENCH_HE_WORKERS": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, str(clients), str(width)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure(benchmark, width: int) -> float:
    two = _peak(2, width)
    eight = benchmark.pedantic(_peak, args=(8, width), rounds=1, iterations=1)
    ratio = eight["peak_bytes"] / two["peak_bytes"]
    benchmark.extra_info.update({"model": f"resnet18(width={width})", "upload_bytes": two["upload_bytes"],
                                 "peak_2_clients_bytes": two["peak_bytes"], "peak_8_clients_bytes": eight["peak_bytes"],
                                 "setup_peak_bytes": two["setup_peak_bytes"], "ratio": ratio,
                                 "seconds_2": two["seconds"], "seconds_8": eight["seconds"]})
    print(f"\nresnet18 width {width}: upload {two['upload_bytes'] / 1e6:.1f} MB, peak 2 clients "
          f"{two['peak_bytes'] / 1e9:.2f} GB, 8 clients {eight['peak_bytes'] / 1e9:.2f} GB ({ratio:.3f}x)")
    return ratio


@pytest.mark.heavy
def test_fedhe_full_peak_memory_does_not_grow_with_clients(benchmark):
    assert _measure(benchmark, 64) <= BOUND


@pytest.mark.heavy
def test_fedhe_full_peak_memory_smoke(benchmark):
    assert _measure(benchmark, 8) <= BOUND
