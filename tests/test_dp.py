"""DP-FedAvg: accounting against Opacus computed here, clipping and noise on the wire, parameter checks. The attacked
client's epsilon, adjacency, PRV and the other DP defenses' readings: tests/test_dp_epsilon.py."""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant

import bench.federation.accounting as privacy
import defenses.dp  # noqa: F401  (registers dp-fedavg, dp-fedavg-local)
from bench.data.loading import load_dataset
from bench.federation.accounting import RdpLedger, noise_for_epsilon, readings
from bench.federation.engine import build_federation, run_federation
from bench.federation.scenario import Scenario
from bench.protocol.defense import Defense
from bench.protocol.wire import CipherPart, Payload, Upload
from bench.registry import DEFENSES, METRICS
from defenses.dp import DPFedAvg, DPFedAvgLocal, clip_update
from tests.conftest import weighted_uploads

CLIP = 0.05   # below the attacked gradient's norm (~0.23), so clipping really happens


def opacus_epsilon(z: float, q: float, steps: int, delta: float) -> float:
    acc = RDPAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=z, sample_rate=q)
    return acc.get_epsilon(delta=delta)


def l2(update: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in update.values()))


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", None, max_train=300)


@pytest.fixture(scope="module")
def scenario():
    return Scenario(name="dp", dataset="digits", model="mlp", num_clients=4, clients_per_round=2, rounds=3,
                    attack_repeats=2)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    privacy._cached.cache_clear()
    yield tmp_path / "leakbench" / "noise.json"
    privacy._cached.cache_clear()


# ------------------------------------------------------------------------------ accounting

def test_ledger_matches_opacus():
    ledger = RdpLedger(1.0, 0.5)
    assert ledger.epsilon(1e-5) == 0.0
    for _ in range(10):
        ledger.step()
    eps = ledger.epsilon(1e-5)
    assert ledger.steps == 10 and ledger.history == [(1.0, 0.5, 10)]
    assert eps == pytest.approx(opacus_epsilon(1.0, 0.5, 10, 1e-5), rel=1e-12)
    assert 11.0 < eps < 12.0          # 11.54 with Opacus 1.6 RDP


def test_ledger_anchor_value():
    """The anchors' reference row: N=100, m=10, z=1, 100 rounds, delta=1e-5 -> epsilon 7.90."""
    ledger = RdpLedger(1.0, 0.1)
    for _ in range(100):
        ledger.step()
    assert ledger.epsilon(1e-5) == pytest.approx(7.90, abs=0.01)


@pytest.mark.parametrize("call, words", [
    (lambda: privacy.noise_for_epsilon(1.0, 1.5, 0.5, 3), "delta in (0, 1)"),          # delta past 1, rate fine
    (lambda: privacy.noise_for_epsilon(1.0, 1e-5, 0.0, 3), "sample_rate in (0, 1]"),   # rate 0, delta fine
    (lambda: privacy.noise_for_epsilon(1.0, 1e-5, 0.5, 0), "rounds >= 1"),
    (lambda: privacy.noise_for_histories(1.0, 1.5, [[(0.5, 3)]]), "delta in (0, 1)"),
    (lambda: privacy.noise_for_histories(1.0, 1e-5, [[(1.5, 3)]]), "every sample rate must be in (0, 1]"),
    (lambda: privacy.noise_for_histories(1.0, 1e-5, [[(0.5, 0)]]), "no party plans a release")])
def test_the_noise_calibration_refuses_what_no_accountant_can_spend_and_says_why(call, words):
    """Each bound on its own (a check joined with `and` instead of `or` passes a bad rate with a good delta)."""
    with pytest.raises(ValueError, match=re.escape(words)):
        call()


def test_one_partys_history_calibrates_as_the_rounds_do(private_cache):
    """noise_for_histories with one party that releases every round is noise_for_epsilon's calibration, and the
    party that spends most decides: a second, lighter history changes nothing."""
    z = noise_for_epsilon(2.0, 1e-5, 0.5, 3)
    assert privacy.noise_for_histories(2.0, 1e-5, [[(0.5, 3)]]) == pytest.approx(z, rel=1e-6)
    assert privacy.noise_for_histories(2.0, 1e-5, [[(0.5, 3)], [(0.5, 1)], []]) == pytest.approx(z, rel=1e-6)


