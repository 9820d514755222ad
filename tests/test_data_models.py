"""Datasets, partitions and model factories: shapes, offline loading, and the helpers the engine uses."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.data import vision as ds
from bench.data import text as text_datasets
from bench.data.loading import DATA_ENV, DataError, Dataset, load_dataset, resolve_data_root
from bench.federation.partition import partition
from bench.models import build_model, classifier_head, update_names
from bench.registry import MODELS, UnknownName

TEXT_MODELS = {"gpt2", "gpt2-lora", "minilm", "smollm2-135m", "smollm2-135m-lora"}
IMAGE_SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]


def image_data(shape, n=4, classes=10) -> Dataset:
    x, y = torch.rand(n, *shape), torch.arange(n) % classes
    return Dataset("synthetic", "classification", x, y, x, y, classes, tuple(shape))


def text_data(seq_len=16) -> Dataset:
    tok = text_datasets.get_tokenizer(None)   # ByT5: byte-level, needs no files
    x = text_datasets.encode(tok, ["a short one", "a somewhat longer sentence to truncate"], seq_len)
    y = torch.tensor([0, 1])
    return Dataset("tiny-text", "causal-lm", x, y, x, y, 2, (seq_len,), vocab_size=len(tok),
                   pad_id=tok.pad_token_id, tokenizer=tok)


def data_root() -> Path:
    if not os.environ.get(DATA_ENV):
        pytest.skip(f"{DATA_ENV} is not set: point it at the offline data root (e.g. ../shared/data)")
    return resolve_data_root(None)


# -- datasets -------------------------------------------------------------------------------------
def test_digits_loads_offline():
    d = load_dataset("digits", None)
    assert d.train_x.shape == (1497, 1, 8, 8) and d.test_x.shape == (300, 1, 8, 8)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64
    assert 0.0 <= float(d.train_x.min()) and float(d.train_x.max()) == 1.0
    assert d.num_classes == 10 and d.input_shape == (1, 8, 8) and d.task == "classification"
    assert torch.bincount(d.test_y).min() >= 29   # stratified split
    assert d.source == "scikit-learn"


def test_subsets_are_seeded_and_stratified():
    a = load_dataset("digits", None, max_train=100, max_test=50, seed=3)
    b = load_dataset("digits", None, max_train=100, max_test=50, seed=3)
    c = load_dataset("digits", None, max_train=100, max_test=50, seed=4)
    assert len(a.train_y) == 100 and len(a.test_y) == 50
    assert torch.equal(a.train_x, b.train_x) and not torch.equal(a.train_x, c.train_x)
    assert torch.bincount(a.train_y, minlength=10).tolist() == [10] * 10
    assert a.num_classes == 10


def test_resolve_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert resolve_data_root(None) is None
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert resolve_data_root(None) == tmp_path
    other = tmp_path / "other"
    other.mkdir()
    assert resolve_data_root(other) == other   # --data-root wins over the environment
    with pytest.raises(DataError, match="not a directory"):
        resolve_data_root(tmp_path / "missing")


def test_unknown_dataset_names_the_closest():
    with pytest.raises(UnknownName, match="mnist"):
        load_dataset("mnsit", None)


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10", "sst2", "rt-polarity"])
def test_missing_data_is_a_one_line_fix(name, tmp_path, monkeypatch):
    def offline(_name):
        raise OSError("network unreachable")

    monkeypatch.setattr(ds, "fetch_online", offline)
    with pytest.raises(DataError) as err:
        load_dataset(name, tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"'{name}'" in message and DATA_ENV in message and str(tmp_path) in message


def write_idx(path: Path, array: np.ndarray) -> None:
    import gzip
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_online_fallback_reads_torchvision_layout(tmp_path, monkeypatch):
    raw = tmp_path / "cache" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 10)):
        write_idx(raw / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    monkeypatch.setattr(ds, "fetch_online", lambda name: tmp_path / "cache")
    d = load_dataset("mnist", tmp_path / "empty-root", max_train=20)
    assert d.train_x.shape == (20, 1, 28, 28) and d.test_x.shape == (10, 1, 28, 28)
    assert d.source == str(raw) and float(d.train_x.max()) <= 1.0


def test_cifar_partial_batches(tmp_path):
    import pickle
    folder = tmp_path / "cifar-10-partial"
    folder.mkdir()
    for name, n in (("data_batch_1", 12), ("data_batch_2", 8), ("test_batch", 5)):
        batch = {b"data": np.full((n, 3072), 255, np.uint8), b"labels": [i % 10 for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(batch))
    d = load_dataset("cifar10", tmp_path)
    assert d.train_x.shape == (20, 3, 32, 32) and d.test_x.shape == (5, 3, 32, 32)
    assert float(d.train_x.min()) == 1.0 and "20 train / 5 test" in d.source


@pytest.mark.parametrize("name,train,test,first", [
    ("mnist", 60000, 10000, [5, 0, 4, 1, 9]),
    ("fashion-mnist", 60000, 10000, [9, 0, 0, 3, 0]),
    ("cifar10", 4660, 846, [6, 9, 9, 4, 1]),
])
def test_image_sets_load_from_data_root(name, train, test, first):
    d = load_dataset(name, data_root())
    assert (len(d.train_y), len(d.test_y)) == (train, test)
    assert d.train_x.shape[1:] == d.input_shape == ((3, 32, 32) if name == "cifar10" else (1, 28, 28))
    assert d.train_y[:5].tolist() == first and d.num_classes == 10
    assert d.train_x.dtype == torch.float32 and 0.0 <= float(d.train_x.min()) and float(d.train_x.max()) <= 1.0
    assert d.source


@pytest.mark.parametrize("name", ["sst2", "rt-polarity"])
def test_text_sets_load_from_data_root(name):
    d = load_dataset(name, data_root(), max_train=300, max_test=80, seq_len=24)
    assert d.task == "causal-lm" and d.train_x.shape == (300, 24) and d.test_x.shape == (80, 24)
    assert d.train_x.dtype == torch.int64 and d.vocab_size == 50257 and d.pad_id == 50256
    assert set(d.train_y.unique().tolist()) == {0, 1} and d.num_classes == 2
    assert (d.train_x[:, -1] == d.pad_id).any()                 # short sentences are right-padded
    assert d.tokenizer.decode(d.train_x[0][d.train_x[0] != d.pad_id]).strip()


def test_text_split_sizes():
    root = data_root()
    d = load_dataset("sst2", root, max_train=10)
    assert len(d.test_y) == 872 and len(d.train_y) == 10
    rt = load_dataset("rt-polarity", root, max_train=10)
    assert len(rt.test_y) == 1066 and torch.bincount(rt.test_y).tolist() == [533, 533]   # 10% of 5331 + 5331


# -- models ---------------------------------------------------------------------------------------
def image_models() -> list[str]:
    return [n for n in MODELS.builtins() if n not in TEXT_MODELS]


@pytest.mark.parametrize("shape", IMAGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", image_models())
def test_image_models_give_logits(name, shape):
    data = image_data(shape)
    model = build_model(name, data)
    assert model(data.train_x).shape == (4, 10)
    assert model(data.train_x[:1]).shape == (1, 10)   # attack batch size 1, train mode
    model.eval()
    assert model(data.train_x).shape == (4, 10)
    weight, bias = classifier_head(model)
    params = dict(model.named_parameters())
    assert params[weight].shape[0] == 10 and (bias is None or params[bias].shape == (10,))
    names = update_names(model)
    assert weight in names and len(names) == len(set(names))
    assert not any(n.endswith("num_batches_tracked") for n in names)
    assert all(n in params or n.endswith(("running_mean", "running_var")) for n in names)


def test_lenet_sizes_and_dlg_init():
    for shape, hidden in [((3, 32, 32), 768), ((1, 28, 28), 588)]:
        model = build_model("lenet5-sigmoid", image_data(shape))
        weight, _ = classifier_head(model)
        assert dict(model.named_parameters())[weight].shape == (10, hidden)
        assert all(p.abs().max() <= 0.5 for p in model.parameters())
    relu = build_model("lenet5-relu", image_data((3, 32, 32)), activation="silu")
    assert any(isinstance(m, torch.nn.SiLU) for m in relu.modules())
    assert dict(relu.named_parameters())[classifier_head(relu)[0]].shape == (10, 84)
    with pytest.raises(ValueError, match="activation"):
        build_model("lenet5-relu", image_data((1, 28, 28)), activation="tanh")
    with pytest.raises(TypeError):
        build_model("mlp", image_data((1, 8, 8)), width=3)


def test_resnet_counts_bn_buffers():
    model = build_model("resnet18", image_data((1, 8, 8)))
    names = update_names(model)
    assert "bn1.running_mean" in names and "fc.weight" in names


def test_resnet_width_scales_channels_not_structure():
    full = build_model("resnet18", image_data((3, 32, 32)))
    slim = build_model("resnet18", image_data((3, 32, 32)), width=8)
    shapes = {n: p.shape for n, p in full.named_parameters()}
    slim_shapes = {n: p.shape for n, p in slim.named_parameters()}
    assert list(shapes) == list(slim_shapes) and update_names(full) == update_names(slim)
    assert slim_shapes["conv1.weight"] == (8, 3, 3, 3) and slim_shapes["fc.weight"] == (10, 64)
    assert slim_shapes["layer4.0.downsample.0.weight"] == (64, 32, 1, 1)
    assert 11_000_000 < sum(p.numel() for p in full.parameters()) and sum(p.numel() for p in slim.parameters()) < 200_000
    assert slim(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="width must be an int in 1..64"):
        build_model("resnet18", image_data((3, 32, 32)), width=0)


def test_gpt2_lora_trains_only_adapters():
    data = text_data()
    torch.manual_seed(0)
    model = build_model("gpt2-lora", data)
    logits = model(data.train_x)
    assert logits.shape == (2, 16, data.vocab_size)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert update_names(model) == trainable
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)
    with pytest.raises(ValueError, match="causal-lm"):
        build_model("gpt2-lora", image_data((1, 8, 8)))


@pytest.mark.parametrize("name", ["smollm2-135m", "smollm2-135m-lora"])
def test_pretrained_text_models_reject_images_before_reading_weights(name):
    with pytest.raises(ValueError, match="causal-lm"):
        build_model(name, image_data((1, 8, 8)))


def test_image_models_reject_text():
    with pytest.raises(ValueError, match="image"):
        build_model("simplecnn", text_data())


def test_classifier_head_needs_a_linear():
    with pytest.raises(ValueError, match="nn.Linear"):
        classifier_head(torch.nn.Conv2d(1, 1, 3))


# -- partition ------------------------------------------------------------------------------------
LABELS = np.repeat(np.arange(10), 50)


def check_disjoint(parts, n, cover=True):
    joined = np.concatenate(parts)
    assert len(joined) == len(set(joined.tolist()))
    if cover:
        assert sorted(joined.tolist()) == list(range(n))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "k-classes"])
def test_partition_disjoint_covering_deterministic(scheme):
    parts = partition(torch.as_tensor(LABELS), 5, scheme, seed=1)
    check_disjoint(parts, len(LABELS))
    assert all(len(p) >= 1 and p.dtype == np.int64 for p in parts)
    again = partition(LABELS, 5, scheme, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition(LABELS, 5, scheme, seed=2)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_is_near_equal():
    sizes = [len(p) for p in partition(LABELS, 7, "iid")]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("clients,k", [(5, 2), (10, 2), (4, 3), (3, 1)])
def test_k_classes_gives_exactly_k(clients, k):
    parts = partition(LABELS, clients, "k-classes", classes_per_client=k, seed=0)
    check_disjoint(parts, len(LABELS), cover=clients * k >= 10)
    assert all(len(np.unique(LABELS[p])) == k for p in parts)


def test_dirichlet_small_alpha_is_skewed():
    def dominant_share(parts):
        return np.mean([np.bincount(LABELS[p]).max() / len(p) for p in parts])

    skewed = partition(LABELS, 10, "dirichlet", alpha=0.05, seed=0)
    even = partition(LABELS, 10, "dirichlet", alpha=1000.0, seed=0)
    assert dominant_share(skewed) > 0.5 > 0.2 > dominant_share(even)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scheme="shards"), "iid, dirichlet, k-classes"),
    (dict(scheme="k-classes", classes_per_client=11), r"\[1, 10\]"),
    (dict(scheme="dirichlet", alpha=0.0), "alpha"),
    (dict(scheme="iid", num_clients=0), "num_clients"),
    (dict(scheme="iid", num_clients=600), "lower num_clients"),
])
def test_partition_bad_arguments(kwargs, match):
    kwargs = {"num_clients": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        partition(LABELS, **kwargs)


def test_sensecrypt_models_have_the_papers_parameter_counts():
    """SenseCrypt appendix table 4: 50,890 (the MLP/FCN at 28x28) and 124,534 (its CIFAR-10 'AlexNet')."""
    def count(name, shape):
        return sum(p.numel() for p in build_model(name, image_data(shape)).parameters())
    assert count("fcn", (1, 28, 28)) == 50_890
    assert count("alexnet-cifar", (3, 32, 32)) == 124_534
