"""The warm-start cache (bench/models/pretrain.py): a hit gives the state a computation gives, keyed by every input."""
import torch

from bench.models import pretrain as P


class _Task:
    def loss(self, model, x, y):
        return torch.nn.functional.cross_entropy(model(x), y)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def test_a_cache_hit_equals_the_computation_and_any_input_changes_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    x, y = torch.randn(40, 6, generator=torch.Generator().manual_seed(1)), torch.arange(40) % 3
    fresh = P.pretrain(_model(), _Task(), x, y, 2, 8, 0.1, 0)
    first = P.cached_pretrain(_model(), _Task(), x, y, 2, 8, 0.1, 0)
    assert len(list(P.cache_dir().glob("*.pt"))) == 1
    model = _model()
    again = P.cached_pretrain(model, _Task(), x, y, 2, 8, 0.1, 0)
    for k in fresh:
        assert torch.equal(fresh[k], first[k]) and torch.equal(fresh[k], again[k])
        assert torch.equal(model.state_dict()[k], fresh[k])       # the model is left trained on a hit too
    base = P.warm_start_key(_model(), _Task(), x, y, 2, 8, 0.1, 0)
    assert base != P.warm_start_key(_model(), _Task(), x, y, 2, 8, 0.2, 0)
    assert base != P.warm_start_key(_model(1), _Task(), x, y, 2, 8, 0.1, 0)
    assert base != P.warm_start_key(_model(), _Task(), x, y.flip(0), 2, 8, 0.1, 0)


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LEAKBENCH_WARM_CACHE", "0")
    x, y = torch.randn(20, 6), torch.arange(20) % 3
    P.cached_pretrain(_model(), _Task(), x, y, 1, 8, 0.1, 0)
    assert not P.cache_dir().exists()
