"""End to end: every registered defense against every registered attack on a tiny scenario.

Every built-in defense and attack is listed (tests/test_registry.py checks it); installed plugins are not,
so these tests pass whatever plugins a machine has.
"""
import pytest

from bench.run.cells import run_group
from bench.run.preflight import preflight
from tests.conftest import tiny_suite

pytestmark = pytest.mark.usefixtures("small_kde")   # KDE MI on 200 entries: it scores every cell

GRID_DEFENSES = [
    ("plaintext", {}),
    ("fedhe-full", {}),
    ("fedml-he", {}),
    ("maskcrypt", {}),
    ("selective", {"rule": "random", "ratio": 0.2}),
    ("dp-fedavg", {"noise_multiplier": 1.0}),
    ("dp-fedavg-local", {"noise_multiplier": 1.0}),
    ("dp-sgd", {"noise_multiplier": 1.0}),
    ("selectiveshield", {"noise_multiplier": 1.0}),
    ("sensecrypt", {"key_bits": 512, "ratio_cap": 0.05}),
    ("sensecrypt-dp", {"key_bits": 512, "dp_epsilon": 100.0, "ratio_cap": 0.05}),
    ("paillier-full", {"key_bits": 512}),
    ("maskcrypt-paillier", {"key_bits": 512, "rho": 0.02}),
    ("dictpfl", {}),
    ("fedhe-top2", {}),
    ("base", {}),
    ("gaussian-noise", {"sigma": 1e-3}),
    ("gradient-pruning", {"p": 0.5}),
    ("she-lora", {"budget": 0.1}),
    ("flex-lora", {"sigma": 0.001}),
    ("secagg", {}),
]
LORA_ONLY = {"she-lora", "flex-lora"}   # defenses of LoRA adapters: the text track only
TEXT = {"dataset": "sst2", "model": "gpt2-lora", "model_params": {"n_embd": 32, "n_layer": 2, "n_head": 2},
        "max_train": 32, "max_test": 48, "seq_len": 12, "batch_size": 8, "lr": 0.05}
IMAGE_ATTACKS = [
    ("idlg", {"steps": 3}),
    ("dlg", {"steps": 3}),
    ("inverting-gradients", {"steps": 3, "restarts": 1}),
    ("fedavg-leakage", {"steps": 3, "label_samples": 8}),
    ("ilrg", {}),
    ("ilrg-guarded", {}),
    ("idlg-extended", {}),
    ("llg-plus", {"repeats": 1}),
    ("llg-plus-entries", {"repeats": 1}),
    ("random-guess", {}),
    ("no-attack", {}),
    ("mia-loss", {}),
    ("mia-lira", {"shadows": 2}),
    ("mia-rmia", {"references": 1, "population": 10}),
    ("mia-grad-cosine", {}),
    ("negotiation-labels", {}),
    ("imprint", {}),        # malicious server: each runs on the model it sent the attacked client
    ("trap-weights", {}),
]
TEXT_ATTACKS = [
    ("no-attack", {}),
    ("mia-loss", {}),
    ("mia-grad-cosine", {}),
    ("mia-zlib", {}),
    ("mia-lowercase", {}),
    ("mia-mink", {"k": 0.2}),
    ("mia-minkpp", {"k": 0.2}),
    ("mia-recall", {"shots": 1}),
    ("mia-pac", {"augmentations": 1}),
    ("mia-ref", {}),
    ("dager", {}),
]
CANARY_ATTACKS = [("audit-canary", {})]   # on canary trials (scenario canary = gradient / mislabeled)
ONE_RUN_ATTACKS = [("audit-one-run", {})]   # on one upload holding many canaries (scenario canary = one-run)
RELU_ATTACKS = [("spear", {"samples": 200, "rounds": 1, "prior_steps": 3}),   # need a linear layer followed by ReLU
                ("spear++", {"per_round": 8, "rounds": 1, "pairs": 0})]
GRID_ATTACKS = (IMAGE_ATTACKS + [a for a in TEXT_ATTACKS if a not in IMAGE_ATTACKS] + CANARY_ATTACKS + ONE_RUN_ATTACKS
                + RELU_ATTACKS)
MIA = {"mia_size": 10, "mia_aux": 30}  # membership candidates and auxiliary data for the mia-* attacks


