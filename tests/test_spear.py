"""SPEAR on small cases: every step of the algebra (attacks/gradient/spear_solve.py) against the true batch, each
test able to fail when its step is taken out, and the attack end to end on the digits MLP, a partial view, a
CNN's first fully connected layer and a model it does not apply to."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

import attacks.gradient.spear_select as sp
import attacks.gradient.spear_solve as ss
from attacks.gradient.spear import SPEAR, complete, layer_input, relu_linears
from bench.federation.scenario import SpecError
from bench.protocol.view import ServerView
from bench.protocol.wire import Payload, PlainPart, Upload
from bench.run.cells import federate, run_group
from bench.run.preflight import preflight
from bench.run.spec import load_suite
from tests.conftest import tiny_suite

UNIFORM = {"prior_steps": 0, "samples": 3000, "rounds": 2}   # the paper's uniform sampling: enough at B = 6


def _target(defense: str = "plaintext", model: str = "mlp", batch: int = 6, **scenario):
    cell = tiny_suite([defense], [("spear", UNIFORM)], model=model, attack_batch_size=batch, **scenario).cells[0]
    return federate(cell, None).targets[0]


def _truth(t, layer: str = "1"):
    """The layer's true inputs X and D = (dL/dZ)^T, read off the gradient G = D X."""
    x = layer_input(t.knowledge.build_model(), layer, t.truth.x).double()
    g = t.knowledge.gradient(t.view, f"{layer}.weight").double()
    d = torch.linalg.lstsq(x.T, g.T).solution.T
    return x, d, g


def _true_directions(f: ss.Factors, d: torch.Tensor) -> torch.Tensor:
    q = torch.linalg.lstsq(f.L, d[f.rows]).solution
    return q / q.norm(dim=0)


def _pool(t, min_zeros=None, count=3000):
    x, d, g = _truth(t)
    batch = x.shape[0]
    f = ss.decompose(g, batch)
    pool = ss.Pool(batch, min_zeros if min_zeros is not None else int(0.25 * len(f.rows)))
    pool.add(f, ss.uniform_subsets(len(f.rows), batch, count, torch.Generator().manual_seed(0)))
    return f, pool, _true_directions(f, d)


def test_the_gradient_is_low_rank_and_its_factors_hold_the_batch():
    t = _target()
    x, d, g = _truth(t)
    f = ss.decompose(g, 6)
    assert f.tail < 1e-6                                      # rank B up to float32 rounding
    q = _true_directions(f, d)
    s = sp.scales(f, q, t.knowledge.gradient(t.view, "1.bias"), t.knowledge.global_params["1.weight"],
                  t.knowledge.global_params["1.bias"])
    assert torch.allclose(sp.inputs(f, q, s), x, atol=1e-4)   # X = Q^{-1} R with the bias-gradient scales
    wrong = sp.inputs(f, q, torch.ones_like(s))
    assert not torch.allclose(wrong, x, atol=1e-2)            # without the scales it is not the batch


def _samples_mixed(pool: ss.Pool, truth: torch.Tensor) -> list[int]:
    """How many of the batch's directions each pool direction combines (1: it is one of them)."""
    coef = torch.linalg.solve(truth, pool.q.T).abs()
    return [int((c > 1e-4 * c.max()).sum()) for c in coef.T]


def test_the_sparsity_filter_keeps_the_batchs_directions_and_mixes_of_two_at_most():
    """The filtered pool holds every column of the true Q, and besides them only mixes of two samples whose zero
    sets overlap (digits share most of their off-neurons); with the filter taken out (every proposal has its
    B - 1 forced zeros) it fills with generic mixes of many samples."""
    t = _target()
    f, pool, truth = _pool(t)
    assert len({int(i) for i in (pool.q @ truth).abs().argmax(1)[(pool.q @ truth).abs().max(1).values > 1 - 1e-6]}) == 6
    assert max(_samples_mixed(pool, truth)) <= 2
    _, unfiltered, truth = _pool(t, min_zeros=5, count=300)
    assert max(_samples_mixed(unfiltered, truth)) > 2


