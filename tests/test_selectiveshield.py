"""SelectiveShield: zones move with tau and rho, two servers, personalization off the wire, accounting."""
import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from bench.data.loading import load_dataset
from bench.federation.engine import run_federation
from bench.federation.scenario import Scenario
from bench.registry import DEFENSES

SC = Scenario(name="ss", dataset="digits", model="mlp", num_clients=4, clients_per_round=4, rounds=1, max_train=400,
              partition="dirichlet", alpha=0.5, attack_batch_size=8)


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", None, max_train=400)


def _run(data, sc=SC, **params):
    defense = DEFENSES.get("selectiveshield")(**{"noise": False, **params})
    return run_federation(sc, data, defense), defense


def test_encrypted_zone_shrinks_as_tau_and_rho_rise(data):
    by_tau = [_run(data, tau=t)[0].metrics["enc_fraction"] for t in (0.01, 0.02, 0.07, 0.1, 0.2, 1.0)]
    by_rho = [_run(data, rho=r)[0].metrics["enc_fraction"] for r in (0.1, 0.3, 0.5, 0.8)]
    assert all(a >= b for a, b in zip(by_tau, by_tau[1:])), by_tau
    assert all(a >= b for a, b in zip(by_rho, by_rho[1:])), by_rho
    assert by_tau[-1] == 0.0 and by_tau[0] > 0.0


def test_personalized_zone_never_on_the_wire(data):
    from bench.federation.engine import build_federation
    defense = DEFENSES.get("selectiveshield")(noise=False, tau=0.02, rho=0.9)
    fed = build_federation(SC, data, defense)
    run = run_federation(SC, data, defense, fed=fed)
    pers = fed.clients[SC.attack_client].party.state["pers"]
    assert sum(int(m.sum()) for m in pers.values()) > 0
    view = run.targets[0].view
    for n in fed.names:
        hidden = (~view.visible[n]).reshape(-1).numpy()
        assert np.array_equal(hidden, defense.enc[n] | pers[n])   # hidden = encrypted zone + own personal zone
        assert not (pers[n] & defense.enc[n]).any()              # and the personal zone is not in the ciphertext
    assert run.details["key_topology"] == "key-server"
    assert 0 < run.metrics["accuracy_personal"] <= 1


def test_parties_hold_the_right_keys(data):
    from bench.federation.engine import build_federation
    fed = build_federation(SC, data)
    defense = DEFENSES.get("selectiveshield")(noise=False)
    defense.setup(fed)
    assert fed.parties["key-server"].holds_secret()
    assert not fed.parties["server"].holds_secret()
    assert not any(c.party.holds_secret() for c in fed.clients)


def test_ilrg_recovers_more_as_tau_rises(data):
    from bench.run.cells import score_cell
    from bench.run.spec import Cell, Component
    scores = {}
    for tau in (0.01, 1.0):
        run, _ = _run(data, tau=tau)
        cell = Cell("t", SC, Component("selectiveshield", {"tau": tau, "noise": False}), Component("ilrg"))
        scores[tau] = score_cell(cell, run)["metrics"]["lnacc"]
    plain = run_federation(SC, data, DEFENSES.get("plaintext")())
    cell = Cell("t", SC, Component("plaintext"), Component("ilrg"))
    assert scores[1.0] == score_cell(cell, plain)["metrics"]["lnacc"] == 1.0
    assert scores[0.01] < scores[1.0]


def test_epsilon_is_the_papers_t_round_rdp_bound(data):
    sc = Scenario(**{**SC.__dict__, "rounds": 3})
    run, defense = _run(data, sc=sc, noise=True, noise_multiplier=2.0)
    acc = RDPAccountant()
    for _ in range(3):
        acc.step(noise_multiplier=2.0, sample_rate=1.0)
    assert run.metrics["epsilon_rdp"] == pytest.approx(acc.get_epsilon(delta=sc.delta))
    assert run.metrics["epsilon"] == min(run.metrics["epsilon_rdp"], run.metrics["epsilon_prv"])
    assert defense.ledger.steps == 3


def test_noise_zone_is_clipped_and_noised_only_there(data):
    run, defense = _run(data, noise=True, noise_multiplier=1e-9, clip=0.01, tau=0.05)
    view, truth = run.targets[0].view, run.targets[0].truth
    norm = np.sqrt(sum(float(view.values[n][view.visible[n]].double().pow(2).sum()) for n in view.values))
    assert norm <= 0.01 + 1e-6
    run2, _ = _run(data, noise=True, noise_multiplier=1.0, clip=0.01, tau=0.05)
    v2 = run2.targets[0].view
    diff = sum(float((v2.values[n][v2.visible[n]] - view.values[n][view.visible[n]]).abs().sum()) for n in v2.values)
    assert diff > 0