def test_noise_for_epsilon_round_trips_and_is_cached(private_cache):
    start = time.perf_counter()
    z = noise_for_epsilon(2.0, 1e-5, 0.5, 3)
    first = time.perf_counter() - start
    ledger = RdpLedger(z, 0.5)
    for _ in range(3):
        ledger.step()
    eps = ledger.epsilon(1e-5)
    assert eps <= 2.0 and eps == pytest.approx(2.0, rel=0.01)
    # the step count is the number of rounds: epochs=3 would have meant 3/q = 6 steps and less epsilon per z
    assert opacus_epsilon(z, 0.5, 6, 1e-5) > 2.2
    start = time.perf_counter()
    assert noise_for_epsilon(2.0, 1e-5, 0.5, 3) == z
    assert time.perf_counter() - start < 0.01 < first
    stored = json.loads(private_cache.read_text())
    assert list(stored.values()) == [z]
    privacy._cached.cache_clear()           # a new process: the file answers
    start = time.perf_counter()
    assert noise_for_epsilon(2.0, 1e-5, 0.5, 3) == z
    assert time.perf_counter() - start < 0.1


@pytest.mark.parametrize("params", [{}, {"noise_multiplier": 1.0, "target_epsilon": 2.0},
                                    {"noise_multiplier": 0.0}, {"noise_multiplier": 1.0, "clip": 0.0}])
def test_bad_params_fail_in_one_line(params):
    for cls in (DPFedAvg, DPFedAvgLocal):
        with pytest.raises(ValueError) as err:
            cls.check_params(params)
        assert "\n" not in str(err.value) and "dp-fedavg" in str(err.value)


@pytest.mark.parametrize("inner", ["dp-fedavg-local", "dp-sgd", "selectiveshield", "sensecrypt-dp"])
def test_inner_cannot_be_dp(inner):
    with pytest.raises(ValueError, match="itself DP"):
        DPFedAvg(noise_multiplier=1.0, inner=inner, inner_params={"noise_multiplier": 1.0})


# ------------------------------------------------------------------------------ end to end

@pytest.fixture
def epsilon_metrics():
    """The run-metric schema entries metrics/run.py carries, registered here if absent."""
    from bench.protocol.evidence import metric, run_value
    rows = [("epsilon", True, "privacy"), ("noise_multiplier", None, "privacy"), ("clip", None, "privacy"),
            ("upload_noise_multiplier", None, "privacy")]
    added = [name for name, *_ in rows if name not in METRICS]
    for name, lower, kind in rows:
        if name in added:
            metric(name, "", lower, kind, name, per_target=False)(run_value(name))
    yield
    for name in added:
        METRICS._entries.pop(name, None)


@pytest.mark.parametrize("name", ["dp-fedavg", "dp-fedavg-local"])
def test_run_accounts_every_round(name, data, scenario, epsilon_metrics):
    """Every other client: each round at q; the attacked client: its forced attack round (round 0) at q = 1."""
    defense = DEFENSES.get(name)(noise_multiplier=1.0, clip=CLIP)
    run = run_federation(scenario, data, defense)
    assert defense.ledger.steps == defense.attacked.steps == scenario.rounds
    assert defense.ledger.history == [(1.0, scenario.clients_per_round / scenario.num_clients, scenario.rounds)]
    assert defense.attacked.history == [(1.0, 1.0, 1), (1.0, 0.5, 2)]
    attacked = RDPAccountant()
    attacked.history = [(1.0, 1.0, 1), (1.0, 0.5, 2)]
    assert run.metrics["epsilon_rdp"] == pytest.approx(attacked.get_epsilon(delta=scenario.delta), rel=1e-12)
    assert run.metrics["epsilon"] == min(run.metrics["epsilon_rdp"], run.metrics["epsilon_prv"])
    assert run.metrics["epsilon_other_clients"] == readings([(1.0, 0.5, 3)], scenario.delta)["epsilon"]
    assert run.metrics["epsilon_other_clients"] <= opacus_epsilon(1.0, 0.5, 3, scenario.delta) < \
        run.metrics["epsilon_rdp"]
    assert run.metrics["noise_multiplier"] == 1.0 and run.metrics["clip"] == CLIP
    assert run.details["dp"]["sample_rate"] == 0.5 and run.details["dp"]["steps"] == 3
    assert run.details["dp"]["attacked_client"] == "client-0" and run.details["dp"]["level"] == "user"
    assert run.details["key_topology"] == "none"
    from bench.run.cells import _run_metrics
    assert _run_metrics(run.metrics)["epsilon"] == run.metrics["epsilon"]


