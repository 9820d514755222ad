"""DictPFL: an empty server view, exact encrypted FedAvg of the tables, the DePE identity at start,
TIP/HRC dynamics, ciphertexts that shrink with pruning; FedHE-Top2's plaintext layers leak."""
import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.data.loading import load_dataset
from bench.federation.engine import build_federation, local_update, run_federation
from bench.federation.scenario import Scenario
from bench.models import build_model, classifier_head, update_names
from bench.models.losses import TASKS
from bench.models.pretrain import pretrain
from bench.protocol.evidence import metric, run_value
from bench.protocol.view import hidden_leak_free
from bench.registry import ATTACKS, METRICS
from bench.run.cells import federate, run_group
from bench.run.spec import parse_suite
from defenses.dictpfl import DictPFL, FedHETop2, PrME, _svd_dictionary
from metrics.images import score_images
from tests.conftest import weighted_uploads

if "pruned_fraction" not in METRICS:
    metric("pruned_fraction", "", None, "cost", "mean fraction of update entries left off the wire per round "
           "(DictPFL's encryption-aware pruning)", fmt="{:.3f}", per_target=False)(run_value("pruned_fraction"))

DIGITS = {"dataset": "digits", "model": "mlp", "num_clients": 2, "clients_per_round": 2, "rounds": 1,
          "max_train": 200, "max_test": 60, "public_fraction": 0.2, "pretrain_epochs": 1}


def _suite(defenses, attacks, **scenario):
    return parse_suite({"name": "dictpfl-test", "scenarios": [{"name": "digits-mlp", **DIGITS, **scenario}],
                        "defenses": [{"name": n, "params": p} for n, p in defenses],
                        "attacks": [{"name": n, "params": p} for n, p in attacks]})


def _fed(defense, **kw):
    sc = Scenario(name="dictpfl", **{**DIGITS, **kw})
    return build_federation(sc, load_dataset("digits", None, max_train=sc.max_train, max_test=sc.max_test),
                            defense)


def _round(fed, defense, round):
    """One protocol round by hand: local deltas, uploads, HE sum, client-side decode."""
    fed.round = round
    gen = torch.Generator().manual_seed(round)
    updates = {c.name: local_update(fed, c, c.x, c.y, "delta", gen) for c in fed.clients}
    defense.round_start(fed, round, fed.clients, updates)
    uploads = weighted_uploads(fed, defense, updates, round)
    aggregate = defense.aggregate(fed, uploads, fed.parties["server"])
    return defense.decode(fed, aggregate, defense.decoder(fed)), updates, uploads


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_server_view_is_empty_and_idlg_blocked_by_design(seed):
    records = list(run_group(list(_suite([("dictpfl", {})], [("idlg", {"steps": 5})], seed=seed,
                                         attack_repeats=2).cells), None))
    assert records[0]["status"] == "blocked" and records[0]["reason"].startswith("blocked by design: ")
    assert records[0]["metrics"]["upload_bytes"] > 0
    run = federate(_suite([("dictpfl", {})], [("idlg", {})], seed=seed).cells[0], None)
    for target in run.targets:
        assert target.view.visible_fraction() == 0.0 and not target.view.meta
        assert hidden_leak_free(target.view) and target.view.ciphertext_sizes


