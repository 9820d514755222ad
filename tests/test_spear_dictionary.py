"""SPEAR++'s dictionary solver (attacks/gradient/spear_dictionary.py) and the completion of a selection's last
directions (attacks/gradient/spear_complete.py), each on a factorisation whose answer is known and each able to
fail, and both attacks end to end on a fixed batch of 8 on SenseCrypt's FCN (a 64-wide ReLU layer)."""
from __future__ import annotations

import pytest
import torch

import attacks.gradient.spear_complete as sc
import attacks.gradient.spear_solve as ss
from attacks.gradient.spear_dictionary import Dictionary, SPEARPlusPlus, constraints, l1_direction
from bench.run.cells import run_group
from tests.conftest import tiny_suite


def _relu_layer(rows: int, batch: int, width: int = 30, seed: int = 0):
    """A ReLU linear layer's batch gradient G = D X with D zero where the neuron is off, and what made it:
    (factors, unit true directions, weight, bias)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, width, generator=gen, dtype=torch.float64)
    weight = torch.randn(rows, width, generator=gen, dtype=torch.float64) / width ** 0.5
    bias = torch.randn(rows, generator=gen, dtype=torch.float64) * 0.5
    on = (x @ weight.T + bias).T > 0                                               # (rows, B)
    d = torch.randn(rows, batch, generator=gen, dtype=torch.float64) * on
    f = ss.decompose(d @ x, batch)
    truth = torch.linalg.lstsq(f.L, d[f.rows]).solution
    return f, truth / truth.norm(dim=0), weight, bias


def _sparse_factorisation(rows: int, batch: int, density: float, seed: int = 0):
    """G = D X with D of i.i.d. Bernoulli(`density`)-Gaussian entries: ER-SpUD's model, answer known."""
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(rows, batch, generator=gen, dtype=torch.float64) * (torch.rand(rows, batch, generator=gen) < density)
    f = ss.decompose(d @ torch.randn(batch, 40, generator=gen, dtype=torch.float64), batch)
    truth = torch.linalg.lstsq(f.L, d[f.rows]).solution
    return f, truth / truth.norm(dim=0)


def _found(directions, truth: torch.Tensor) -> set[int]:
    """The true directions (columns of `truth`) among `directions`, up to scale and sign."""
    out = set()
    for q in directions:
        if q is not None:
            cos = (truth.T @ torch.as_tensor(q, dtype=torch.float64)).abs()
            if float(cos.max()) > 1 - 1e-6:
                out.add(int(cos.argmax()))
    return out


def test_er_spud_recovers_every_column_of_a_sparse_factorisation_and_none_of_a_dense_one():
    """One program per row of L (ER-SpUD's single-column constraints): on a complete dictionary model with a
    sixth of D's entries nonzero every column of Q comes back (up to scale and order); with nine in ten nonzero
    the l1 programs return mixes, not one column."""
    f, truth = _sparse_factorisation(80, 6, 0.15)
    unit = f.unit.numpy()
    assert _found([l1_direction(unit, unit[j]) for j in range(len(f.rows))], truth) == set(range(6))
    f, truth = _sparse_factorisation(80, 6, 0.9)
    unit = f.unit.numpy()
    assert _found([l1_direction(unit, unit[j]) for j in range(len(f.rows))], truth) == set()


def test_the_dictionary_proposer_feeds_the_pool_through_spears_filter():
    """The proposer's programs land in SPEAR's pool (polished, repeats merged) and it is exhausted after every
    single row and the requested pairs; the pool's sparsity filter keeps none of them when set above every
    direction's zero count."""
    f, truth = _sparse_factorisation(80, 6, 0.15)
    gen = torch.Generator().manual_seed(0)
    assert len(constraints(len(f.rows), gen, 10)) == len(f.rows) + 10
    proposer = Dictionary(f, torch.Generator().manual_seed(0), per_round=1000, pairs=5)
    pool = ss.Pool(6, 5 + 4)
    proposer.propose(pool, 1)
    assert proposer.exhausted and pool.proposals == len(f.rows) + 5
    assert _found(pool.q, truth) == set(range(6))
    strict = ss.Pool(6, len(f.rows))
    for q in pool.q:
        strict.insert(f, q, -1)
    assert len(strict.q) == 0


@pytest.mark.parametrize("missing", [(3,), (1, 6)])
def test_the_last_directions_come_from_the_relu_pattern_of_the_inputs_they_must_have(missing):
    """With all but one or two columns of Q known exactly, the missing samples' inputs lie on a known line or
    plane of the input space; the cell of the ReLU arrangement holding each gives its off-neurons, whose rows of L
    have the missing direction as their common kernel (a cell inside a known sample's may return that one too).
    A wrong known column that mixes two known samples leaves the missing rows of P orthogonal to it, and changes
    nothing; one that mixes a missing sample in moves the line off that sample's input, and no cell returns it."""
    f, truth, weight, bias = _relu_layer(64, 8)
    known = truth[:, [i for i in range(8) if i not in missing]]
    assert set(missing) <= _found(sc.directions(f, known, weight, bias), truth)
    others = known.clone()       # a known column mixing two known samples: the missing rows of P stay orthogonal
    others[:, 0] = torch.nn.functional.normalize(known[:, 0] + known[:, 1], dim=0)
    assert set(missing) <= _found(sc.directions(f, others, weight, bias), truth)
    wrong = known.clone()        # one mixing a missing sample in: its row of P leaves the line, its input too
    wrong[:, 0] = torch.nn.functional.normalize(known[:, 0] + truth[:, missing[0]], dim=0)
    assert missing[0] not in _found(sc.directions(f, wrong, weight, bias), truth)


def test_the_arrangement_has_a_point_in_every_cell():
    """Lines in general position cut the plane into 1 + n + n (n - 1) / 2 cells; every one gets a point."""
    gen = torch.Generator().manual_seed(0)
    a, c0 = torch.randn(9, 2, generator=gen, dtype=torch.float64), torch.randn(9, generator=gen, dtype=torch.float64)
    signs = torch.unique((sc.cells(a, c0) @ a.T + c0) > 0, dim=0)
    assert len(signs) == 1 + 9 + 9 * 8 // 2
    assert len(torch.unique((sc.cells(a[:, :1], c0) @ a[:, :1].T + c0) > 0, dim=0)) == 10


@pytest.mark.parametrize("attack", [("spear++", {"chance": False}), ("spear", {"chance": False})])
def test_a_batch_of_8_on_the_fcns_64_neurons_is_exact_end_to_end(attack, data_root):
    """SenseCrypt's FCN (784-64-10) at round 0, one fixed MNIST batch of 8 (scenario seed 2): both attacks recover
    it exactly, and the record says so (every image at ~100 dB, the batch whole). A fixed draw, not a rate: on this
    layer SPEAR++ recovers 7 of 10 MNIST batches of 8 and SPEAR 10 of 10 (leaderboards/suites/spear-robustness.toml)."""
    suite = tiny_suite(["plaintext"], [attack], dataset="mnist", model="fcn", attack_batch_size=8, max_train=400,
                       max_test=100, seed=2)
    rec = next(run_group(list(suite.cells), data_root))
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["batch_recovered"] == 1.0 and rec["metrics"]["psnr"] > 60
    assert rec["details"]["attack_info"][0]["exact"]


def test_spear_plus_plus_checks_its_parameters():
    with pytest.raises(ValueError, match="per_round"):
        SPEARPlusPlus(per_round=0)
    with pytest.raises(ValueError, match="min_sparsity"):
        SPEARPlusPlus(min_sparsity=1.0)