def test_central_view_is_clipped_but_not_noised(data, scenario):
    run = run_federation(scenario, data, DPFedAvg(noise_multiplier=1.0, clip=CLIP))
    assert run.metrics["upload_noise_multiplier"] == 0.0
    for target in run.targets:
        assert l2(target.truth.update) > CLIP
        assert l2(target.view.values) <= CLIP + 1e-5
        clipped, _ = clip_update(target.truth.update, CLIP)
        for n, v in target.view.values.items():
            torch.testing.assert_close(v, clipped[n], rtol=0, atol=1e-7)


def test_local_view_is_noised(data, scenario):
    run = run_federation(scenario, data, DPFedAvgLocal(noise_multiplier=1.0, clip=CLIP))
    assert run.metrics["upload_noise_multiplier"] == pytest.approx(1 / math.sqrt(2))
    for target in run.targets:
        clipped, _ = clip_update(target.truth.update, CLIP)
        noise = torch.cat([(target.view.values[n] - clipped[n]).reshape(-1) for n in clipped])
        assert float(noise.std()) == pytest.approx(CLIP / math.sqrt(2), rel=0.02)


# ------------------------------------------------------------------------------ noise on the wire

def _round(defense, data, scenario, weights=(0.5, 0.5), updates=None):
    """One round by hand on a real federation: returns (fed, uploads, aggregate)."""
    fed = build_federation(scenario, data)
    defense.setup(fed)
    fed.round = 0
    zeros = {n: torch.zeros(s) for n, s in fed.shapes.items()}
    updates = updates or [zeros, zeros]
    clients = fed.clients[:len(updates)]
    defense.round_start(fed, 0, clients, {c.name: u for c, u in zip(clients, updates)})
    uploads = [Upload(c.name, 0, w, defense.encode(fed, c, u, w)) for c, u, w in zip(clients, updates, weights)]
    return fed, uploads, defense.aggregate(fed, uploads, fed.parties["server"])


def _values(x: Payload | Upload) -> np.ndarray:
    payload = x.payload if isinstance(x, Upload) else x
    return np.concatenate([p.values() for p in payload.plain.values()])


def test_noise_std_comes_from_the_ledger(data, scenario):
    z, m = 2.0, 2
    _, uploads, aggregate = _round(DPFedAvg(noise_multiplier=z, clip=CLIP), data, scenario)
    assert not _values(uploads[0]).any()                        # central: uploads carry no noise
    assert _values(aggregate).std() == pytest.approx(z * CLIP / m, rel=0.02)
    _, uploads, aggregate = _round(DPFedAvgLocal(noise_multiplier=z, clip=CLIP), data, scenario)
    assert _values(uploads[0]).std() == pytest.approx(z * CLIP / math.sqrt(m), rel=0.02)
    assert _values(aggregate).std() == pytest.approx(z * CLIP / m, rel=0.02)


def test_uniform_weights_not_sample_shares(data, scenario):
    """Sample-share weights would let one client move the average by w*C > C/m (pitfall 11c)."""
    fed = build_federation(scenario, data)
    a = {n: torch.full(s, 1.0) for n, s in fed.shapes.items()}
    b = {n: torch.full(s, -1.0) for n, s in fed.shapes.items()}
    _, _, aggregate = _round(DPFedAvg(noise_multiplier=1e-6, clip=CLIP), data, scenario, (0.9, 0.1), [a, b])
    assert np.abs(_values(aggregate)).max() < 1e-6


