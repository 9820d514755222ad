"""Local training through the Defense's local_gradient hook, the server optimizer, and what a DP record must hold.

The default hook and the reused local-training module must give the models the engine gave before them, bit
for bit (a reference loop below is the earlier engine's code); the server optimizer at its defaults is FedAvg;
cells that do not set the new scenario fields keep their ids; a DP record without its epsilon is refused."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from bench.data.loading import load_dataset
from bench.federation.engine import build_federation, local_update, run_federation
from bench.federation.scenario import Scenario, SpecError, scenario_config
from bench.federation.state import set_entries
from bench.protocol.contracts import ContractError, run_metric_values
from bench.protocol.defense import Defense
from bench.models.losses import unpack_bits
from bench.protocol.records import RecordError, check_record, seal
from bench.registry import DEFENSES
from bench.run.cells import run_group
from bench.run.spec import Cell, Component
from tests.conftest import tiny_suite


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", None, max_train=200, max_test=60)


def reference_update(fed, client, x, y, mode, generator):
    """The engine's local update before the hook: a freshly built model, the task's loss, torch's SGD."""
    model = fed.new_model()
    start = client.merged(fed.params())
    set_entries(model, start)
    model.train()
    if mode == "gradient":
        before = {n: b.detach().clone() for n, b in model.named_buffers() if n in fed.shapes}
        model.zero_grad()
        fed.task.loss(model, x, y).backward()
        params, after = dict(model.named_parameters()), dict(model.named_buffers())
        return {n: after[n].detach() - before[n] if n in before else -fed.scenario.lr * params[n].grad.detach()
                for n in fed.names}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=fed.scenario.lr)
    for _ in range(fed.scenario.local_epochs):
        for batch in torch.randperm(len(y), generator=generator).split(fed.scenario.batch_size):
            opt.zero_grad()
            fed.task.loss(model, x[batch], y[batch]).backward()
            opt.step()
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return {n: state[n].detach() - start[n] for n in fed.names}


@pytest.mark.parametrize("model", ["mlp", "simplecnn"])   # simplecnn: BatchNorm statistics and counters
def test_the_default_hook_trains_bit_for_bit_as_before(data, model):
    sc = Scenario(name="t", dataset="digits", model=model, num_clients=3, clients_per_round=3, local_epochs=2,
                  batch_size=16)
    fed = build_federation(sc, data)
    for client in fed.clients + fed.clients[:1]:   # one module reused across clients, and again for the first
        for mode in ("delta", "gradient"):
            x, y = (client.x, client.y) if mode == "delta" else (client.x[:5], client.y[:5])
            got = local_update(fed, client, x, y, mode, torch.Generator().manual_seed(client.index), Defense())
            want = reference_update(fed, client, x, y, mode, torch.Generator().manual_seed(client.index))
            for name in fed.names:
                assert torch.equal(got[name], want[name]), (client.name, mode, name)
    counters = {n: b for n, b in fed.local_model().named_buffers() if n not in fed.names}
    assert model == "mlp" or all(int(b) == 0 for b in counters.values())   # each use starts from the build's


def test_a_hook_that_returns_no_loss_is_named(data):
    class Broken(Defense):
        def local_gradient(self, fed, client, model, x, y):
            fed.backward(model, x, y)

    sc = Scenario(name="t", dataset="digits", model="mlp", num_clients=2, clients_per_round=2)
    fed = build_federation(sc, data)
    with pytest.raises(ContractError, match="local_gradient returned None, expected"):
        local_update(fed, fed.clients[0], fed.clients[0].x, fed.clients[0].y, "delta", torch.Generator(), Broken())


class Recorder(DEFENSES.get("plaintext")):
    """Plaintext FedAvg that keeps every round's decoded mean update."""

    def __init__(self):
        super().__init__()
        self.updates = []

    def decode(self, fed, aggregate, party):
        update = super().decode(fed, aggregate, party)
        self.updates.append({n: t.clone() for n, t in update.items()})
        return update


def trajectory(data, **server):
    sc = Scenario(name="t", dataset="digits", model="mlp", num_clients=3, clients_per_round=2, rounds=3, **server)
    fed = build_federation(sc, data)
    start = fed.params()
    recorder = Recorder()
    run_federation(sc, data, recorder, fed=fed)
    return start, recorder.updates, fed.params()


