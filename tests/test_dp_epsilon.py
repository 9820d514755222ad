"""An epsilon a reader can rely on: the attacked client's (its forced attack round accounted at q = 1), read by
Opacus' RDP and PRV accountants (the smaller is the headline), its adjacency and level named on every DP row,
DP-SGD's target met in every attack mode, and canaries refused where DP-SGD's noise cannot reach them."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from opacus.accountants import RDPAccountant

import defenses  # noqa: F401  (registers every built-in defense)
import metrics.run  # noqa: F401  (the run-metric schema: epsilon; its readings are declared by the accountant)
from bench.data.loading import load_dataset
from bench.federation.accounting import forced, readings, replace_one, report
from bench.federation.engine import _sample, build_federation, run_federation
from bench.federation.measure import setting
from bench.federation.scenario import Scenario
from bench.registry import DEFENSES
from defenses.dp import DPFedAvg
from defenses.dpsgd import DPSGD

DELTA = 1e-5

# Google's dp_accounting 0.6.0 PLDAccountant (neighboring_relation ADD_OR_REMOVE_ONE: both directions; REPLACE_ONE;
# value_discretization_interval 1e-3) on these (noise multiplier, sample rate, steps) histories at delta 1e-5, run
# in a separate environment (it is no dependency of the project).
PLD_ADD_REMOVE = {((1.0, 0.1, 60),): 5.572706, ((1.0, 0.1, 59), (1.0, 1.0, 1)): 7.226360,
                  ((1.0, 0.0064, 1884),): 1.536926, ((1.0, 1.0, 6),): 12.870663}
PLD_REPLACE_ONE = {((1.0, 1.0, 6),): 32.176681, ((1.0, 1.0, 1),): 9.997256}


def rdp(history, delta=DELTA) -> float:
    acc = RDPAccountant()
    acc.history = list(history)
    return acc.get_epsilon(delta=delta)


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", None, max_train=200, max_test=60)


# ------------------------------------------------------------------------------ the accountants

def test_the_cross_device_rows_attacked_client_spends_its_forced_round_at_q_1():
    """fmnist-fcn-crossdevice: 60 rounds, 100 of 1,000 clients, z = 1. Every round at q = 0.1 reads RDP 6.33 /
    PRV 5.58; the attacked client, forced into one of them, 8.01 / 7.24."""
    attacked, others = [(1.0, 0.1, 59), (1.0, 1.0, 1)], [(1.0, 0.1, 60)]
    mine, theirs = readings(attacked, DELTA), readings(others, DELTA)
    assert mine["rdp"] == pytest.approx(8.01, abs=0.005) and mine["prv"] == pytest.approx(7.24, abs=0.01)
    assert theirs["rdp"] == pytest.approx(6.33, abs=0.005) and theirs["prv"] == pytest.approx(5.58, abs=0.01)
    metrics, details = report(DELTA, attacked, others, level="user", sensitivity="C", sampling="fixed")
    assert metrics["epsilon"] == mine["prv"] and details["headline_accountant"] == "prv"
    assert metrics["epsilon_rdp"] == mine["rdp"] and metrics["epsilon_other_clients"] == theirs["prv"]
    assert details["adjacency"].startswith("user-level, add/remove") and details["delta"] == DELTA


@pytest.mark.parametrize("history", list(PLD_ADD_REMOVE), ids=str)
def test_prv_is_a_valid_bound_on_mixed_histories(history):
    """Opacus' PRV over a history of several (z, q, steps) runs (the forced round among sampled ones): never below
    the optimal add/remove accountant's epsilon (both directions), within its discretization error of it, and
    tighter than RDP."""
    got = readings(list(history), DELTA)
    assert PLD_ADD_REMOVE[history] <= got["prv"] <= PLD_ADD_REMOVE[history] + 0.03
    assert got["prv"] < got["rdp"] == pytest.approx(rdp(history), rel=1e-12)
    assert got["epsilon"] == got["prv"] and got["headline"] == "prv"


def test_a_prv_reading_that_cannot_be_discretized_is_left_out_with_its_reason():
    """Little noise makes PRV's grid huge (it would exhaust memory): RDP stands alone, and the record says why."""
    got = readings([(1e-3, 1.0, 1)], DELTA)
    assert "prv" not in got and "grid" in got["prv_error"] and got["headline"] == "rdp"
    metrics, details = report(DELTA, [(1e-3, 1.0, 1)], None, level="user", sensitivity="C", sampling="fixed")
    assert "epsilon_prv" not in metrics and metrics["epsilon"] == metrics["epsilon_rdp"] == got["rdp"]
    assert "grid" in details["prv"] and "epsilon_other_clients" not in metrics


