"""Record-level DP-SGD: per-example clipping against Opacus' per-sample gradients, the per-client accountant
against Opacus' RDP accountant over the steps each client ran, and the noisy clipped FedSGD step."""
from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import RDPAccountant

import defenses.dpsgd  # noqa: F401  (registers dp-sgd)
from bench.data.loading import load_dataset
from bench.federation.engine import build_federation, local_update, run_federation
from bench.federation.measure import setting
from bench.federation.scenario import Scenario
from bench.federation.state import set_entries
from bench.models import build_model
from defenses.dpsgd import DPSGD, clipped_sum, looped, per_example_gradients

CLIP = 0.5


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", None, max_train=200, max_test=60)


def scenario(**kw) -> Scenario:
    base = dict(name="dpsgd", dataset="digits", model="mlp", num_clients=2, clients_per_round=2, rounds=2,
                local_epochs=2, batch_size=16, attack_update="delta", attack_batch_size=8)
    return Scenario(**(base | kw))


def batch_with_an_outlier(data, size: int = 8):
    """Digits whose first image is scaled 1000x: its gradient dwarfs the others'."""
    x, y = data.train_x[:size].clone(), data.train_y[:size].clone()
    x[0] *= 1000.0
    return x, y


def test_per_example_gradients_are_opacus_per_sample_gradients(data):
    from opacus import GradSampleModule

    sc = scenario()
    fed = build_federation(sc, data)
    model = fed.new_model()
    x, y = data.train_x[:6], data.train_y[:6]
    ours, losses = per_example_gradients(fed, model, x, y)
    wrapped = GradSampleModule(fed.new_model(), loss_reduction="sum")
    torch.nn.functional.cross_entropy(wrapped(x), y, reduction="sum").backward()
    theirs = {n.removeprefix("_module."): p.grad_sample for n, p in wrapped.named_parameters()}
    assert set(ours) == set(theirs)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, torch.nn.functional.cross_entropy(model(x), y, reduction="none"))
    looped_grads, _ = looped(fed, model, x, y)   # the path of models vmap cannot trace: the same gradients
    for name in ours:
        torch.testing.assert_close(looped_grads[name], ours[name], rtol=1e-5, atol=1e-6)


def test_clipping_bounds_each_examples_contribution(data):
    """Removing any one example moves the step's clipped sum by at most the clip: the sensitivity DP-SGD's noise is
    calibrated to. Clipping the batch's gradient instead (per batch) lets the outlier move it by far more."""
    sc = scenario()
    fed = build_federation(sc, data)
    defense = DPSGD(noise_multiplier=1e-9, clip=CLIP)
    defense.setup(fed)
    client, model = fed.clients[0], fed.local_model()
    x, y = batch_with_an_outlier(data)

    def step_sum(xs, ys) -> torch.Tensor:   # the noiseless sum the step's .grad holds, times the batch size
        model.zero_grad()
        defense.local_gradient(fed, client, model, xs, ys)
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]) * len(xs)

    full = step_sum(x, y)
    grads, norms = per_example_gradients(fed, model, x, y)
    assert float(norms[0]) > 100 * CLIP and float(norms[1:].max()) < 100 * CLIP
    for k in range(len(x)):
        keep = torch.arange(len(x)) != k
        assert float((full - step_sum(x[keep], y[keep])).norm()) <= CLIP * (1 + 1e-4)
    # the same batch clipped as a whole: the outlier alone moves it by more than the clip
    whole = {n: g.sum(0, keepdim=True) for n, g in grads.items()}
    rest = {n: g[1:].sum(0, keepdim=True) for n, g in grads.items()}
    moved = torch.cat([(clipped_sum(whole, CLIP)[0][n] - clipped_sum(rest, CLIP)[0][n]).reshape(-1) for n in grads])
    assert float(moved.norm()) > CLIP * 1.2


def test_epsilon_is_opacus_over_the_steps_each_client_ran(data):
    sc = scenario()
    z = 1.1
    fed = build_federation(sc, data)
    defense = DPSGD(noise_multiplier=z, clip=CLIP)
    run = run_federation(sc, data, defense, fed=fed)
    per_client = []
    for client in fed.clients:
        n = client.num_samples
        # in the attack round the attacked client trains on its attacked batch alone (attack_update = delta)
        steps = sum(sc.local_epochs * math.ceil((sc.attack_batch_size if r == sc.attack_round and
                                                 client.index == sc.attack_client else n) / sc.batch_size)
                    for r in range(sc.rounds))
        opacus = RDPAccountant()
        for _ in range(steps):
            opacus.step(noise_multiplier=z, sample_rate=sc.batch_size / n)
        expected = opacus.get_epsilon(delta=sc.delta)
        assert defense.ledgers[client.name].steps == steps
        assert defense.ledgers[client.name].epsilon(sc.delta) == pytest.approx(expected, rel=1e-12)
        per_client.append(expected)
    # the row's epsilon is the attacked client's (client 0, fewer steps here), the other's beside it
    assert run.metrics["epsilon_rdp"] == pytest.approx(per_client[sc.attack_client], rel=1e-12)
    assert run.metrics["epsilon"] <= run.metrics["epsilon_rdp"] < max(per_client)
    assert run.metrics["epsilon_other_clients"] <= max(per_client) == pytest.approx(per_client[1], rel=1e-12)
    assert run.details["dp"]["delta"] == sc.delta and "record" in run.details["dp"]["adjacency"]
    assert run.details["differentially_private"] is True


