"""Privacy auditing on one scale: the Clopper-Pearson epsilon lower bound by hand, a DP audit that stays under its
accountant, secure aggregation's empty view, and the blind baseline of a membership split."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from bench.protocol.view import hidden_leak_free
from bench.run.cells import run_group
from bench.run.preflight import preflight
from metrics.audit import ALPHA, clopper_pearson_upper, epsilon_lower_bound
from metrics.blind import blind_auroc
from tests.conftest import tiny_suite


def test_clopper_pearson_upper_bound_matches_the_binomial_tail():
    level = 1 - ALPHA / 2
    assert clopper_pearson_upper(0, 100, level) == pytest.approx(1 - (ALPHA / 2) ** (1 / 100))
    for k, n in ((3, 50), (17, 200)):
        upper = clopper_pearson_upper(k, n, level)
        assert binom.cdf(k, n, upper) == pytest.approx(ALPHA / 2, rel=1e-6)   # the defining tail equation
    assert clopper_pearson_upper(40, 40, level) == 1.0


def test_the_bound_on_a_perfect_test_is_the_hand_calculation():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 400)
    scores = labels + rng.normal(0.0, 0.01, 400)          # separable: the held-apart half has no error
    audit = epsilon_lower_bound(scores, labels, delta=1e-5)
    n, p = audit["negatives"], audit["positives"]
    assert audit["false_positives"] == audit["false_negatives"] == 0 and n + p == 200
    fpr, fnr = 1 - (ALPHA / 2) ** (1 / n), 1 - (ALPHA / 2) ** (1 / p)
    hand = max(math.log((1 - 1e-5 - fpr) / fnr), math.log((1 - 1e-5 - fnr) / fpr))
    assert audit["bound"] == pytest.approx(hand, rel=1e-9)
    chance = epsilon_lower_bound(rng.normal(size=400), labels, delta=1e-5)
    assert chance["bound"] == 0.0                           # guessing supports no leak
    few = epsilon_lower_bound(scores[:30], labels[:30], delta=1e-5)
    assert few["bound"] is None and "trials of each kind" in few["why"]


def _audit_cell(defense, **scenario):
    suite = tiny_suite([defense], ["audit-canary"], model="mlp-tiny", canary="gradient", **scenario)
    preflight(suite, None)
    [rec] = run_group(list(suite.cells), None)
    return rec


def test_a_local_dp_audit_stays_under_its_accountant_and_plaintext_leaks_more():
    """One client, one round, noise multiplier 1: each upload is the Gaussian mechanism the accountant counts."""
    setting = dict(num_clients=1, clients_per_round=1, rounds=1, attack_repeats=400, max_train=60)
    dp = _audit_cell(("dp-fedavg-local", {"noise_multiplier": 1.0, "clip": 1.0}), **setting)
    plain = _audit_cell("plaintext", **setting)
    assert dp["status"] == plain["status"] == "ok"
    audited, accountant = dp["metrics"]["audited_epsilon"], dp["metrics"]["epsilon"]
    assert 0.3 < audited < accountant, (audited, accountant)
    assert plain["metrics"]["audited_epsilon"] > audited
    assert dp["details"]["audit"]["trials"] == 400


def test_secure_aggregation_hides_every_upload_and_keeps_the_sum():
    from bench.data import load_dataset
    from bench.federation.engine import run_federation
    from bench.federation.scenario import Scenario
    from bench.registry import DEFENSES

    sc = Scenario(name="secagg", dataset="digits", model="mlp-tiny", num_clients=4, clients_per_round=3, rounds=2,
                  max_train=120, max_test=40)
    data = load_dataset("digits", None, max_train=120, max_test=40)
    masked = run_federation(sc, data, DEFENSES.get("secagg")())
    plain = run_federation(sc, data, DEFENSES.get("plaintext")())
    view = masked.targets[0].view
    assert view.visible_fraction() == 0.0 and hidden_leak_free(view) and view.ciphertext_sizes
    assert masked.metrics["accuracy"] == plain.metrics["accuracy"]          # the masks cancel in the sum
    assert masked.metrics["upload_bytes"] == pytest.approx(2 * plain.metrics["upload_bytes"], rel=0.01)
    assert masked.details["key_topology"] == "pairwise-masks"


def test_a_masked_upload_is_not_the_update():
    from bench.crypto import masking

    values = np.linspace(-1, 1, 64)
    keys = {1: bytes(range(32)), 2: bytes(range(1, 33))}
    up0 = masking.masked(values, keys, 0, round=0)
    up1 = masking.masked(2 * values, {0: keys[1], 2: bytes(range(2, 34))}, 1, round=0)
    up2 = masking.masked(-values, {0: keys[2], 1: bytes(range(2, 34))}, 2, round=0)
    assert not np.allclose(masking.decode(up0), values, atol=1e-3)
    assert np.allclose(masking.decode(masking.ring_sum([up0, up1, up2])), 2 * values, atol=1e-8)


def test_the_blind_baseline_finds_a_split_that_leaks_by_itself():
    rng = np.random.default_rng(0)
    n, seq = 200, 24
    x = torch.from_numpy(rng.integers(5, 1000, size=(2 * n, seq)))
    member = np.r_[np.ones(n, int), np.zeros(n, int)]
    lengths = np.r_[rng.integers(18, 24, n), rng.integers(6, 12, n)]   # members longer: the split leaks
    skewed = x.clone()
    for i, length in enumerate(lengths):
        skewed[i, length:] = 0
    y = torch.zeros(2 * n, dtype=torch.int64)
    assert blind_auroc(skewed, y, member, 2, pad_id=0) > 0.9
    fair = x.clone()
    for i, length in enumerate(rng.integers(6, 24, 2 * n)):
        fair[i, length:] = 0
    assert blind_auroc(fair, y, member, 2, pad_id=0) < 0.6
