"""The numerical path (bench/run/numerics.py): pinned before torch computes, recorded in every record, and a cell
computed with another thread count agrees within a stated tolerance."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.run import numerics
from bench.run.version import ROOT

# computed in a fresh process: the settings are read when torch first computes
CELL = """
import json, sys
from bench.run.cells import run_group
from bench.run.spec import parse_suite
from bench.run.threads import share_cores
share_cores(1)   # LEAKBENCH_THREADS, as every executor sets it
suite = parse_suite({"name": "threads", "scenarios": [{"name": "digits-lenet", "dataset": "digits",
    "model": "lenet5-relu", "num_clients": 2, "clients_per_round": 2, "rounds": 2, "local_epochs": 1,
    "max_train": 160, "max_test": 100, "attack_batch_size": 8, "seed": 0}],
    "defenses": [{"name": "plaintext"}], "attacks": [{"name": "idlg-extended"}]})
(rec,) = run_group(list(suite.cells), None)
print(json.dumps({"metrics": rec["metrics"], "schema": rec["details"]["metric_schema"],
                  "environment": rec["environment"]}))
"""


def _compute(threads: int, **env) -> dict:
    """The cell's record in a fresh process with `threads` torch threads."""
    inherited = {k: v for k, v in os.environ.items() if k not in numerics.PINNED}   # the child pins its own
    run = subprocess.run([sys.executable, "-c", CELL], capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**inherited, "LEAKBENCH_THREADS": str(threads), "PYTHONPATH": str(ROOT), **env})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _agree(a: dict, b: dict) -> list[str]:
    """Where two records of one cell disagree beyond the tolerance: an accuracy within one test sample, a whole
    number or a label metric exactly, any other real value within 1e-3 relative (1e-6 absolute); timings are not
    compared."""
    out = []
    for name, schema in a["schema"].items():
        x, y = a["metrics"].get(name), b["metrics"].get(name)
        if schema.get("timing") or not all(isinstance(v, (int, float)) for v in (x, y)):
            continue
        if name == "accuracy":
            ok = abs(x - y) <= 1 / a["metrics"]["test_samples"] + 1e-12
        elif schema.get("unit") == "B" or str(schema.get("fmt", "")).endswith(".0f}"):
            ok = x == y
        else:
            ok = abs(x - y) <= max(1e-6, 1e-3 * max(abs(x), abs(y)))
        if not ok:
            out.append(f"{name}: {x} with {a['environment']['threads']} thread(s), {y} with "
                       f"{b['environment']['threads']}")
    return out


@pytest.fixture(scope="module")
def one_thread() -> dict:
    return _compute(1)


def test_a_cell_computed_with_one_and_with_two_threads_agrees_within_the_tolerance(one_thread):
    """Torch splits its parallel reductions by the thread count, so bits may differ; the numbers a page shows may
    not differ by more than the tolerance (`_agree`)."""
    one, two = one_thread, _compute(2)
    assert (one["environment"]["threads"], two["environment"]["threads"]) == (1, 2)
    assert one["environment"]["components"] == two["environment"]["components"]   # the same cell, the same code
    assert {"accuracy", "label_acc", "kde_mi"} <= set(one["metrics"])
    assert _agree(one, two) == []


def test_the_tolerance_catches_a_difference_of_two_test_samples():
    a = {"metrics": {"accuracy": 0.50, "test_samples": 100, "kde_mi": 0.3}, "environment": {"threads": 1},
         "schema": {"accuracy": {"unit": ""}, "test_samples": {"fmt": "{:.0f}"}, "kde_mi": {"unit": "nats"}}}
    b = {**a, "metrics": {"accuracy": 0.52, "test_samples": 100, "kde_mi": 0.3004}, "environment": {"threads": 2}}
    assert [d.split(":")[0] for d in _agree(a, b)] == ["accuracy", "kde_mi"]
    b["metrics"] = {"accuracy": 0.51, "test_samples": 100, "kde_mi": 0.30002}
    assert _agree(a, b) == []


def test_the_path_is_pinned_before_torch_computes_and_recorded(one_thread):
    env = one_thread["environment"]
    variables = env["numerics"]["variables"]
    assert {k: variables[k] for k in numerics.PINNED} == numerics.PINNED
    assert env["numerics"]["capability"] == "AVX2"
    assert env["cpu"]["model"] and env["torch_build"]["torch"] == env["libraries"]["torch"]
    assert env["torch_build"]["blas"] and env["torch_build"]["onednn"]


def test_pin_keeps_what_is_set_and_leaves_native_alone(monkeypatch):
    for name in numerics.PINNED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    numerics.pin()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default" and os.environ["MKL_CBWR"] == "AVX2,STRICT"
    for name in numerics.PINNED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(numerics.ENV, "native")
    numerics.pin()
    assert not any(name in os.environ for name in numerics.PINNED)


@pytest.mark.heavy
@pytest.mark.skipif("avx2" not in numerics.cpu()["vector"], reason="an x86-64 CPU with AVX2")
def test_the_pinned_path_is_the_path_a_cpu_without_avx512_takes(one_thread):
    """What a machine without AVX-512 computes, emulated here by capping every library at AVX2, is what this
    machine computes pinned: the same record, bit for bit."""
    pinned = one_thread
    avx2 = _compute(1, LEAKBENCH_NUMERICS="native", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                    ONEDNN_MAX_CPU_ISA="AVX2", MKL_CBWR="AVX2,STRICT")
    timing = {k for k, v in pinned["schema"].items() if v.get("timing")}
    assert {k: v for k, v in pinned["metrics"].items() if k not in timing} == \
        {k: v for k, v in avx2["metrics"].items() if k not in timing}


def test_bfloat16_is_emulated_on_the_pinned_path_and_dager_pretests_in_float32():
    """The pinned path caps oneDNN at AVX2, below the bfloat16 instructions: DAGER's bfloat16 pre-test would cost
    tens of times float32's products, so it runs in float32 (attacks/dager/arch.py)."""
    import torch

    from bench.models.torch_device import native_bfloat16

    assert os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2"   # this process was pinned (bench/__init__.py)
    assert native_bfloat16(torch.device("cpu")) is False
