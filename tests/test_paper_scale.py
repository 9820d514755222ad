"""The paper suites' CI slices: each built-in file itself, every scenario shrunk to one round, end to end.

Only scale knobs change: rounds, clients, local epochs, data subsets, attacked batches, attack steps and samples,
ResNet-18's channel width (8 instead of 64: same depth, blocks and parameter names, 1/60 of the
parameters), the FCN's hidden width, Paillier key sizes (512 bits, test-only) and slices, MaskCrypt's
Paillier union cap, and in selectiveshield-paper three defenses per scenario (the first two and the last);
data, models, partitions, devices, defense kinds and attacks stay those of the suite."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench.registry import SUITES
from bench.run.spec import parse_suite
from tests.conftest import run_every_cell

pytestmark = pytest.mark.usefixtures("small_kde")   # KDE MI on 200 entries: it scores every cell

SLICE = {"rounds": 1, "local_epochs": 1, "max_test": 64, "attack_repeats": 1}
# the FCN keeps twice the largest sliced batch (8) in its ReLU layer, which SPEAR reads row by row
MODEL_PARAMS = {"resnet18": {"width": 8}, "fcn": {"hidden": 16}}
ATTACK_PARAMS = {"inverting-gradients": {"steps": 2, "restarts": 1},
                 "spear": {"samples": 200, "rounds": 2, "prior_steps": 3}}   # sampling rounds and their size
DEFENSE_PARAMS = {"sensecrypt": {"key_bits": 512, "paillier_slice": 16},
                  "paillier-full": {"key_bits": 512, "paillier_slice": 16},
                  "maskcrypt-paillier": {"key_bits": 512, "union_cap": 0.002}}
SIZES = {"paper-scale": {"num_clients": 2, "clients_per_round": 2, "max_train": 240},
         "selectiveshield-paper": {"num_clients": 3, "clients_per_round": 3, "max_train": 300},
         "sensecrypt-paper": {}}
KEEP = {"selectiveshield-paper": 3}   # defenses kept per scenario: the first two and the last of its list


def paper_slice(suite: str, keep=lambda scenario: True):
    """The suite's TOML with only the scale knobs overridden, and the scenarios `keep` selects."""
    data = tomllib.loads(Path(SUITES.get(suite)).read_text())
    data["scenarios"] = [s for s in data["scenarios"] if keep(s)]
    data.pop("notes", None)   # they quote cells of the whole suite, which a slice leaves out
    for table in data["scenarios"]:
        table.update(SLICE | SIZES[suite])
        if table["num_clients"] == 20 and suite == "sensecrypt-paper":   # 5 categories x 2 clients, every tier kept
            table.update(num_clients=10, clients_per_round=10)
        if table["dataset"] != "digits":
            table["max_train"] = table.get("max_train") and min(table["max_train"], 40 * table["num_clients"]) \
                or 40 * table["num_clients"]
        if table.get("sampling") == "poisson":
            table["clients_per_round"] = table["num_clients"]
        if table["model"] in MODEL_PARAMS:
            table["model_params"] = MODEL_PARAMS[table["model"]]
        for name, params in table.get("defense_params", {}).items():
            params.update(DEFENSE_PARAMS.get(name, {}))
        table["attack_batch_size"] = min(table.get("attack_batch_size", 1), 8)
        if suite in KEEP and len(table.get("defenses", [])) > KEEP[suite]:
            table["defenses"] = table["defenses"][:KEEP[suite] - 1] + table["defenses"][-1:]
    for table in data["defenses"]:
        table["params"] = {**table.get("params", {}), **DEFENSE_PARAMS.get(table["name"], {})}
    seen = set()   # the slice's shared overrides can make two tables one setting: a suite refuses that twice
    data["defenses"] = [t for t in data["defenses"] if not (repr((t["name"], sorted(t["params"].items()),
                                                                  t.get("sweep"))) in seen
                                                            or seen.add(repr((t["name"], sorted(t["params"].items()),
                                                                              t.get("sweep")))))]
    kept = {s["name"] for s in data["scenarios"]}
    for table in data["attacks"]:
        table["params"] = {**table.get("params", {}), **ATTACK_PARAMS.get(table["name"], {})}
        if "scenarios" in table:   # an attack restricted to scenarios: those the slice keeps, or none of it
            table["scenarios"] = [s for s in table["scenarios"] if s in kept]
    data["attacks"] = [t for t in data["attacks"] if t.get("scenarios", True)]
    data["name"] = f"{suite}-slice"
    data.pop("figures", None)   # they name scenarios the slice leaves out, which a suite refuses at load
    data.pop("paper", None)
    return data, parse_suite(data, f"{suite} slice")