def test_on_a_narrow_layer_the_papers_threshold_keeps_every_sample_and_the_chance_measure_does_not():
    """SenseCrypt's FCN on digits (64 inputs, 64 neurons): uniform draws hit samples and their mixes so often that
    the chance measure's threshold passes most samples' zero counts; the attack's `chance = False` keeps the
    paper's threshold, under which the filtered pool holds the whole batch."""
    t = _target(model="fcn")
    x, d, g = _truth(t)
    f = ss.decompose(g, 6)
    truth = _true_directions(f, d)
    kept = {}
    for chance in (True, False):
        rec = SPEAR(**UNIFORM, chance=chance).run(t.view, t.knowledge, seed=0)
        pool = ss.Pool(6, rec.extra["min_zeros"])
        pool.add(f, ss.uniform_subsets(len(f.rows), 6, 3000, torch.Generator().manual_seed(1)))
        kept[chance] = int(((pool.q @ truth).abs() > 1 - 1e-6).any(0).sum())
    assert kept[False] == 6 and kept[True] < 6


def test_the_greedy_selection_is_exact_and_needs_its_score():
    """Selection from a pool holding the batch's directions and a mix of two of them: the sparsity-matching
    score picks the true set (score 1); the mix, which is sparser than one of them, would be taken by
    sparsity alone."""
    t = _target()
    f, pool, truth = _pool(t)
    weight, bias = (t.knowledge.global_params[f"1.{k}"] for k in ("weight", "bias"))
    bias_grad = t.knowledge.gradient(t.view, "1.bias")
    zero = (f.unit @ truth).abs() < f.tol[:, None]
    pairs = [(i, j) for i in range(6) for j in range(6) if i != j]
    a, b = max(pairs, key=lambda p: int((zero[:, p[0]] & zero[:, p[1]]).sum()))   # the pair sharing most off-rows
    mix = torch.nn.functional.normalize(truth[:, a] + truth[:, b], dim=0)
    pool.q = torch.cat([pool.q, mix[None]])
    pool.zeros.append(10 ** 6)        # ranked first
    pool.hits.append(1)
    pool.owner.append(-1)
    sel = sp.select(f, pool, bias_grad, weight, bias)
    assert sp.exact(f, sel.score)
    x, _, _ = _truth(t)
    assert torch.allclose(sel.x[_order(sel.x, x)], x, atol=1e-4)
    greedy_only = sp.select(f, pool, bias_grad, weight, bias, swap_pool=0)
    assert not sp.exact(f, greedy_only.score)


def test_swaps_give_up_a_true_column_only_for_an_exact_selection():
    """Two columns hold mixes (samples 0 and 2, each with sample 1): swapping in every column raises the score by
    trading the true column of sample 1 for another mix, and the selection is still not exact. `swaps` keeps the
    true columns then, and completes the selection where the missing samples are among the options."""
    t = _target()
    f, pool, truth = _pool(t)
    weight, bias = (t.knowledge.global_params[f"1.{k}"] for k in ("weight", "bias"))
    bias_grad = t.knowledge.gradient(t.view, "1.bias")
    batch = truth.shape[1]

    def mix(i, j, a=1.0):
        return torch.nn.functional.normalize(truth[:, i] + a * truth[:, j], dim=0)

    options = [(-2, mix(i, j, a)) for i in range(batch) for j in range(batch) if i != j for a in (0.5, 1.0, 2.0)]
    q = truth.clone()
    q[:, 0], q[:, 2] = mix(0, 1), mix(2, 1)
    chosen = [-1, 1, -1, 3, 4, 5]
    kept = [1, 3, 4, 5]
    wide = sp.improve(f, q, chosen, options, list(range(batch)), bias_grad, weight, bias)
    assert not sp.exact(f, wide[2]) and not torch.equal(wide[0][:, kept], truth[:, kept])   # the hazard
    q2, _, score = sp.swaps(f, q, chosen, options, [0, 2], bias_grad, weight, bias)
    assert not sp.exact(f, score) and torch.equal(q2[:, kept], truth[:, kept])
    q3, _, score = sp.swaps(f, q, chosen, options + [(-2, truth[:, 0]), (-2, truth[:, 2])], [0, 2], bias_grad,
                            weight, bias)
    assert sp.exact(f, score)


def _order(rec: torch.Tensor, x: torch.Tensor) -> list[int]:
    return [int((rec - x[i]).norm(dim=1).argmin()) for i in range(len(x))]


