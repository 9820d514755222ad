"""Budget matching: a matched defense's ciphertext bytes come to (a multiple of) the reference's."""
import os

import pytest

import defenses.shelora  # noqa: F401  (registers she-lora)
from bench.data.loading import load_dataset
from bench.federation.budget import _reference_bytes, apply_budget, parse_label
from bench.federation.engine import run_federation
from bench.federation.scenario import Scenario, SpecError
from bench.registry import DEFENSES
from bench.run.spec import parse_suite

SCENARIO = Scenario(name="t", dataset="sst2", model="gpt2-lora", model_params={"n_embd": 64, "n_layer": 1,
                    "n_head": 2, "lora_r": 32}, num_clients=2, clients_per_round=2, rounds=1, seq_len=12,
                    batch_size=12, lr=0.5, max_train=48, max_test=16)


@pytest.fixture(scope="module")
def root():
    root = os.environ.get("LEAKBENCH_DATA")
    if not root:
        pytest.skip("needs the data root: set LEAKBENCH_DATA (CI sets ../shared/data)")
    return root


def test_labels_parse_as_components_write_them():
    assert parse_label("she-lora(budget=0.003, rule=max)") == ("she-lora", {"budget": 0.003, "rule": "max"})
    assert parse_label("fedhe-full") == ("fedhe-full", {})
    with pytest.raises(ValueError, match="not registered"):
        parse_label("she-lorra(budget=0.1)")


@pytest.mark.parametrize("ratio", [0.5, 1])
def test_matched_maskcrypt_pays_the_reference_ciphertext_bytes(root, ratio):
    data = load_dataset("sst2", root, max_train=48, max_test=16, seed=0, seq_len=12)
    defense = DEFENSES.get("maskcrypt")(match_bytes="she-lora(budget=0.02)", bytes_ratio=ratio)
    target = apply_budget(defense, SCENARIO, root)
    reference = run_federation(SCENARIO, data, DEFENSES.get("she-lora")(budget=0.02)).metrics["ciphertext_bytes"]
    assert target == ratio * _reference_bytes(SCENARIO, "she-lora(budget=0.02)", root)   # the cached reference
    assert target == pytest.approx(ratio * reference, rel=1e-2)   # an independent run: SEAL's compressed sizes vary
    got = run_federation(SCENARIO, data, defense).metrics["ciphertext_bytes"]
    assert abs(got - target) <= 0.5 * defense.per_ciphertext * 1.01    # the nearest whole number of ciphertexts
    assert defense.rho == pytest.approx(defense.matched_cap / sum(defense.sizes))


def test_a_budget_above_full_encryption_encrypts_everything(root):
    data = load_dataset("sst2", root, max_train=48, max_test=16, seed=0, seq_len=12)
    defense = DEFENSES.get("maskcrypt")(match_bytes="she-lora(budget=0.02)", bytes_ratio=100)
    apply_budget(defense, SCENARIO, root)
    run = run_federation(SCENARIO, data, defense)
    assert defense.rho == 1.0 and run.metrics["encrypted_fraction"] == pytest.approx(1.0)


def test_a_bad_reference_fails_when_the_suite_loads():
    suite = {"name": "s", "scenarios": [{"name": "a", "dataset": "digits", "model": "mlp"}],
             "defenses": [{"name": "maskcrypt", "params": {"match_bytes": "nope(x=1)"}}], "attacks": [{"name": "idlg"}]}
    with pytest.raises(SpecError, match="not registered"):
        parse_suite(suite)
    suite["defenses"][0]["params"] = {"match_bytes": "fedhe-full", "rho": 0.1}
    with pytest.raises(SpecError, match="not both"):
        parse_suite(suite)