@pytest.mark.parametrize("history", list(PLD_REPLACE_ONE), ids=str)
def test_the_replace_one_reading_is_the_gaussian_at_twice_the_sensitivity(history):
    """Unsubsampled releases (SelectiveShield, SenseCrypt, DP-FedAvg with every client a round): replacing a client's
    data moves its clipped vector by 2 C, i.e. noise multiplier z / 2; a valid bound on the optimal reading."""
    got = replace_one(list(history), DELTA)
    assert got["rdp"] == pytest.approx(rdp([(z / 2, q, n) for z, q, n in history]), rel=1e-12)
    assert PLD_REPLACE_ONE[history] - 1e-3 <= got["epsilon"] <= PLD_REPLACE_ONE[history] + 0.05
    metrics, details = report(DELTA, list(history), None, level="user", sensitivity="C", sampling="fixed")
    assert metrics["epsilon_replace_one"] == got["epsilon"] > 2 * metrics["epsilon"]
    assert rdp([(0.5, 1.0, 6)]) == pytest.approx(34.13, abs=0.005)   # SelectiveShield's 6 rounds at z = 1, by RDP


def test_a_subsampled_history_has_no_replace_one_reading_and_says_why():
    metrics, details = report(DELTA, [(1.0, 0.1, 59), (1.0, 1.0, 1)], None, level="user", sensitivity="C",
                              sampling="fixed")
    assert "epsilon_replace_one" not in metrics and details["replace_one"].startswith("not computed")


# ------------------------------------------------------------------------------ the attacked client in a run

def test_dp_fedavg_accounts_the_round_the_engine_forces_the_attacked_client_into(data):
    """One of 4 clients a round (q = 0.25); client 2 is attacked in round 1: its history is q, 1, q; every other
    client's q, q, q. The engine's `forced` is the rule the sampler follows."""
    sc = Scenario(name="forced", dataset="digits", model="mlp-tiny", model_params={"hidden": 8}, num_clients=4, clients_per_round=1, rounds=3,
                  attack_round=1, attack_client=2, max_train=200, max_test=60)
    for sampling in ("fixed", "poisson"):   # the sampler puts the forced client in, over many draws
        fed = build_federation(replace(sc, sampling=sampling, rounds=40, attack_round=7), data)
        for r in range(40):
            assert set(forced(fed.scenario, r)) <= {c.index for c in _sample(fed, r)}
    assert forced(sc, 1) == (2,) and forced(sc, 0) == forced(sc, 2) == ()
    run = run_federation(sc, data, DPFedAvg(noise_multiplier=1.0, clip=0.1))
    dp = run.details["dp"]
    assert dp["history"] == [[1.0, 0.25, 1], [1.0, 1.0, 1], [1.0, 0.25, 1]]
    assert dp["other_clients_history"] == [[1.0, 0.25, 3]] and dp["attacked_client"] == "client-2"
    assert run.metrics["epsilon_rdp"] == pytest.approx(rdp([(1.0, 0.25, 1), (1.0, 1.0, 1), (1.0, 0.25, 1)]))
    assert run.metrics["epsilon"] > run.metrics["epsilon_other_clients"]


def _dp_cases():
    """Each differentially private defense of the registry at a setting small enough to run here."""
    params = {"dp-fedavg": {"noise_multiplier": 1.0}, "dp-fedavg-local": {"noise_multiplier": 1.0},
              "dp-sgd": {"noise_multiplier": 1.0}, "selectiveshield": {"noise_multiplier": 1.0, "tau": 0.02},
              "sensecrypt-dp": {"key_bits": 512, "dp_epsilon": 1.0, "ratio_cap": 0.05}}
    return params


def test_every_dp_defense_of_the_registry_is_covered_here():
    dp = {n for n in DEFENSES.builtins() if getattr(DEFENSES.get(n), "differentially_private", False)}
    assert dp == set(_dp_cases())


@pytest.mark.parametrize("name", list(_dp_cases()))
def test_every_dp_row_states_its_accountants_delta_adjacency_level_and_the_attacked_clients_epsilon(name, data):
    """What a record keeps of the run (bench/run/cells.py's run metrics, details.dp): the readings by name and the
    same add/remove adjacency on every row, user-level but DP-SGD's record-level unit."""
    from bench.run.cells import _run_metrics

    sc = Scenario(name="rows", dataset="digits", model="mlp-tiny", model_params={"hidden": 8}, num_clients=3,
                  clients_per_round=3, rounds=1, max_train=90, max_test=30, local_epochs=1, batch_size=16)
    run = run_federation(sc, data, DEFENSES.get(name)(**_dp_cases()[name]))
    kept = _run_metrics(run.metrics)
    dp = run.details["dp"]
    level = "record" if name == "dp-sgd" else "user"
    assert dp["level"] == level and dp["adjacency"].startswith(f"{level}-level, add/remove")
    assert "rdp" in dp["accountant"] and "prv" in dp["accountant"] and isinstance(dp["delta"], float)
    assert dp["epsilon_of"] == "the attacked client" and dp["attacked_client"] == "client-0"
    assert dp["headline_accountant"] in dp["accountant"] and dp["sensitivity"].startswith(("C = clip", "G = "))
    assert kept["epsilon"] == min(v for k, v in kept.items() if k in ("epsilon_rdp", "epsilon_prv")
                                  or (k == "epsilon" and dp["headline_accountant"] not in ("rdp", "prv")))
    for reading in ("epsilon_rdp", "epsilon_prv", "epsilon_other_clients"):
        assert math.isfinite(kept[reading]), reading
    if level == "user":   # every release unsubsampled here (3 of 3 clients): the replace-one reading is there
        assert kept["epsilon_replace_one"] > kept["epsilon"]