def test_noise_needs_an_accounted_round(data, scenario):
    for cls in (DPFedAvg, DPFedAvgLocal):
        defense = cls(noise_multiplier=1.0, clip=CLIP)
        fed = build_federation(scenario, data)
        defense.setup(fed)
        fed.round = 0
        defense._sampled = 2                      # skip round_start: the ledger has not been stepped
        zeros = {n: torch.zeros(s) for n, s in fed.shapes.items()}
        with pytest.raises(RuntimeError, match="ledger"):
            uploads = [Upload(c.name, 0, 0.5, defense.encode(fed, c, zeros, 0.5)) for c in fed.clients[:2]]
            defense.aggregate(fed, uploads, fed.parties["server"])


def test_wrong_sample_rate_is_refused(data, scenario):
    defense = DPFedAvg(noise_multiplier=1.0)
    fed = build_federation(scenario, data)
    defense.setup(fed)
    with pytest.raises(RuntimeError, match="sampled 3 clients under fixed-size sampling"):
        defense.round_start(fed, 0, fed.clients[:3], {})
    other = build_federation(replace(scenario, num_clients=8), load_dataset("digits", None, max_train=300))
    with pytest.raises(RuntimeError, match="ledger accounts q=0.5"):   # a ledger set up for another scenario
        defense.round_start(other, 0, other.clients[:2], {})


def test_poisson_rounds_use_the_fixed_denominator(data, scenario):
    """Poisson sampling: m varies, the estimate is sum / clients_per_round and the sum's noise stays z*C."""
    poisson = replace(scenario, sampling="poisson", rounds=4)
    defense = DPFedAvgLocal(noise_multiplier=1.0, clip=CLIP)
    run = run_federation(poisson, data, defense)
    assert defense.ledger.history == [(1.0, 0.5, 4)]
    assert defense.attacked.history == [(1.0, 1.0, 1), (1.0, 0.5, 3)]   # Poisson too forces it into round 0
    assert run.details["dp"]["sampling"] == "Poisson at rate q"
    assert run.metrics["upload_noise_multiplier"] == pytest.approx(1 / math.sqrt(defense._most))
    fed = build_federation(poisson, data)
    ones = {n: torch.full(s, 1.0) for n, s in fed.shapes.items()}
    _, _, aggregate = _round(DPFedAvg(noise_multiplier=1e-6, clip=CLIP), data, poisson, (0.2, 0.3, 0.5),
                             [ones, ones, ones])
    expected = 3 * CLIP / math.sqrt(sum(t.numel() for t in ones.values())) / 2
    assert np.allclose(_values(aggregate), expected, rtol=1e-3)   # 1.5x the mean: 3 clients over W=2


class _SealedInner(Defense):
    """Stands in for an HE inner defense: the first parameter travels as an opaque part."""

    key_topology = "key-server"

    def aggregate(self, fed, uploads, server):
        first = fed.names[0]
        plain = super().aggregate(fed, uploads, server).plain
        mask = np.ones(int(np.prod(fed.shapes[first])), bool)
        sealed = CipherPart("sealed", (b"",), ((first, mask),), int(mask.sum()))
        return Payload(plain={n: p for n, p in plain.items() if n != first}, cipher=(sealed,))

    def decode(self, fed, aggregate, party):
        out = {n: torch.zeros(s) for n, s in fed.shapes.items()}
        for n, p in aggregate.plain.items():
            out[n] = p.dense()
        return out


def test_ciphertext_positions_are_noised_by_the_decoder(data, scenario):
    defense = DPFedAvg(noise_multiplier=2.0, clip=CLIP)
    defense.inner = _SealedInner()
    defense.key_topology = defense.inner.key_topology
    fed, _, aggregate = _round(defense, data, scenario)
    first = fed.names[0]
    assert first not in aggregate.plain and aggregate.cipher
    party = defense.decoder(fed)
    assert party.name == "key-server"
    update = defense.decode(fed, aggregate, party)
    assert float(update[first].std()) == pytest.approx(2.0 * CLIP / 2, rel=0.02)
    rest = torch.cat([update[n].reshape(-1) for n in fed.names[1:]])
    torch.testing.assert_close(rest.numpy(), _values(aggregate))     # plaintext positions noised once, by the server


