"""Two runs of the same suite and seed write the same results.json, apart from metrics marked timing (and each
record's digest, which covers them).

CKKS noise differs on every encryption; decrypted values are rounded to the crypto layer's grid, so
nothing downstream (Fisher masks, pruning, accuracy) sees it. The fast test runs the CKKS defenses
whose later rounds feed on decrypted aggregates; the heavy ones run the committed suites (CI runs the default suite
and a slice of selectiveshield-paper: `make trust`)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.cli import main
from bench.crypto.parallel import usable_cores
from bench.registry import METRICS

# wall-clock values kept in a record's details; a Paillier slice's seconds per value (details.paillier_slice.per_value
# of paillier-full and SenseCrypt with paillier_slice) are keyed by the HE step alone
TIMING_DETAILS = ("clustering_s", "round_time", "seconds", "he_encrypt", "he_decrypt", "he_aggregate")
EXECUTION_DETAILS = ("he_clock",)   # how HE time was clocked: worker and thread counts differ between executors


def drop_timing(value) -> None:
    """Removes wall-clock entries at any depth (a defense's per-upload encryption times sit in lists)."""
    if isinstance(value, dict):
        for key in TIMING_DETAILS:
            value.pop(key, None)
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            drop_timing(item)


def comparable(path) -> list[dict]:
    timing = {e.name for e in METRICS.entries() if e.obj.timing}
    records = json.loads(path.read_text())
    for rec in records:
        rec["metrics"] = {k: v for k, v in rec["metrics"].items() if k not in timing}
        for key in EXECUTION_DETAILS:
            (rec.get("details") or {}).pop(key, None)
        rec["environment"].pop("digest", None)   # it covers the timing values too
        rec["environment"].pop("threads", None)  # torch's threads: a pool or Ray worker holds one CPU
        drop_timing(rec.get("details"))
    return sorted(records, key=lambda r: r["cell_id"])


def run_twice(suite: str, tmp_path, only: list[str] | None = None, first: Path | None = None,
              workers: int | None = None) -> tuple[list[dict], list[dict]]:
    """Two runs of the suite (its `only` cells); `first`: a finished run of the same suite to stand for the first,
    computed with the same `workers` (the thread count a group gets decides its last bits)."""
    outs = [first or tmp_path / "a", tmp_path / "b"]
    for out in outs[1:] if first else outs:
        assert main(["run", suite, "--out", str(out), *(["--only", *only] if only else []),
                     *(["--workers", str(workers)] if workers else [])]) == 0
    return comparable(outs[0] / "results.json"), comparable(outs[1] / "results.json")


def assert_same(first: list[dict], second: list[dict]) -> None:
    assert [r["cell_id"] for r in first] == [r["cell_id"] for r in second]
    for a, b in zip(first, second):
        assert a == b, f"{a['scenario']} / {a['defense']} / {a['attack']} differs between runs"


SUITE = """
name = "repro"
[[scenarios]]
name = "digits-mlp"
dataset = "digits"
model = "mlp"
num_clients = 4
clients_per_round = 3
partition = "dirichlet"
alpha = 0.5
rounds = 3
max_train = 300
max_test = 100
attack_round = 2
attack_batch_size = 8
[[defenses]]
name = "selectiveshield"
params = { noise_multiplier = 1.0 }
[[defenses]]
name = "maskcrypt"
params = { random_mask = true }
[[defenses]]
name = "fedml-he"
[[defenses]]
name = "dictpfl"
[[attacks]]
name = "ilrg"
"""


def test_ckks_defenses_reproduce_over_rounds(tmp_path):
    suite = tmp_path / "repro.toml"
    suite.write_text(SUITE)
    first, second = run_twice(str(suite), tmp_path)
    assert len(first) == 4 and all(r["status"] in ("ok", "blocked") for r in first), [r["reason"] for r in first]
    assert all(0.0 < r["metrics"]["accuracy"] <= 1.0 for r in first)
    assert_same(first, second)


@pytest.mark.heavy
@pytest.mark.parametrize("suite", ["default", "selectiveshield-paper"])
def test_committed_suite_reproduces(suite, tmp_path):
    """LEAKBENCH_FIRST_RUN_DEFAULT: an output folder of `leakbench run default` (CI's `make demo`) that stands for the
    first run of the default suite, so CI computes it twice, not three times. Both runs as `make demo` runs: one
    worker per core, one torch thread each."""
    first = os.environ.get("LEAKBENCH_FIRST_RUN_DEFAULT") if suite == "default" else None
    assert_same(*run_twice(suite, tmp_path, first=Path(first) if first else None, workers=usable_cores()))


# One cheap cell of a paper suite: SelectiveShield (noise off) on MNIST's MLP, one round of 20 clients, iLRG on
# three batches of 32 (tables 4-5); its Fisher masks and zones come from training, its encrypted zone from CKKS.
PAPER_SLICE = ("selectiveshield-paper", ["mnist-mlp-ilrg/selectiveshield(noise=False, rho=0.5, tau=0.1)/ilrg"])


@pytest.mark.heavy
def test_a_slice_of_a_paper_suite_reproduces(tmp_path):
    first, second = run_twice(PAPER_SLICE[0], tmp_path, only=PAPER_SLICE[1])
    assert len(first) == 1 and first[0]["status"] == "ok", [r["reason"] for r in first]
    assert_same(first, second)