def test_idlg_measures_leakage_of_fedml_he_and_fedhe_top2_plaintext_layers():
    """FedML-HE: iDLG runs on the visible 90%. FedHE-Top2 hides the head: with the labels granted,
    iDLG runs on the visible lower layers and still rebuilds the input; without them the label
    rule has no head to read, so iDLG is blocked by design (DLG learns the labels instead)."""
    suite = _suite([("fedml-he", {}), ("fedhe-top2", {})], [("idlg", {"steps": 50})], labels_known=True)
    cells = list(suite.cells)
    fedml = next(run_group([cells[0]], None))
    assert fedml["status"] == "ok", fedml["reason"]
    top2 = next(run_group([cells[1]], None))
    assert top2["status"] == "ok", top2["reason"]
    run = federate(cells[1], None)
    target = run.targets[0]
    blank = score_images(torch.full_like(target.truth.x, 0.5), target.truth.x)
    print(f"\nfedml-he iDLG: psnr={fedml['metrics']['psnr']:.2f} dB lpips={fedml['metrics'].get('lpips')}; "
          f"fedhe-top2 visible layers, labels granted: psnr={top2['metrics']['psnr']:.2f} dB; "
          f"grey image: psnr={blank['psnr']:.2f} dB")
    assert fedml["metrics"]["psnr"] > blank["psnr"] + 3.0
    assert top2["metrics"]["psnr"] > blank["psnr"] + 3.0
    untold = federate(_suite([("fedhe-top2", {})], [("idlg", {})]).cells[0], None).targets[0]
    reason = ATTACKS.get("idlg")().blocked(untold.view, untold.knowledge)
    assert reason and "head" in reason and "dlg" in reason
    assert ATTACKS.get("dlg")().blocked(untold.view, untold.knowledge) is None


@pytest.mark.parametrize("model,options", [("mlp", {}), ("simplecnn", {"dictionary": "u-sigma"}),
                                           ("lenet5-sigmoid", {"train_bias": True})])
def test_full_rank_dictionary_reproduces_the_pretrained_function(model, options):
    data = load_dataset("digits", None, max_train=120, max_test=20)
    torch.manual_seed(0)
    base = build_model(model, data)
    pretrain(base, TASKS[data.task](data), data.train_x, data.train_y, 1, 32, 0.05, 0)
    adapted = DictPFL(full_rank=True, prune=False, **options).adapt_model(copy.deepcopy(base))
    base.eval(), adapted.eval()
    with torch.no_grad():
        gap = (adapted(data.test_x) - base(data.test_x)).abs().max().item()
    assert gap < 1e-5
    names = update_names(adapted)
    trainable = ("table", "bias") if options.get("train_bias") else ("table",)
    assert all(n.endswith(trainable) or "running_" in n for n in names)
    assert any(n.endswith("bias") for n in names) == bool(options.get("train_bias"))
    assert classifier_head(adapted)[0] in names
    weight = next(p for p in base.parameters() if p.dim() > 1).detach()
    d = _svd_dictionary(weight, 4, True)
    assert torch.equal(d, _svd_dictionary(weight.clone(), 4, True))          # every client derives the same D
    assert (d.gather(0, d.abs().argmax(dim=0, keepdim=True)) > 0).all()       # sign-canonical columns


def test_tip_prunes_after_tau_inactive_rounds_and_hrc_follows_the_rule():
    prme, twin = PrME(10, s=0.5, tau=3, beta=0.2, seed=7), PrME(10, s=0.5, tau=3, beta=0.2, seed=7)
    small_then_big = np.r_[np.full(5, 0.01), np.full(5, 1.0)]
    for round in range(3):
        assert not prme.pruned.any()
        sent = prme.active(round)
        assert sent.all()
        for state in (prme, twin):
            state.observe(small_then_big, sent)
    assert prme.pruned.tolist() == [True] * 5 + [False] * 5
    assert np.allclose(prme.p, [0.2 ** 3] * 5 + [1.0] * 5)
    assert np.array_equal(prme.active(3), twin.active(3))          # shared seed: every client agrees
    prme.p[:2] = [0.04, 0.04]
    sent = ~prme.pruned
    sent[:2] = True                                                 # entries 0 and 1 reactivated by HRC
    prme.observe(np.r_[2.0, 0.01, 0.0, 0.0, 0.0, np.full(5, 1.0)], sent)
    assert not prme.pruned[0] and np.isclose(prme.p[0], 0.2)        # active again: p / beta
    assert prme.pruned[1] and np.isclose(prme.p[1], 0.04 * 0.2)     # still inactive: p * beta
    assert np.allclose(prme.p[2:5], 0.2 ** 3)                       # silent entries keep p


