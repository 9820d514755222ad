"""Datasets as in-memory tensors, read offline from a data root.

The data root (``--data-root``, else ``$LEAKBENCH_DATA``) is read-only: files are parsed
directly (IDX with numpy, CIFAR pickles, TSV/text), never rewritten. Without a root the
embedded scikit-learn ``digits`` always works; the torchvision image sets fall back to
``download=True`` into a user cache, which needs internet. Raw arrays are cached
in-process per (name, root) so a suite that loads one dataset for many cells reads it
once. Subsets (``max_train``/``max_test``) are seeded and class-stratified, so a small
run keeps the label mix of the full set; they are taken before tokenizing text.
"""
from __future__ import annotations

import gzip
import inspect
import os
import pickle
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bench.registry import DATASETS

DATA_ENV = "LEAKBENCH_DATA"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "leakbench"
_HINT = f"pass --data-root or set {DATA_ENV}"


class DataError(ValueError):
    """Data that cannot be found or read; str() says what is missing and how to fix it."""


def resolve_data_root(explicit: str | os.PathLike | None) -> Path | None:
    """--data-root, else $LEAKBENCH_DATA, else None (embedded/online data only)."""
    value = explicit if explicit not in (None, "") else os.environ.get(DATA_ENV) or None
    if value is None:
        return None
    root = Path(value).expanduser()
    if not root.is_dir():
        raise DataError(f"data root {root} is not a directory; {_HINT} to an existing folder")
    return root


@dataclass(frozen=True, eq=False)
class Dataset:
    """One task's train/test tensors plus what an attacker may know about them."""

    name: str
    task: str                 # "classification" | "causal-lm"
    train_x: torch.Tensor     # images float32 (N,C,H,W) in [0,1]; text int64 ids (N, seq_len), right-padded
    train_y: torch.Tensor     # int64 class labels (text: sentiment label, kept for partitioning)
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    vocab_size: int | None = None
    pad_id: int | None = None
    tokenizer: object | None = None
    source: str = ""          # where the data came from, recorded with results
    max_tokens: int | None = None   # text: longest selected sentence before truncation


def load_dataset(name: str, data_root: Path | None, *, max_train: int | None = None,
                 max_test: int | None = None, seed: int = 0, seq_len: int = 32) -> Dataset:
    """Look the loader up by name, load, then take seeded class-stratified subsets."""
    loader = DATASETS.get(name)
    data_root = Path(data_root).expanduser() if data_root is not None else None
    kwargs = {}
    if {"max_train", "max_test"} <= set(inspect.signature(loader).parameters):
        kwargs = {"max_train": max_train, "max_test": max_test}   # built-ins subset before converting
    data = loader(data_root, seed, seq_len, **kwargs)
    train = stratified_subset(data.train_y, max_train, seed)
    test = stratified_subset(data.test_y, max_test, seed + 1)
    if train is None and test is None:
        return data
    fields = dict(data.__dict__)
    if train is not None:
        fields.update(train_x=data.train_x[train], train_y=data.train_y[train])
    if test is not None:
        fields.update(test_x=data.test_x[test], test_y=data.test_y[test])
    return Dataset(**fields)


def stratified_subset(labels, n: int | None, seed: int) -> np.ndarray | None:
    """Sorted indices of a seeded subset of size n with each class's share kept; None if n covers all."""
    labels = np.asarray(labels)
    if n is None or n >= len(labels):
        return None
    if n < 0:
        raise ValueError(f"subset size must be >= 0, got {n}")
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n / len(labels)
    take = np.floor(exact).astype(int)
    extra = np.argsort(-(exact - take), kind="stable")[: n - take.sum()]
    take[extra] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(labels == c), size=k, replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


# -- raw arrays, cached per (name, root) --------------------------------------------------------------
_RAW_READERS: dict[str, Callable[[Path | None], tuple]] = {}


def _raw_reader(name: str):
    def decorate(fn):
        _RAW_READERS[name] = fn
        return fn
    return decorate


@lru_cache(maxsize=8)
def _raw(name: str, root: Path | None) -> tuple:
    """(train_x, train_y, test_x, test_y, source) as numpy; test_* None where the set has no split."""
    return _RAW_READERS[name](root)


def _split(n: int, labels: np.ndarray, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    test = stratified_subset(labels, test_size, seed)
    return np.setdiff1d(np.arange(n), test), test


def _image_dataset(name: str, raw: tuple, max_train, max_test, seed: int, scale: float) -> Dataset:
    tx, ty, vx, vy, source = raw
    num_classes = int(max(ty.max(), vy.max())) + 1   # from the full set: a subset may miss a class
    tr = stratified_subset(ty, max_train, seed)
    te = stratified_subset(vy, max_test, seed + 1)
    tx, ty = (tx, ty) if tr is None else (tx[tr], ty[tr])
    vx, vy = (vx, vy) if te is None else (vx[te], vy[te])

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.float32) / scale)

    return Dataset(name, "classification", images(tx), torch.tensor(ty, dtype=torch.int64), images(vx),
                   torch.tensor(vy, dtype=torch.int64), num_classes,
                   tuple(tx.shape[1:]), source=source)


