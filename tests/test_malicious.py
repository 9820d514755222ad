"""The malicious server: the threat model as data, the model it sends reaching only the attacked client's round,
the defenses meeting it, and the imprint attack's numbers on plaintext and FedHE-Full."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from attacks.server.imprint import Imprint
from bench.data.loading import load_dataset, resolve_data_root
from bench.federation.engine import build_federation, run_federation
from bench.federation.scenario import SpecError
from bench.protocol.attack import Attack
from bench.protocol.contracts import check_attack
from bench.registry import ATTACKS, DEFENSES
from bench.run.cells import attacked_uploads, federate, run_group, score_cell
from bench.run.preflight import preflight
from tests.conftest import tiny_suite

BLOCK = "block.linear.weight"


class Probe(Imprint):
    """imprint that counts the models it is asked to modify."""

    calls: list = []

    def modify_model(self, model, knowledge):
        Probe.calls.append(knowledge.batch_size)
        return super().modify_model(model, knowledge)


class Copying(Imprint):
    """imprint on a copy of the model: the entries the server does not know stay NaN in it."""

    def modify_model(self, model, knowledge):
        return super().modify_model(copy.deepcopy(model), knowledge)


def _run(defense: str, modifiers=None, **scenario):
    cell = next(iter(tiny_suite([defense], ["no-attack"], **scenario).cells))
    sc = cell.scenario
    data = load_dataset(sc.dataset, resolve_data_root(None), max_train=sc.max_train, max_test=sc.max_test,
                        seed=sc.seed, seq_len=sc.seq_len)
    made = DEFENSES.get(defense)()
    fed = build_federation(sc, data, made)
    return fed, run_federation(sc, data, made, fed=fed, modifiers=modifiers)


ROUNDS = {"num_clients": 3, "clients_per_round": 2, "rounds": 3, "attack_round": 1, "attack_client": 1,
          "attack_batch_size": 4, "max_train": 150}


def test_the_modified_model_reaches_only_the_attacked_clients_round():
    """modify_model is called once (the attacked round); the federation's clients, rounds, aggregates and the
    honest uploads are those of a run without the malicious attack, and the modified upload is the attacked
    batch computed on the block the attack sent."""
    Probe.calls.clear()
    honest_fed, honest = _run("plaintext", **ROUNDS)
    fed, run = _run("plaintext", {"probe": Probe(bins=16)}, **ROUNDS)
    assert Probe.calls == [4]
    assert all(torch.equal(a, b) for a, b in zip(honest_fed.params().values(), fed.params().values()))
    assert honest.metrics["accuracy"] == run.metrics["accuracy"]
    for a, b in zip(honest.targets, run.targets):
        assert BLOCK not in b.view.values
        assert all(torch.equal(a.view.values[n], b.view.values[n]) for n in a.view.values)
    modified = run.modified["probe"]
    assert len(modified) == 1 and BLOCK in modified[0].view.values
    assert torch.equal(modified[0].truth.x, run.targets[0].truth.x)
    assert modified[0].knowledge.global_params[BLOCK].shape == (16, 64)


def test_a_passive_attack_never_sees_the_modified_model_and_every_record_has_its_threat_model():
    suite = tiny_suite(["plaintext"], ["idlg-extended", ("imprint", {"bins": 16})], attack_batch_size=4)
    cells = list(preflight(suite, None).cells)
    run = federate(cells[0], None, group=cells)
    passive, malicious = (next(c for c in cells if c.attack.name == n) for n in ("idlg-extended", "imprint"))
    seen = attacked_uploads(passive, ATTACKS.get("idlg-extended")(), run)
    assert seen is run.targets and all(BLOCK not in t.view.values for t in seen)
    assert BLOCK in attacked_uploads(malicious, ATTACKS.get("imprint")(bins=16), run)[0].view.values
    records = {r["attack"]: r for r in (score_cell(c, run) for c in cells)}
    assert records["idlg-extended"]["details"]["threat_model"] == "passive"
    assert records["imprint"]["details"]["threat_model"] == "malicious-model"
    assert records["imprint"]["status"] == "ok" and 0 < records["imprint"]["metrics"]["images_recovered"] <= 1
    shown = records["imprint"]["details"]["attack_info"][0]   # what the defense left of the planted block
    assert shown["block_hidden"] == 0.0 and shown["readable_rows"] == shown["rows"] == 16


def test_a_malicious_attack_on_a_model_it_cannot_modify_is_refused_at_load(data_root):
    suite = tiny_suite(["plaintext"], ["imprint"], dataset="sst2", model="gpt2-lora",
                       model_params={"n_embd": 32, "n_layer": 2, "n_head": 2}, max_train=32, max_test=48, seq_len=12)
    with pytest.raises(SpecError) as err:
        preflight(suite, data_root)
    text = str(err.value)
    assert "\n" not in text and "attack 'imprint' cannot run in it" in text and "cannot modify" in text


def test_a_malicious_attack_is_not_applicable_to_canary_trials():
    with pytest.raises(SpecError, match="canary trials of the honest model"):
        preflight(tiny_suite(["plaintext"], ["trap-weights"], model="mlp-tiny", attack_batch_size=2,
                             attack_repeats=2, canary="gradient"), None)


def test_the_threat_model_is_checked_against_the_hook():
    class Declared(Imprint):
        modify_model = Attack.modify_model   # the base hook: nothing modified

    class Passive(Imprint):
        threat_model = "passive"

    class Unknown(Imprint):
        threat_model = "evil"

    assert "does not override modify_model" in check_attack(Declared)
    assert "set threat_model = 'malicious-model'" in check_attack(Passive)
    assert "threat_model is 'evil'" in check_attack(Unknown)
    assert check_attack(Imprint) is None


def test_the_client_fills_in_what_the_server_does_not_know():
    """Under FedHE-Top2 the server no longer knows the head after round 0: imprint (which keeps the model's own
    tensors) still runs, the head arriving from the client; an attack that copies the model leaves NaN the
    client cannot fill, and only its exchange fails, with one line."""
    scenario = {**ROUNDS, "rounds": 2, "attack_round": 1}
    fed, run = _run("fedhe-top2", {"keeps": Imprint(bins=16), "copies": Copying(bins=16)}, **scenario)
    head = run.knowledge.head[0]
    assert torch.isnan(run.knowledge.global_params[head]).all()
    kept = run.modified["keeps"][0]
    assert torch.isnan(kept.knowledge.global_params["model." + head]).all()
    assert kept.view.visible[BLOCK].all()
    assert isinstance(run.modified["copies"], Exception) and "(NaN)" in str(run.modified["copies"])


SELECTION = [  # (defense, the attacked client's clear message of its selection, entries it describes)
    (("maskcrypt", {"rho": 0.05}), "mask proposal", lambda blob, n: len(blob) // 4 == max(1, round(0.05 * n))),
    (("selectiveshield", {"noise": False}), "sensitive mask", lambda blob, n: len(blob) == -(-n // 8)),
    (("sensecrypt", {"key_bits": 512, "ratio_cap": 0.05}), "sensitivity vector", lambda blob, n: len(blob) == 4 * n),
]


@pytest.mark.parametrize("defense,message,describes", SELECTION, ids=[d[0][0] for d in SELECTION])
def test_client_side_selection_runs_on_the_modified_model(defense, message, describes):
    """MaskCrypt's proposal, SelectiveShield's Fisher mask and SenseCrypt's sensitivity vector, as the attacked
    client sends them in the exchange, cover the modified model's entries (the block's 16 x 64 + 16 more)."""
    suite = tiny_suite([defense], [("imprint", {"bins": 16})], attack_batch_size=4)
    cells = list(preflight(suite, None).cells)
    run = federate(cells[0], None, group=cells)
    target = run.modified[cells[0].attack.label][0]
    total = sum(v.numel() for v in target.view.values.values())
    assert total == sum(v.numel() for v in run.targets[0].view.values.values()) + 16 * 64 + 16
    blob = next(v for k, v in target.view.meta.items() if k.endswith("/" + message))
    assert describes(blob, total)


@pytest.mark.parametrize("batch", [16, 64])
def test_imprint_recovers_most_digits_on_plaintext_and_fedhe_full_blocks_it(batch):
    records = {}
    for defense in ("plaintext", "fedhe-full"):
        suite = tiny_suite([defense], ["imprint"], attack_batch_size=batch, max_train=400, max_test=1000)
        records[defense] = next(run_group(list(preflight(suite, None).cells), None))
    plain, full = records["plaintext"], records["fedhe-full"]
    assert plain["status"] == "ok" and plain["metrics"]["images_recovered"] >= 0.75, plain["metrics"]
    assert full["status"] == "blocked" and full["reason"].startswith("blocked by design: the server view is empty")


def test_imprint_recovers_most_cifar10_images_at_batch_64(data_root):
    suite = tiny_suite(["plaintext"], ["imprint", "trap-weights"], dataset="cifar10", model="lenet5-relu",
                       attack_batch_size=64, max_train=400, max_test=1000)
    records = {r["attack"]: r for r in run_group(list(preflight(suite, data_root).cells), data_root)}
    assert records["imprint"]["metrics"]["images_recovered"] >= 0.8, records["imprint"]["metrics"]
    assert records["trap-weights"]["metrics"]["images_recovered"] > 0.2, records["trap-weights"]["metrics"]
    assert np.isfinite(records["imprint"]["metrics"]["psnr"])