def test_target_epsilon_is_met(data, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sc = scenario()
    defense = DPSGD(target_epsilon=4.0, clip=CLIP)
    run = run_federation(sc, data, defense)
    assert 4.0 * 0.99 <= max(ledger.epsilon(sc.delta) for ledger in defense.ledgers.values()) <= 4.0
    assert run.metrics["epsilon"] <= run.metrics["epsilon_rdp"] <= 4.0


def test_a_fedsgd_upload_is_one_noisy_clipped_step(data):
    """attack_update = gradient: the upload is -lr * (clipped sum + noise) / B; without noise its norm is at most
    lr * clip however large an example's gradient, and with noise it is the noiseless step plus N(0, (z C / B)^2)."""
    sc = scenario(attack_update="gradient", lr=0.1)
    fed = build_federation(sc, data)
    x, y = batch_with_an_outlier(data)
    client = fed.clients[0]
    quiet = DPSGD(noise_multiplier=1e-9, clip=CLIP)
    quiet.setup(fed)
    step = local_update(fed, client, x, y, "gradient", torch.Generator().manual_seed(0), quiet)
    norm = math.sqrt(sum(float(t.pow(2).sum()) for t in step.values()))
    plain = local_update(fed, client, x, y, "gradient", torch.Generator().manual_seed(0))
    assert norm <= sc.lr * CLIP * (1 + 1e-5) < math.sqrt(sum(float(t.pow(2).sum()) for t in plain.values()))
    noisy = DPSGD(noise_multiplier=2.0, clip=CLIP)
    noisy.setup(fed)
    noised = local_update(fed, client, x, y, "gradient", torch.Generator(), noisy)
    diff = torch.cat([(noised[n] - step[n]).reshape(-1) for n in step])
    assert float(diff.std()) == pytest.approx(sc.lr * 2.0 * CLIP / len(x), rel=0.05)
    assert noisy.ledgers[client.name].steps == 1


def test_batchnorm_models_are_refused_at_load(data):
    assert "BatchNorm2d" in DPSGD(noise_multiplier=1.0).applicable(setting(scenario(model="simplecnn"), data))
    assert DPSGD(noise_multiplier=1.0).applicable(setting(scenario(), data)) is None


@pytest.mark.parametrize("params", [{}, {"noise_multiplier": 1.0, "target_epsilon": 1.0}, {"noise_multiplier": 0.0},
                                    {"noise_multiplier": 1.0, "clip": 0.0},
                                    {"noise_multiplier": 1.0, "inner": "dp-fedavg",
                                     "inner_params": {"noise_multiplier": 1.0}}])
def test_bad_params_fail_in_one_line(params):
    with pytest.raises(ValueError) as err:
        DPSGD.check_params(params)
    assert "\n" not in str(err.value) and "dp-sgd" in str(err.value)


def test_an_inner_defense_encodes_the_noised_update(data):
    """Wrapped around secure aggregation the model is the same as around plaintext: the sum is what is released."""
    sc = scenario(rounds=1)
    models = []
    for inner in ("plaintext", "secagg"):
        fed = build_federation(sc, data)
        run_federation(sc, data, DPSGD(noise_multiplier=1.0, clip=CLIP, inner=inner), fed=fed)
        models.append(fed.params())
    for name in models[0]:
        torch.testing.assert_close(models[0][name], models[1][name], rtol=0, atol=1e-6)


def test_the_engine_steps_with_the_noised_gradient(data):
    """One local step of plain SGD from the start model moves it by exactly -lr times the gradient local_gradient
    put in .grad (the engine neither adds nor drops anything)."""
    sc = scenario(local_epochs=1, batch_size=1000)   # one batch: the whole client
    fed = build_federation(sc, data)
    client = fed.clients[0]
    defense = DPSGD(noise_multiplier=1.0, clip=CLIP)
    defense.setup(fed)
    update = local_update(fed, client, client.x, client.y, "delta", torch.Generator().manual_seed(0), defense)
    again = build_federation(sc, data)   # its client's noise stream starts where the first one's did
    replay = DPSGD(noise_multiplier=1.0, clip=CLIP)
    replay.setup(again)
    model = build_model(sc.model, data)
    set_entries(model, again.params())
    model.zero_grad()
    order = torch.randperm(client.num_samples, generator=torch.Generator().manual_seed(0))
    replay.local_gradient(again, again.clients[0], model, client.x[order], client.y[order])
    for name, p in model.named_parameters():
        torch.testing.assert_close(update[name], -sc.lr * p.grad, rtol=1e-5, atol=1e-7)