def test_the_server_optimizer_at_its_defaults_is_fedavg(data):
    start, updates, end = trajectory(data)
    for name in start:   # x_T = x_0 + sum of the decoded mean updates, in order, as FedAvg adds them
        value = start[name]
        for update in updates:
            value = value + update[name]
        assert torch.equal(value, end[name])
    _, _, explicit = trajectory(data, server_lr=1.0, server_momentum=0.0)
    assert all(torch.equal(explicit[n], end[n]) for n in end)


def test_server_momentum_is_heavy_ball_on_the_mean_update(data):
    lr, beta = 0.5, 0.9
    start, updates, end = trajectory(data, server_lr=lr, server_momentum=beta)
    for name in start:
        value, moment = start[name].double(), torch.zeros_like(start[name], dtype=torch.float64)
        for update in updates:
            moment = beta * moment + update[name].double()
            value = value + lr * moment
        torch.testing.assert_close(end[name].double(), value, rtol=1e-5, atol=1e-6)


def test_new_scenario_fields_leave_cell_ids_unchanged():
    cell = Cell("x", Scenario(name="s", dataset="digits", model="mlp"), Component("plaintext"), Component("idlg"))
    # the id this cell has had since one-run audits added `canaries` (bench/run/upgrade.py maps older records onto
    # it); the server optimizer's fields, at their defaults, leave it as it was
    assert cell.cell_id == "5e4ab0f9f21c9544"
    config = scenario_config(Scenario(name="s", dataset="digits", model="mlp", server_lr=1.0, server_momentum=0.0))
    assert "server_lr" not in config and "server_momentum" not in config
    moved = scenario_config(Scenario(name="s", dataset="digits", model="mlp", server_momentum=0.9))
    assert moved["server_momentum"] == 0.9 and "server_lr" not in moved
    with pytest.raises(SpecError, match="server_momentum"):
        Scenario(name="s", dataset="digits", model="mlp", server_momentum=1.0)


# -------------------------------------------------------------------------- what a DP record must hold

@pytest.fixture(scope="module")
def dp_records():
    suite = tiny_suite([("dp-sgd", {"noise_multiplier": 1.0}), "plaintext"], ["random-guess"])
    return {cells[0].defense.name: next(run_group(cells, None)) for cells in
            [[c] for c in suite.cells]}


def test_a_dp_record_carries_its_epsilon_and_per_example_outcomes(dp_records, data):
    rec = check_record(copy.deepcopy(dp_records["dp-sgd"]), "results.json")
    assert rec["details"]["differentially_private"] is True and rec["metrics"]["epsilon"] > 0
    assert rec["details"]["dp"]["accountant"].startswith("opacus")
    outcomes = rec["details"]["per_example"]
    correct = unpack_bits(outcomes["correct"], outcomes["n"])
    assert outcomes["n"] == rec["metrics"]["test_samples"] and correct.mean() == pytest.approx(rec["metrics"]["accuracy"])
    assert "differentially_private" not in dp_records["plaintext"]["details"]


@pytest.mark.parametrize("edit", [lambda r: r["metrics"].pop("epsilon"),
                                  lambda r: r["metrics"].update(epsilon=float("nan")),
                                  lambda r: r["details"].pop("dp")])
def test_a_dp_record_without_its_epsilon_is_refused_at_load(dp_records, edit, tmp_path):
    from bench.evaluation.exports import load_records

    rec = copy.deepcopy(dp_records["dp-sgd"])
    edit(rec)
    seal(rec)   # a record written that way, not edited afterwards: its digest matches
    with pytest.raises(RecordError) as err:
        check_record(rec, "results.json")
    assert "\n" not in str(err.value) and "differentially private" in str(err.value)
    path = tmp_path / "results.json"
    path.write_text(json.dumps([dp_records["plaintext"], rec]))
    with pytest.raises(RecordError, match="differentially private"):
        load_records(path)
    path.write_text(json.dumps([dp_records["plaintext"]]))   # a record of a non-DP defense needs no epsilon
    assert len(load_records(path)) == 1


def test_a_dp_defense_that_reports_no_epsilon_breaks_its_contract():
    class Silent(Defense):
        differentially_private = True

    with pytest.raises(ContractError, match="no accountant epsilon"):
        run_metric_values(Silent(), {"noise_multiplier": 1.0})
    assert run_metric_values(Silent(), {"epsilon": 1.0, "dp": {"accountant": "rdp", "delta": 1e-5}})


def test_per_example_outcomes_stay_small():
    from bench.models.losses import pack_bits
    bits = np.random.default_rng(0).integers(0, 2, 10_000)
    text = pack_bits(bits)
    assert len(text) < 2_000 and np.array_equal(unpack_bits(text, 10_000), bits.astype(bool))