def run_slice(suite, tmp_path, data_root):
    records = run_every_cell(suite, tmp_path, data_root)
    for rec in records:
        assert rec["status"] in ("ok", "blocked"), (rec["scenario"], rec["defense"], rec["reason"])
        assert "accuracy" in rec["metrics"], rec["scenario"]
    return records


def test_full_suite_is_paper_scale():
    full = tomllib.loads(Path(SUITES.get("paper-scale")).read_text())
    assert {s["dataset"] for s in full["scenarios"]} == {"cifar10"} and {s["model"] for s in full["scenarios"]} == {"resnet18"}
    assert all(s["num_clients"] == 10 and "model_params" not in s for s in full["scenarios"])
    assert {s["attack_batch_size"] for s in full["scenarios"] if s["attacks"] == ["ilrg"]} == {32, 64}
    assert [s["attack_batch_size"] for s in full["scenarios"] if s["attacks"] == ["inverting-gradients"]] == [1]
    assert {d["name"] for d in full["defenses"]} == {"plaintext", "fedhe-full", "fedml-he", "maskcrypt",
                                                      "selectiveshield", "sensecrypt", "dictpfl", "dp-fedavg"}


def test_paper_scale_slice_runs_every_cell(tmp_path, data_root):
    _, suite = paper_slice("paper-scale")
    assert len(suite.cells) == 24
    for rec in run_slice(suite, tmp_path, data_root):
        assert "upload_bytes" in rec["metrics"] or "upload_bytes_extrapolated" in rec["metrics"], rec["defense"]
        if rec["status"] == "ok":
            privacy = {"ilrg": "leacc", "inverting-gradients": "psnr"}[rec["attack"]]
            assert privacy in rec["metrics"], (rec["scenario"], rec["defense"], sorted(rec["metrics"]))
        if rec["defense"] == "sensecrypt":
            assert rec["metrics"]["he_encrypt_extrapolated_s"] > 0 and "he_encrypt_s" not in rec["metrics"]


@pytest.mark.parametrize("kind", ["eps1", "alpha", "iid", "ilrg"])
def test_selectiveshield_paper_slice(tmp_path, data_root, kind):
    _, suite = paper_slice("selectiveshield-paper", lambda s: kind in s["name"])
    records = run_slice(suite, tmp_path, data_root)
    assert {r["scenario"] for r in records} == {c.scenario.name for c in suite.cells}
    assert all("enc_fraction" in r["metrics"] for r in records if r["defense"] == "selectiveshield")


@pytest.mark.parametrize("kind", ["fmnist-fcn", "cifar10-alexnet", "fig6-client-1", "fig6-client-9"])
def test_sensecrypt_paper_slice(tmp_path, data_root, kind):
    _, suite = paper_slice("sensecrypt-paper", lambda s: s["name"].startswith(kind) or s["name"].endswith(kind))
    records = run_slice(suite, tmp_path, data_root)
    for rec in records:
        if rec["defense"] in ("paillier-full", "sensecrypt"):   # sliced here (the suite slices paillier-full only)
            assert "round_time_max_extrapolated_s" in rec["metrics"] and "round_time_max_s" not in rec["metrics"]
        elif rec["defense"] == "maskcrypt-paillier":
            assert rec["metrics"]["round_time_max_s"] > 0
    if kind == "fig6-client-9":   # the device without HE encrypts nothing, so iLRG reads its whole head
        (rec,) = records
        assert rec["metrics"]["hidden_fraction"] == 0.0