def test_decrypted_aggregate_equals_plaintext_sum_of_table_updates_with_accumulation():
    defense = DictPFL()
    fed = _fed(defense)
    defense.setup(fed)
    got, updates, uploads = _round(fed, defense, 0)
    weights = {u.sender: u.weight for u in uploads}
    expected = {n: sum(weights[c] * updates[c][n] for c in updates) for n in fed.names}
    assert max(float((got[n] - expected[n]).abs().max()) for n in fed.names) < 1e-6
    assert all(u.payload.plain == {} for u in uploads)
    defense.prme.pruned[:] = np.arange(defense.prme.pruned.size) % 3 == 0   # prune a third, no reactivation
    defense.prme.p[:] = 0.0
    pruned_round, first, _ = _round(fed, defense, 1)
    defense.prme.pruned[:], defense.prme.p[:] = False, 1.0
    back, second, _ = _round(fed, defense, 2)
    flat = lambda d: np.concatenate([d[n].reshape(-1).double().numpy() for n in fed.names])   # noqa: E731
    hidden = np.arange(defense.prme.pruned.size) % 3 == 0
    sums = [sum(weights[c] * flat(u) for c, u in rnd.items()) for rnd in (first, second)]
    assert np.abs(flat(pruned_round)[hidden]).max() == 0.0
    assert np.abs(flat(pruned_round)[~hidden] - sums[0][~hidden]).max() < 1e-6
    assert np.abs(flat(back)[hidden] - (sums[0] + sums[1])[hidden]).max() < 1e-6   # accumulated since pruning


def test_ciphertext_bytes_shrink_as_tip_prunes():
    scenario = Scenario(name="prune", **{**DIGITS, "rounds": 6})
    data = load_dataset("digits", None, max_train=200, max_test=60)
    defense = DictPFL(rank=16)
    run = run_federation(scenario, data, defense)
    by_round = run.details["pruned_fraction_by_round"]
    assert [by_round[str(r)] for r in range(3)] == [0.0, 0.0, 0.0]
    assert 0.3 < by_round["5"] <= 0.7 + 0.05
    assert run.metrics["pruned_fraction"] == pytest.approx(np.mean(list(by_round.values())))
    sizes = run.metrics["ciphertext_bytes"]
    assert defense.prme.pruned.any() and sizes > 0
    unpruned = run_federation(scenario, data, DictPFL(rank=16, prune=False))
    print(f"\nciphertext bytes per upload: pruned {sizes:,.0f} vs unpruned {unpruned.metrics['ciphertext_bytes']:,.0f}")
    assert sizes < unpruned.metrics["ciphertext_bytes"]


def test_fedhe_top2_encrypts_exactly_the_last_two_layers():
    defense = FedHETop2()
    fed = _fed(defense)
    defense.setup(fed)
    encrypted = sorted(n for n, m in defense.mask.items() if m.all())
    assert encrypted == ["3.bias", "3.weight", "5.bias", "5.weight"]
    assert not any(defense.mask[n].any() for n in fed.names if n not in encrypted)
    frozen = FedHETop2(freeze_rest=True)
    assert _fed(frozen).names == ["3.weight", "3.bias", "5.weight", "5.bias"]


def test_fedhe_top2_takes_the_last_trainable_layers_when_the_top_is_frozen():
    """A LoRA fine-tune freezes the final norm and LM head: the two layers FedHE-Top2 encrypts (and, with
    freeze_rest, keeps training) are the last ones that train, never frozen ones that are not uploaded."""
    from torch import nn

    from defenses.dictpfl import last_layers
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    for frozen in (model[3], model[4]):
        frozen.requires_grad_(False)
    assert last_layers(model) == [model[1], model[2]]
    FedHETop2(freeze_rest=True).adapt_model(model)
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True, True, True,
                                                             False, False, False, False]