def _check(records, attacks, defense):
    assert len(records) == len(attacks)
    for rec in records:
        assert rec["status"] in ("ok", "blocked"), rec["reason"]
        assert rec["metrics"]["upload_bytes"] > 0 or defense[0] == "base"   # base uploads nothing by definition
        if rec["status"] == "blocked":
            assert rec["reason"].startswith("blocked by design: ")


@pytest.mark.parametrize("defense", [d for d in GRID_DEFENSES if d[0] not in LORA_ONLY],
                         ids=[d for d, _ in GRID_DEFENSES if d not in LORA_ONLY])
def test_defense_runs_against_every_image_attack(defense):
    tiny = defense[0] in ("paillier-full",)  # per-value Paillier: a model small enough for seconds
    suite = tiny_suite([defense], IMAGE_ATTACKS, model="mlp-tiny" if tiny else "lenet5-sigmoid",
                       attack_batch_size=2, **MIA)
    preflight(suite, None)   # every attack applies to the scenario: what remains is the defense's doing
    _check(list(run_group(list(suite.cells), None)), IMAGE_ATTACKS, defense)


@pytest.mark.parametrize("defense", [d for d in GRID_DEFENSES if d[0] not in LORA_ONLY],
                         ids=[d for d, _ in GRID_DEFENSES if d not in LORA_ONLY])
def test_defense_runs_against_the_relu_layer_attacks(defense):
    suite = tiny_suite([defense], RELU_ATTACKS, model="mlp-tiny", attack_batch_size=2)
    preflight(suite, None)
    _check(list(run_group(list(suite.cells), None)), RELU_ATTACKS, defense)


@pytest.mark.parametrize("defense", GRID_DEFENSES, ids=[d for d, _ in GRID_DEFENSES])
def test_defense_runs_against_every_text_attack(defense, data_root):
    suite = tiny_suite([defense], TEXT_ATTACKS, attack_batch_size=2, **(TEXT | MIA))
    preflight(suite, data_root)
    _check(list(run_group(list(suite.cells), data_root)), TEXT_ATTACKS, defense)


@pytest.mark.parametrize("canary", ["gradient", "mislabeled", "one-run"])
@pytest.mark.parametrize("defense", [d for d in GRID_DEFENSES if d[0] not in LORA_ONLY],
                         ids=[d for d, _ in GRID_DEFENSES if d not in LORA_ONLY])
def test_defense_runs_against_the_canary_audit(defense, canary):
    attacks, setting = (ONE_RUN_ATTACKS, {"canaries": 64}) if canary == "one-run" else (CANARY_ATTACKS,
                                                                                         {"attack_repeats": 4})
    suite = tiny_suite([defense], attacks, model="mlp-tiny", attack_batch_size=2, canary=canary, **setting)
    if defense[0] == "dp-sgd" and canary != "mislabeled":   # these canaries skip its noisy training: n/a
        from bench.federation.scenario import SpecError
        with pytest.raises(SpecError, match="DP-SGD's noise never reaches it"):
            preflight(suite, None)
        return
    preflight(suite, None)
    _check(list(run_group(list(suite.cells), None)), attacks, defense)


# LoRA uploads after a round the clients decrypt: the server knows neither factor a client starts from, so DAGER
# reads the token set on grad A (attacks/dager/tokens.py) and grad B's path is blocked; r = 64 > the batch's tokens.
ROUND2 = TEXT | {"model_params": {"n_embd": 128, "n_layer": 2, "n_head": 2, "lora_r": 64}, "num_clients": 1,
                 "clients_per_round": 1, "rounds": 2, "attack_round": 1, "max_train": 16, "max_test": 8}


def test_dager_reads_the_token_set_of_a_second_round_she_lora_upload(data_root):
    attacks = [("dager", {"lora_path": "factor-a"}), ("dager", {"lora_path": "factor-b"})]
    suite = tiny_suite([("she-lora", {"budget": 0.05})], attacks, attack_batch_size=2, **ROUND2)
    preflight(suite, data_root)
    tokens, grad_b = run_group(list(suite.cells), data_root)
    assert tokens["status"] == "ok" and "rouge1" not in tokens["metrics"]   # a set of tokens, no sentences
    # the last token of each sentence predicts padding, so no loss reaches it: 5 of the batch's 7 tokens train
    assert tokens["metrics"]["token_precision"] == 1.0 and tokens["metrics"]["token_recall"] == pytest.approx(5 / 7)
    assert {i["stage"] for i in tokens["details"]["attack_info"]} == {"token set"}
    assert grad_b["status"] == "blocked" and "column space" in grad_b["reason"]