def test_sensecrypts_nominal_epsilon_reads_as_its_accountants_and_its_replace_one_reading():
    """SenseCrypt's Algorithm 2 at a nominal 1 (sigma 4.84): 0.822 by RDP (Dwork & Roth's bound needs epsilon < 1),
    1.754 by RDP at twice the sensitivity; PRV is tighter on both."""
    from defenses.sensecrypt.clustering import dp_accounting, dp_sigma

    out = dp_accounting(1.0, DELTA, 1.0, "client-0")
    assert out["epsilon_rdp"] == pytest.approx(0.822, abs=0.001) == rdp([(dp_sigma(1.0, DELTA), 1.0, 1)])
    assert out["epsilon"] == out["epsilon_prv"] < out["epsilon_rdp"]
    assert rdp([(dp_sigma(1.0, DELTA) / 2, 1.0, 1)]) == pytest.approx(1.754, abs=0.001)
    assert out["epsilon_replace_one"] <= 1.754 and out["dp"]["adjacency"].startswith("user-level, add/remove")
    small = dp_accounting(0.1, DELTA, 1.0, "client-0")   # the closed form holds below 1 and may be the tightest
    assert small["epsilon"] <= 0.1 and small["epsilon"] == min(0.1, small["epsilon_rdp"], small["epsilon_prv"])


# ------------------------------------------------------------------------------ DP-SGD's plan and canaries

@pytest.mark.parametrize("mode", ["delta", "gradient"])
def test_dp_sgd_meets_its_target_in_every_attack_mode(mode, data, tmp_path, monkeypatch):
    """The attacked client runs its attack_repeats uploads in the attack round instead of its local epochs: 6
    local-training deltas of 2 epochs over 32 records (24 steps, where its epochs would run 14), or 6 FedSGD steps.
    The plan counts them, so no client passes the target (the old plan read 1.6 x the target for "delta")."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sc = Scenario(name="plan", dataset="digits", model="mlp-tiny", model_params={"hidden": 8}, num_clients=2, clients_per_round=2, rounds=2,
                  local_epochs=2, batch_size=16, attack_update=mode, attack_batch_size=32, attack_repeats=6,
                  max_train=200, max_test=60)
    defense = DPSGD(target_epsilon=1.0, clip=0.5)
    fed = build_federation(sc, data)
    run = run_federation(sc, data, defense, fed=fed)
    for client in fed.clients:   # every client took part every round: the plan is exactly what ran
        assert defense.ledgers[client.name].steps == sum(n for _, n in defense._plan(fed, client))
    spent = [ledger.epsilon(sc.delta) for ledger in defense.ledgers.values()]
    assert max(spent) <= 1.0 and max(spent) == pytest.approx(1.0, rel=0.01)
    assert run.metrics["epsilon"] <= run.metrics["epsilon_rdp"] <= 1.0
    assert run.details["dp"]["level"] == "record" and run.details["dp"]["attacked_client"] == "client-0"


@pytest.mark.parametrize("canary, refused", [("gradient", True), ("one-run", True), ("mislabeled", False),
                                             ("none", False)])
def test_dp_sgd_refuses_canaries_its_noise_cannot_reach(canary, refused, data):
    """A gradient canary replaces the update after training, one-run canaries are added to it: DP-SGD's noise,
    inside training, never reaches them, so the audit would read a violation the harness made. A mislabeled canary
    is a record DP-SGD trains on."""
    extra = {"canaries": 10} if canary == "one-run" else {"attack_repeats": 4} if canary != "none" else {}
    sc = Scenario(name="canary", dataset="digits", model="mlp", canary=canary, max_train=200, max_test=60, **extra)
    reason = DPSGD(noise_multiplier=1.0).applicable(setting(sc, data))
    if refused:
        assert "noise" in reason and "\n" not in reason and "mislabeled" in reason
    else:
        assert reason is None