# -- digits: embedded in scikit-learn ------------------------------------------------------------------
@_raw_reader("digits")
def _read_digits(root: Path | None) -> tuple:
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.images.reshape(-1, 1, 8, 8).astype(np.uint8), d.target.astype(np.int64), None, None, "scikit-learn"


@DATASETS.register("digits", "scikit-learn 8x8 handwritten digits (1,8,8), 10 classes; embedded, always offline")
def digits(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    x, y, _, _, source = _raw("digits", None)
    train, test = _split(len(y), y, 300, seed)   # seeded stratified 1497/300 split
    return _image_dataset("digits", (x[train], y[train], x[test], y[test], source), max_train, max_test, seed, 16.0)


# -- MNIST / Fashion-MNIST: IDX files -----------------------------------------------------------------
_IDX = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def read_idx(path: Path) -> np.ndarray:
    """An IDX (optionally .gz) file as a uint8 array shaped by its header."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        data = f.read()
    if data[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not a uint8 IDX file; restore the original file")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _idx_paths(raw_dir: Path) -> list[Path] | None:
    paths = []
    for stem in _IDX_FILES:   # prefer uncompressed copies: no decompression cost
        found = [p for p in (raw_dir / stem, raw_dir / f"{stem}.gz") if p.is_file()]
        if not found:
            return None
        paths.append(found[0])
    return paths


def fetch_online(name: str) -> Path:
    """Download with torchvision into the user cache (needs internet); returns the root holding the files."""
    import torchvision.datasets as tvd
    cls = {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10}[name]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cls(str(CACHE_DIR), train=True, download=True)
    return CACHE_DIR


def _online_or_fail(name: str, root: Path | None, needs: str) -> Path:
    where = f"the data root {root}" if root is not None else "a data root"
    try:
        return fetch_online(name)
    except Exception as err:  # offline, blocked, corrupt: the same fix applies
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        reason = (lines[-1][:160] if lines else "") or type(err).__name__   # innermost cause
        raise DataError(f"dataset '{name}' needs {needs} under {where}; {_HINT} "
                        f"(download to {CACHE_DIR} failed: {reason})") from None


def _read_idx_set(name: str, root: Path | None) -> tuple:
    folder = _IDX[name]
    paths = _idx_paths(root / folder / "raw") if root is not None else None
    if paths is None:
        online = _online_or_fail(name, root, f"{folder}/raw/*-ubyte.gz")
        paths = _idx_paths(online / folder / "raw")
        if paths is None:
            raise DataError(f"dataset '{name}': download finished but {online / folder / 'raw'} lacks the "
                            f"IDX files; delete that folder and retry, or {_HINT}")
    tx, ty, vx, vy = (read_idx(p) for p in paths)
    return tx[:, None], ty.astype(np.int64), vx[:, None], vy.astype(np.int64), str(paths[0].parent)


for _name in _IDX:
    _raw_reader(_name)(lambda root, _n=_name: _read_idx_set(_n, root))


@DATASETS.register("mnist", "MNIST handwritten digits (1,28,28), 10 classes, 60000/10000")
def mnist(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    return _image_dataset("mnist", _raw("mnist", data_root), max_train, max_test, seed, 255.0)


@DATASETS.register("fashion-mnist", "Fashion-MNIST clothing images (1,28,28), 10 classes, 60000/10000")
def fashion_mnist(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    return _image_dataset("fashion-mnist", _raw("fashion-mnist", data_root), max_train, max_test, seed, 255.0)


# -- CIFAR-10: pickled batches (full or the partial offline copy) --------------------------------------
def _cifar_dir(root: Path) -> Path | None:
    for sub in ("cifar-10-batches-py", "cifar-10-partial"):
        if any((root / sub / f"data_batch_{i}").is_file() for i in range(1, 6)):
            return root / sub
    return None


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    return np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32), np.asarray(d[b"labels"], np.int64)


@_raw_reader("cifar10")
def _read_cifar(root: Path | None) -> tuple:
    folder = _cifar_dir(root) if root is not None else None
    if folder is None:
        folder = _cifar_dir(_online_or_fail("cifar10", root, "cifar-10-batches-py/ or cifar-10-partial/"))
    if folder is None or not (folder / "test_batch").is_file():
        raise DataError(f"dataset 'cifar10' needs a test_batch beside the data batches in {folder}; {_HINT}")
    train = [_read_cifar_batch(p) for p in sorted(folder.glob("data_batch_[1-5]"))]
    vx, vy = _read_cifar_batch(folder / "test_batch")
    tx, ty = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    return tx, ty, vx, vy, f"{folder} ({len(ty)} train / {len(vy)} test images)"


@DATASETS.register("cifar10", "CIFAR-10 natural images (3,32,32), 10 classes; full or the partial offline copy")
def cifar10(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    return _image_dataset("cifar10", _raw("cifar10", data_root), max_train, max_test, seed, 255.0)


# -- text: sentiment sentences for causal-LM training ---------------------------------------------------


from bench import text_datasets  # noqa: E402,F401  (registers the text sets; they build on the helpers above)
