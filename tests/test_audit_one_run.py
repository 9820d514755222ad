"""The one-run audit (Steinke, Nasr, Jagielski 2023): its epsilon bound against jax_privacy's on the same guess
counts, a DP-SGD step audited below its accountant, one plaintext upload read through its canaries (and nothing
without them), a local-DP upload below its accountant, and the scenario checks."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attacks.audit.one_run import AuditOneRun
from bench.federation.accounting import RdpLedger
from bench.federation.scenario import Scenario, SpecError
from bench.protocol.view import Canary, ServerView
from bench.run.cells import run_group
from bench.run.preflight import preflight
from metrics.audit import guess_grid, one_run_audit, one_run_bound
from tests.conftest import tiny_suite

# jax_privacy's auditing._epsilon_one_run(0, m, r, v, alpha, delta) (google-deepmind/jax_privacy @ 8967688), run
# in a separate environment on these counts: (m, r, v, delta, alpha) -> epsilon
JAX_PRIVACY = [((1000, 1000, 1000, 1e-5, 0.05), 5.782283131572193),
               ((1000, 512, 512, 1e-5, 0.005), 4.462387347173916),
               ((1000, 600, 540, 1e-5, 0.05), 1.9682852940701372),
               ((400, 400, 400, 1e-5, 0.05), 4.879779670489499),
               ((1000, 64, 60, 1e-5, 0.05), 1.8287321924173248),
               ((100, 40, 35, 1e-5, 0.05), 1.1244299002051341),
               ((1000, 200, 150, 1e-6, 0.05), 0.8212543847531151),
               ((64, 64, 64, 1e-5, 0.0125), 2.643356508162937)]


@pytest.mark.parametrize("counts,expected", JAX_PRIVACY)
def test_the_bound_equals_jax_privacys_on_the_same_counts(counts, expected):
    m, r, v, delta, alpha = counts
    assert one_run_bound(m, r, v, delta, alpha) == pytest.approx(expected, abs=1e-5)


def test_the_pure_dp_bound_is_the_hand_calculation_and_chance_certifies_nothing():
    q = 0.05 ** (1 / 200)                        # P[Binomial(200, q) >= 200] = q^200 = alpha
    assert one_run_bound(1000, 200, 200, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    rng = np.random.default_rng(0)
    assert one_run_audit(rng.normal(size=1000), rng.integers(0, 2, 1000), 1e-5)["bound"] == 0.0
    assert guess_grid(1000) == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]


@pytest.mark.parametrize("z", [1.0, 2.0])
def test_a_dp_sgd_step_audits_below_its_accountant(z):
    """One DP-SGD step with 1000 Dirac gradient canaries, each clipped to C = 1 and summed with N(0, (zC)^2): the
    white-box setting of the paper; over six draws the bound is positive and stays under the accountant's epsilon."""
    ledger = RdpLedger(z, 1.0)
    ledger.step()
    accountant = ledger.epsilon(1e-5)
    m = 1000
    canary = Canary("one-run", update={"w": torch.ones(m)}, owner={"w": torch.arange(m)}, count=m)
    knowledge = SimpleNamespace(canary=canary, uploads_weights=False, delta=1e-5)
    bounds = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        inside = rng.integers(0, 2, m)
        noisy = torch.from_numpy(inside + rng.normal(0.0, z, m)).float()
        view = ServerView({"w": noisy}, {"w": torch.ones(m, dtype=torch.bool)}, (), {}, 1.0)
        scores = AuditOneRun().run(view, knowledge, seed).scores
        bounds.append(one_run_audit(scores, inside, 1e-5)["bound"])
    assert 0.0 < min(bounds) and max(bounds) < accountant, (bounds, accountant)


def _one_run_cell(defense, **scenario):
    setting = dict(model="mlp-tiny", canary="one-run", canaries=256, num_clients=1, clients_per_round=1, rounds=1,
                   max_train=60) | scenario
    suite = tiny_suite([defense], ["audit-one-run"], **setting)
    preflight(suite, None)
    [rec] = run_group(list(suite.cells), None)
    assert rec["status"] == "ok", rec["reason"]
    return rec


def test_one_plaintext_upload_reads_every_canary():
    rec = _one_run_cell("plaintext")
    audit = rec["details"]["one_run_audit"]
    assert audit["canaries"] == audit["scored"] == 256 and audit["correct"] >= audit["guesses"] - 1 >= 127
    grid = guess_grid(256)
    most = max(one_run_bound(256, r, r, 1e-5, 0.05 / len(grid)) for r in grid)   # every guess right: 3.89
    assert 3.0 < rec["metrics"]["one_run_epsilon"] <= most and rec["metrics"]["mia_auroc"] > 0.99
    assert "audited_epsilon" not in rec["metrics"]          # the trials' bound does not apply to one run


def test_without_its_canaries_the_one_run_bound_is_zero(monkeypatch):
    """The same run with the planting removed: what is left to read is the client's own update."""
    from bench.federation import engine
    monkeypatch.setattr(engine, "trial_update", lambda canary, update, included: update)
    rec = _one_run_cell("plaintext")
    assert rec["metrics"]["one_run_epsilon"] == 0.0 and rec["metrics"]["mia_auroc"] < 0.6


def test_a_local_dp_upload_audits_below_its_accountant():
    """Every canary shares the upload's clip, so each carries about C / sqrt(128) of it against noise zC: far
    below the accountant, which counts the whole upload."""
    rec = _one_run_cell(("dp-fedavg-local", {"noise_multiplier": 1.0, "clip": 1.0}))
    assert rec["metrics"]["one_run_epsilon"] < rec["metrics"]["epsilon"]


@pytest.mark.parametrize("fields,fault", [({"canaries": 50}, "set canary = \"one-run\""),
                                          ({"canary": "one-run", "attack_repeats": 3}, "attack_repeats = 1"),
                                          ({"canary": "one-run", "canaries": 1}, "canaries >= 2")])
def test_one_run_settings_are_checked_at_load(fields, fault):
    with pytest.raises(SpecError, match=fault):
        Scenario(name="s", dataset="digits", model="mlp", **fields)


def test_the_trial_audit_refuses_a_one_run_scenario():
    suite = tiny_suite(["plaintext"], ["audit-canary"], model="mlp-tiny", canary="one-run", canaries=64)
    with pytest.raises(SpecError, match="audit it with audit-one-run"):
        preflight(suite, None)