def test_a_mix_of_two_samples_yields_both_in_its_plane():
    t = _target()
    f, pool, truth = _pool(t)
    mix = torch.nn.functional.normalize(0.8 * truth[:, 0] - 0.3 * truth[:, 1], dim=0)
    found = ss.plane_directions(f, mix, truth[:, 1], 10)
    best = sorted(int((truth.T @ v / v.norm()).abs().argmax()) for v in found
                  if float((truth.T @ v / v.norm()).abs().max()) > 1 - 1e-6)
    assert best == [0, 1]


def test_the_pool_keeps_and_draws_planes_from_its_best_ranked_candidates_only(monkeypatch):
    """Where part of a layer is hidden, thousands of sparse mixes pass as trusted and each round's planes multiply
    them (selectiveshield-paper's MNIST MLP at B = 32: 68,000 candidates, a 37 GB overlap matrix): pruning keeps
    the `limit` best-ranked trusted candidates, and planes are drawn from as many; below the limit nothing changes."""
    t = _target()
    f, pool, truth = _pool(t)
    pool.prune(f, spare=0)
    assert len(pool.q) > 3
    unlimited = copy.deepcopy(pool)
    pool.limit = 3
    planes = copy.deepcopy(pool)
    pool.prune(f, spare=0)
    assert sorted(pool.zeros, reverse=True) == sorted(unlimited.zeros, reverse=True)[:3]   # the sparsest three
    unlimited.prune(f, spare=0)
    assert len(unlimited.q) > 3                                                         # the default limit: all
    read = []
    real = ss.plane_directions
    monkeypatch.setattr(ss, "plane_directions", lambda f_, d1, *a, **k: read.append(d1) or real(f_, d1, *a, **k))
    planes.add_planes(f, overlap=0.0)                  # every candidate's plane is searched: as many as are read
    assert len(read) == 3
    read.clear()
    n = len(unlimited.q)
    unlimited.add_planes(f, overlap=0.0)
    assert len(read) == n > 3


def test_the_scale_without_the_bias_gradient_is_bounded_by_the_relu_pattern():
    t = _target()
    x, d, g = _truth(t)
    f = ss.decompose(g, 6)
    q = _true_directions(f, d)
    weight, bias = (t.knowledge.global_params[f"1.{k}"] for k in ("weight", "bias"))
    s = sp.scales(f, q, torch.full((weight.shape[0],), float("nan")), weight, bias)
    rec = sp.inputs(f, q, s)
    assert float(((rec - x).norm(dim=1) / x.norm(dim=1)).max()) < 0.1


def test_completion_fills_scattered_hidden_entries_exactly():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(60, 5, generator=gen, dtype=torch.float64) @ torch.randn(5, 40, generator=gen, dtype=torch.float64)
    seen = torch.rand(60, 40, generator=gen) > 0.2
    seen[0, :36] = False                  # a row with 4 visible entries: fewer than the rank, left out
    filled, rows, cols, resid = complete(torch.where(seen, g, torch.full_like(g, float("nan"))), seen, 5)
    assert 0 not in rows.tolist() and resid < 1e-8
    assert torch.allclose(filled, g[rows][:, cols], atol=1e-6)


@pytest.mark.parametrize("batch", [6, 1])   # B = 1: the subsets of B - 1 rows are empty, the one direction is q = 1
def test_spear_recovers_the_digits_batch_end_to_end(batch):
    suite = tiny_suite(["plaintext"], [("spear", UNIFORM)], attack_batch_size=batch, attack_repeats=2)
    rec = next(run_group(list(suite.cells), None))
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["images_recovered"] == 1.0 and rec["metrics"]["psnr"] > 60
    assert rec["metrics"]["label_acc"] == 1.0
    assert all(info["exact"] for info in rec["details"]["attack_info"])


def test_spear_reads_a_partial_view_and_is_blocked_only_by_an_empty_one():
    t = _target()
    rng = np.random.default_rng(0)
    full = {n: torch.nan_to_num(v) for n, v in t.view.values.items()}
    masks = {n: rng.random(v.numel()) < 0.9 for n, v in full.items()}   # 10 % of every tensor hidden
    view = ServerView.of(Upload("client-0", 0, 1.0, Payload(plain={n: PlainPart.of(full[n], masks[n]) for n in full})),
                         {n: tuple(v.shape) for n, v in full.items()})
    rec = SPEAR(**UNIFORM).run(view, t.knowledge, seed=0)
    assert rec.extra["exact"] and rec.extra["completion_residual"] < 1e-6
    x = t.truth.x
    assert torch.allclose(rec.images[_order(rec.images.flatten(1), x.flatten(1))], x, atol=1e-3)
    blocked = _target("fedhe-full")
    assert SPEAR().blocked(blocked.view, blocked.knowledge).startswith("the server view is empty")


