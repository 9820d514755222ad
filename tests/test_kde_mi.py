"""KDE mutual information: the known orderings of shared information, determinism, and the metric wrapper."""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.evidence import Evidence, Truth
from bench.protocol.view import ServerView
from bench.protocol.wire import Payload, PlainPart, Upload, dense_payload
from metrics.leakage import kde_mi, kde_mutual_information


def gaussian(n: int = 20_000, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n)


def test_identical_vectors_share_much():
    x = gaussian()
    assert kde_mutual_information(x, x) > 1.0


def test_independent_noise_shares_nothing():
    for seed in range(3):
        rng = np.random.default_rng(seed)
        assert kde_mutual_information(rng.normal(size=20_000), rng.normal(size=20_000), seed=seed) < 0.05


def test_half_hidden_is_in_between():
    x = gaussian()
    half = np.where(np.random.default_rng(7).random(x.size) < 0.5, x, 0.0)
    full, partial = kde_mutual_information(x, x), kde_mutual_information(x, half)
    noise = kde_mutual_information(x, np.random.default_rng(8).normal(size=x.size))
    assert noise < partial < full


def test_deterministic_for_a_seed():
    x = gaussian()
    s = x + 0.5 * np.random.default_rng(2).normal(size=x.size)
    first = kde_mutual_information(x, s, seed=5)
    assert first == kde_mutual_information(x, s, seed=5)
    assert first != kde_mutual_information(x, s, seed=6)


def test_constant_view_and_bandwidth():
    x = gaussian(500)
    assert kde_mutual_information(x, np.zeros_like(x)) == 0.0
    assert kde_mutual_information(x, x, bandwidth=0.5) < kde_mutual_information(x, x, bandwidth=0.1)


def test_metric_reads_truth_and_view():
    gen = torch.Generator().manual_seed(0)
    update = {"w": torch.randn(40, 50, generator=gen), "b": torch.randn(40, generator=gen)}
    shapes = {n: tuple(t.shape) for n, t in update.items()}
    truth = Truth(torch.zeros(1), torch.zeros(1, dtype=torch.long), update)
    plain = ServerView.of(Upload("c", 0, 1.0, dense_payload(update)), shapes)
    half = np.random.default_rng(0).random(40 * 50) < 0.5
    partial = ServerView.of(Upload("c", 0, 1.0, Payload(plain={"w": PlainPart.of(update["w"], half)})), shapes)
    hidden = ServerView.of(Upload("c", 0, 1.0, Payload()), shapes)
    values = [kde_mi(Evidence(truth=truth, view=v)) for v in (plain, partial, hidden)]
    assert values[0] > values[1] > values[2] == 0.0
    assert kde_mi(Evidence(view=plain)) is None and kde_mi(Evidence(truth=truth)) is None
