"""Gradient pruning zeroes exactly the fraction p of smallest-magnitude entries of each parameter."""
import pytest
import torch

from defenses.pruning import GradientPruning, prune


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prune_zeroes_the_smallest_fraction_per_tensor(p):
    t = torch.randn(7, 13, generator=torch.Generator().manual_seed(0))
    out = prune(t, p)
    k = round(p * t.numel())
    zeroed = out == 0
    assert int(zeroed.sum()) == k
    if 0 < k < t.numel():   # every kept entry is at least as large as every pruned one, and kept as it was
        assert t.abs()[~zeroed].min() >= t.abs()[zeroed].max()
    assert torch.equal(out[~zeroed], t[~zeroed])


def test_encode_prunes_every_parameter_and_sends_all_entries():
    update = {"w": torch.tensor([[0.1, -3.0], [2.0, -0.2]]), "b": torch.tensor([0.5, -0.01, 4.0, 1.0])}
    payload = GradientPruning(p=0.5).encode(None, None, update, 1.0)
    assert payload.plain["w"].dense().tolist() == [[0.0, -3.0], [2.0, 0.0]]
    assert payload.plain["b"].dense().tolist() == [0.0, 0.0, 4.0, 1.0]
    assert all(part.mask is None for part in payload.plain.values())   # the server sees the zeros as values


def test_p_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 1.5"):
        GradientPruning.check_params({"p": 1.5})