def test_spear_on_a_cnn_recovers_the_first_fc_layers_input_features():
    """SelectiveShield's SimpleCNN: conv, BN, ReLU, pool twice, then FC 256 with ReLU: SPEAR returns the 256
    features that layer reads, exactly, and the labels."""
    t = _target(model="simplecnn", batch=4)
    layer = relu_linears(t.knowledge.build_model())[0]
    assert layer == "classifier.0"
    rec = SPEAR(**UNIFORM).run(t.view, t.knowledge, seed=0)
    assert rec.images is None and "features, not pixels" in rec.extra["recovered"]
    x, _, _ = _truth(t, layer)
    feats = rec.extra["features"].double()
    assert torch.allclose(feats[_order(feats, x)], x, atol=1e-4)
    assert sorted(rec.labels) == sorted(t.truth.y.tolist())


def test_spear_does_not_apply_without_a_relu_linear_layer():
    suite = tiny_suite(["plaintext"], [("spear", {})], model="lenet5-sigmoid")
    with pytest.raises(SpecError, match="needs a linear layer followed by ReLU"):
        preflight(suite, None)


@pytest.mark.parametrize("hidden", [4, 6])   # fewer units than the batch, and exactly B: every subset has a kernel
def test_spear_does_not_apply_where_no_relu_layer_is_wider_than_the_batch(hidden):
    suite = tiny_suite(["plaintext"], [("spear", UNIFORM)], model="fcn", model_params={"hidden": hidden},
                       attack_batch_size=6)
    with pytest.raises(SpecError, match="more units than the batch"):
        preflight(suite, None)
    wide = tiny_suite(["plaintext"], [("spear", UNIFORM)], model="fcn", model_params={"hidden": 7}, attack_batch_size=6)
    preflight(wide, None)


def test_spear_is_blocked_where_at_most_b_rows_of_the_layer_show_b_entries():
    """The view, not the attack, decides: with all but B rows of each ReLU layer's weight gradient hidden the
    rank-B factorization has no sparse direction to find; one more visible row and SPEAR runs."""
    t = _target()
    full = {n: torch.nan_to_num(v) for n, v in t.view.values.items()}

    def view(rows: int):
        masks = {n: torch.ones(v.numel(), dtype=torch.bool) for n, v in full.items()}
        for layer in ("1.weight", "3.weight"):   # both ReLU layers of the MLP, else SPEAR takes the second
            w = torch.zeros_like(full[layer], dtype=torch.bool)
            w[:rows] = True
            masks[layer] = w.flatten()
        return ServerView.of(Upload("client-0", 0, 1.0, Payload(plain={n: PlainPart.of(full[n], masks[n]) for n in full})),
                             {n: tuple(v.shape) for n, v in full.items()})
    assert "shows at most B = 6 rows" in SPEAR().blocked(view(6), t.knowledge)
    assert SPEAR().blocked(view(7), t.knowledge) is None


@pytest.mark.heavy
@pytest.mark.parametrize("seed", [0, 1])
def test_spear_recovers_a_batch_of_32_digits_whatever_its_sampling_seed(seed, data_root):
    """Core's third B = 32 batch on the digits MLP's 256 units: 12 sampling rounds left it to the seed; the default
    rounds recover it under either (several minutes of one core each)."""
    suite = load_suite(str(Path(__file__).parents[1] / "leaderboards/suites/core.toml"))
    cell = next(c for c in suite.cells if (c.scenario.name, c.defense.name, c.attack.name)
                == ("mnist-mlp-utility", "plaintext", "spear"))
    t = federate(cell, None).targets[2]
    rec = SPEAR(**cell.attack.params).run(t.view, t.knowledge, seed=seed)
    assert rec.extra["exact"], {k: rec.extra[k] for k in ("rounds", "directions", "sparsity_matching")}
