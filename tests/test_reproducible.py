"""Two runs of the same suite and seed write the same results.json, apart from metrics marked timing (and each
record's digest, which covers them).

CKKS noise differs on every encryption; decrypted values are rounded to the crypto layer's grid, so
nothing downstream (Fisher masks, pruning, accuracy) sees it. The fast test runs the CKKS defenses
whose later rounds feed on decrypted aggregates; the heavy ones run the committed suites."""
from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.registry import METRICS

TIMING_DETAILS = ("clustering_s", "round_time")   # wall-clock values kept in a record's details


def comparable(path) -> list[dict]:
    timing = {e.name for e in METRICS.entries() if e.obj.timing}
    records = json.loads(path.read_text())
    for rec in records:
        rec["metrics"] = {k: v for k, v in rec["metrics"].items() if k not in timing}
        rec["environment"].pop("digest", None)   # it covers the timing values too
        for info in (rec.get("details") or {}).values():
            if isinstance(info, dict):
                for key in TIMING_DETAILS:
                    info.pop(key, None)
    return sorted(records, key=lambda r: r["cell_id"])


def run_twice(suite: str, tmp_path) -> tuple[list[dict], list[dict]]:
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["run", suite, "--out", str(out)]) == 0
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
    assert_same(*run_twice(suite, tmp_path))
