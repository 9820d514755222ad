"""Sliced per-parameter Paillier (defenses/sensecrypt/slices.py): same training, extrapolated costs, hidden rest."""
from __future__ import annotations

import pytest

from bench.run.runner import run_suite
from bench.run.store import Store
from tests.conftest import tiny_suite

SCENARIO = {"model": "mlp-tiny", "model_params": {"hidden": 4}, "num_clients": 4, "clients_per_round": 4,
            "rounds": 2, "partition": "k-classes", "classes_per_client": 5, "max_train": 200, "attack_batch_size": 8}


def _records(tmp_path, defenses, **scenario):
    suite = tiny_suite(defenses, ["ilrg"], **(SCENARIO | scenario))
    summary = run_suite(suite, tmp_path)
    assert summary.failed == 0, summary.failures
    store = Store(tmp_path / "leakbench.sqlite")
    records = {(r["defense"], r["defense_params"].get("paillier_slice", 0)): r for r in store.records(suite.name)}
    store.close()
    return records


@pytest.mark.parametrize("name", ["paillier-full", "sensecrypt"])
def test_slice_trains_the_same_model_and_reports_only_extrapolated_costs(tmp_path, name):
    whole, sliced = {"key_bits": 512}, {"key_bits": 512, "paillier_slice": 5}
    recs = _records(tmp_path, [(name, whole), (name, sliced)])
    full, part = recs[(name, 0)], recs[(name, 5)]
    assert part["metrics"]["accuracy"] == pytest.approx(full["metrics"]["accuracy"], abs=1e-9)
    assert (part["status"], part["metrics"].get("lnacc")) == (full["status"], full["metrics"].get("lnacc"))  # same view
    for key in ("he_encrypt_s", "he_decrypt_s", "ciphertext_bytes", "upload_bytes", "round_time_max_s"):
        assert key in full["metrics"] and key not in part["metrics"], key
    for key in ("he_encrypt_extrapolated_s", "he_aggregate_extrapolated_s", "he_decrypt_extrapolated_s",
                "ciphertext_bytes_extrapolated", "round_time_max_extrapolated_s", "encrypted_fraction_extrapolated"):
        assert part["metrics"][key] > 0, key
    # Paillier ciphertexts have a fixed width: the extrapolated bytes are the whole run's to within the framing
    assert part["metrics"]["ciphertext_bytes_extrapolated"] == pytest.approx(full["metrics"]["ciphertext_bytes"],
                                                                             rel=0.05)
    detail = part["details"]["paillier_slice"]
    assert detail["slice"] == 5 and detail["max_decryption_error"] < 1e-6


def test_a_device_without_he_budget_encrypts_nothing(tmp_path):
    recs = _records(tmp_path, [("sensecrypt", {"key_bits": 512, "budget_scope": "all"})], num_clients=9,
                    clients_per_round=9, partition="iid", rounds=1, devices="sensecrypt-fig6", attack_client=8)
    rec = recs[("sensecrypt", 0)]
    masks = {m["client"]: m for m in rec["details"]["sensecrypt"]["masks"]}
    assert masks["client-8"]["fraction"] == 0.0 and masks["client-0"]["fraction"] > 0
    assert rec["metrics"]["lnacc"] is not None
