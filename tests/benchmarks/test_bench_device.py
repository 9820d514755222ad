"""cpu vs cuda vs auto, per workload: wall time of a suite slice on each device and whether the results agree.

Run on a GPU machine with `pytest tests/benchmarks/test_bench_device.py -m heavy -s` (about 3 minutes on an
H100); it prints one row per workload and writes the table to $LEAKBENCH_DEVICE_TABLE when that is set.
`auto` must never be slower than `cpu` beyond noise (bench/models/torch_device.py: the GPU for models of a
million parameters or more). The smoke variant (CI) runs one workload on cpu and auto, which is cpu on a
machine without a GPU, on the smoke suite's one cell, and proves the timing, comparison and table path.
"""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from bench.cli import main
from bench.models import torch_device
from tests.test_reproducible import comparable

# (workload, suite, --only): the slow GPU cells of the default suite, and the large ones where the GPU wins
WORKLOADS = (
    ("iDLG, sigmoid LeNet, B = 1", "default", "digits-lenet-b1/plaintext/idlg"),
    ("DLG, sigmoid LeNet, B = 1", "default", "digits-lenet-b1/plaintext/dlg"),
    ("iDLG after local DP training", "default", "digits-lenet-b1/dp-fedavg-local*/idlg"),
    ("iLRG, MLP, B = 8", "default", "digits-mlp-b8/plaintext/ilrg"),
    ("DAGER, GPT-2 d = 768, B = 4", "dager", "sst2-gpt2-b4/plaintext/*"),
)
SMOKE = ("iDLG, sigmoid LeNet, one round", "smoke", "digits-lenet-smoke/plaintext/idlg")
EXACT = ("label_acc", "label_f1", "rouge1", "exact_match", "accuracy")


def _timed(suite: str, only: str, device: str, out) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    assert main(["run", suite, "--out", str(out), "--only", only, "--device", device]) == 0
    return time.perf_counter() - start, comparable(out / "results.json")


def _agreement(first: list[dict], other: list[dict]) -> str:
    """'same' when every metric is equal; otherwise the exact metrics that differ, or the largest relative
    difference of the others (iterative reconstructions move by float reordering: torch_device.py)."""
    worst, exact = 0.0, set()
    for a, b in zip(first, other):
        for key, value in a["metrics"].items():
            other_value = b["metrics"].get(key)
            if value == other_value or not isinstance(value, (int, float)) or not isinstance(other_value, (int, float)):
                continue
            if key in EXACT:
                exact.add(key)
            worst = max(worst, abs(value - other_value) / max(abs(value), 1e-12))
    if exact:
        return "differs: " + ", ".join(sorted(exact))
    return "same" if worst == 0 else f"within {worst:.1%}"


def _table(workloads, devices, tmp_path, monkeypatch) -> list[dict]:
    rows = []
    for name, suite, only in workloads:
        row = {"workload": name}
        results = {}
        for device in devices:
            monkeypatch.setenv(torch_device.ENV, "cpu")   # the CLI sets it for the process
            row[device], results[device] = _timed(suite, only, device, tmp_path / f"{suite}-{len(rows)}-{device}")
        for device in devices[1:]:
            row[f"{device} vs cpu"] = _agreement(results["cpu"], results[device])
        rows.append(row)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    lines = [f"# cpu vs {' vs '.join(devices[1:])}: {time.strftime('%Y-%m-%d')}, {gpu}, {os.cpu_count()} CPU cores",
             "| workload | " + " | ".join(f"{d} s" for d in devices) + " | " +
             " | ".join(f"{d} vs cpu" for d in devices[1:]) + " |",
             "|---" * (2 * len(devices)) + "|"]
    for row in rows:
        lines.append(f"| {row['workload']} | " + " | ".join(f"{row[d]:.1f}" for d in devices) + " | " +
                     " | ".join(row[f"{d} vs cpu"] for d in devices[1:]) + " |")
    print("\n" + "\n".join(lines))
    if os.environ.get("LEAKBENCH_DEVICE_TABLE"):
        with open(os.environ["LEAKBENCH_DEVICE_TABLE"], "w") as fh:
            fh.write("\n".join(lines) + "\n\n" + json.dumps(rows, indent=1) + "\n")
    return rows


@pytest.mark.heavy
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_per_workload(tmp_path, monkeypatch):
    rows = _table(WORKLOADS, ("cpu", "cuda", "auto"), tmp_path, monkeypatch)
    for row in rows:   # auto never loses to the CPU beyond timing noise
        assert row["auto"] <= 1.2 * row["cpu"] + 2.0, row


@pytest.mark.heavy
def test_device_smoke(tmp_path, monkeypatch):
    rows = _table([SMOKE], ("cpu", "auto"), tmp_path, monkeypatch)
    assert rows[0]["auto vs cpu"] == "same" or torch.cuda.is_available(), rows