def test_target_epsilon_is_met_by_the_run(data, scenario, private_cache):
    """The plan is the attacked client's: one round at q = 1 (forced in) and two at q; calibrated by RDP, so its
    RDP reading meets the target within the bisection's tolerance, and the headline is at most that."""
    defense = DPFedAvgLocal(target_epsilon=2.0, clip=CLIP)
    run = run_federation(scenario, data, defense)
    assert run.metrics["noise_multiplier"] > noise_for_epsilon(2.0, scenario.delta, 0.5, scenario.rounds)
    assert run.metrics["epsilon_rdp"] <= 2.0 and run.metrics["epsilon_rdp"] == pytest.approx(2.0, rel=0.01)
    assert run.metrics["epsilon"] <= run.metrics["epsilon_rdp"]
    assert run.metrics["epsilon_other_clients"] < 2.0 * 0.9   # the sampled-only clients spend less
    assert run.details["dp"]["target_epsilon"] == 2.0
    everyone = DPFedAvgLocal(target_epsilon=2.0, clip=CLIP)   # every client every round: q = 1, nothing forced
    full = run_federation(replace(scenario, clients_per_round=4), data, everyone)
    assert full.metrics["noise_multiplier"] == noise_for_epsilon(2.0, scenario.delta, 1.0, scenario.rounds)


# --------------------------------------------------------------------------- composition with every defense

def _inner_cases():
    from bench.registry import DEFENSES as REG
    from tests.test_e2e_grid import GRID_DEFENSES
    params = dict(GRID_DEFENSES) | {"gaussian-noise": {"sigma": 0.0}}   # its data-independent noise off: exactness
    return [(n, params.get(n, {})) for n in REG.builtins() if not REG.get(n).differentially_private]


@pytest.mark.parametrize("inner,params", _inner_cases(), ids=[n for n, _ in _inner_cases()])
def test_dp_composes_exactly_or_refuses_at_load(inner, params, tmp_path, capsys):
    """Every defense: DP-FedAvg around it decodes sum / W of the clipped updates, or the suite does not load."""
    from bench.cli import main
    from bench.federation.engine import local_update

    inner_cls = DEFENSES.get(inner)
    if not inner_cls.decodes_weighted_sum:
        with pytest.raises(ValueError, match=f"inner defense '{inner}' does not decode the weighted sum"):
            DPFedAvg(noise_multiplier=1.0, inner=inner, inner_params=params)
        suite = tmp_path / "s.toml"
        suite.write_text(f'name = "s"\n[[scenarios]]\nname = "t"\ndataset = "digits"\nmodel = "mlp"\n'
                         f'[[defenses]]\nname = "dp-fedavg"\nparams = {{noise_multiplier = 1.0, inner = "{inner}"}}\n'
                         f'[[attacks]]\nname = "ilrg"\n')
        assert main(["run", str(suite), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert "does not decode the weighted sum" in err and "\n" not in err
        return
    sc = Scenario(name="compose", dataset="digits", model="mlp-tiny", model_params={"hidden": 4}, num_clients=3,
                  clients_per_round=3, rounds=1, max_train=90, max_test=30, local_epochs=1, batch_size=16, lr=0.5)
    dp = DPFedAvg(noise_multiplier=1e-9, clip=0.05, inner=inner, inner_params=params)
    fed = build_federation(sc, load_dataset("digits", None), dp)
    dp.setup(fed)
    fed.round = 0
    updates = {c.name: local_update(fed, c, c.x, c.y, "delta", torch.Generator().manual_seed(c.index))
               for c in fed.clients}
    dp.round_start(fed, 0, fed.clients, updates)
    uploads = weighted_uploads(fed, dp, updates)
    decoded = dp.decode(fed, dp.aggregate(fed, uploads, fed.parties["server"]), dp.decoder(fed))
    clipped = [clip_update(updates[c.name], 0.05)[0] for c in fed.clients]
    for n in fed.names:
        expected = sum(u[n].double() for u in clipped) / 3
        assert torch.allclose(decoded[n].double(), expected, atol=1e-5), (inner, n)
    assert max(float(expected.abs().max()) for expected in (sum(u[n] for u in clipped) for n in fed.names)) > 1e-3
