"""The paper-scale suite's CI slice: the built-in file itself, shrunk to one round of two clients, end to end.

Only scale knobs change: rounds, clients, local epochs, data subsets, attacked batches, attack steps, and
ResNet-18's channel width (8 instead of 64: same depth, blocks and parameter names, 1/60 of the parameters,
so the HE defenses encrypt ~175K values instead of 11.2M)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from bench.registry import SUITES
from bench.run.runner import run_suite
from bench.run.spec import parse_suite
from bench.run.store import Store

SLICE = {"rounds": 1, "num_clients": 2, "clients_per_round": 2, "local_epochs": 1, "max_train": 240, "max_test": 64,
         "attack_repeats": 1, "model_params": {"width": 8}}
ATTACK_PARAMS = {"inverting-gradients": {"steps": 2, "restarts": 1}}


def paper_scale_slice():
    """paper-scale.toml with only the scale knobs overridden: same data, model, defenses and attacks."""
    data = tomllib.loads(Path(SUITES.get("paper-scale")).read_text())
    for table in data["scenarios"]:
        table.update(SLICE)
    for table in data["attacks"]:
        table["params"] = {**table.get("params", {}), **ATTACK_PARAMS.get(table["name"], {})}
    data["name"] = "paper-scale-slice"
    return data, parse_suite(data, "paper-scale slice")


def test_full_suite_is_paper_scale():
    data, _ = paper_scale_slice()
    full = tomllib.loads(Path(SUITES.get("paper-scale")).read_text())
    assert {s["dataset"] for s in full["scenarios"]} == {"cifar10"} and {s["model"] for s in full["scenarios"]} == {"resnet18"}
    assert all(s["num_clients"] == 10 and "model_params" not in s for s in full["scenarios"])
    assert {s["attack_batch_size"] for s in full["scenarios"] if s["attacks"] == ["ilrg"]} == {32, 64}
    assert [s["attack_batch_size"] for s in full["scenarios"] if s["attacks"] == ["inverting-gradients"]] == [1]
    assert {d["name"] for d in full["defenses"]} == {"fedhe-full", "fedml-he", "maskcrypt", "selectiveshield",
                                                      "dp-fedavg"}


def test_one_round_two_client_slice_runs_every_cell(tmp_path, data_root):
    _, suite = paper_scale_slice()
    assert len(suite.cells) == 15
    summary = run_suite(suite, tmp_path, data_root=data_root)
    assert summary.failed == 0, summary.failures
    store = Store(tmp_path / "leakbench.sqlite")
    records = store.records(suite.name)
    store.close()
    assert len(records) == len(suite.cells)
    for rec in records:
        assert rec["status"] in ("ok", "blocked"), (rec["scenario"], rec["defense"], rec["reason"])
        assert "accuracy" in rec["metrics"] and "upload_bytes" in rec["metrics"], rec["scenario"]
        if rec["status"] == "ok":
            privacy = {"ilrg": "leacc", "inverting-gradients": "psnr"}[rec["attack"]]
            assert privacy in rec["metrics"], (rec["scenario"], rec["defense"], sorted(rec["metrics"]))
