"""Datasets as in-memory tensors, read offline from a data root.

The data root (``--data-root``, else ``$LEAKBENCH_DATA``) is read-only: files are parsed
directly (IDX with numpy, CIFAR pickles, TSV/text), never rewritten. Without a root the
embedded scikit-learn ``digits`` always works; the torchvision image sets fall back to
``download=True`` into a user cache, which needs internet. Raw arrays are cached
in-process per (name, root) so a suite that loads one dataset for many cells reads it
once. Subsets (``max_train``/``max_test``) are seeded and class-stratified, so a small
run keeps the label mix of the full set; they are taken before tokenizing text.

Every file a loader (or a model factory) reads is noted with a digest of its bytes for the cell's fingerprint
(`read_data`, `note_data`; bench/registry.py logs it): keyed by where it lies (`root:` the data root, `cache:` the
download cache, `package:` an installed package's folder), so the same file has the same key on every machine.
Digests are cached per process by (path, size, mtime), and a cached raw read notes its files again.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import site
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bench.protocol.contracts import returned
from bench.registry import DATASETS, note_file, using

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
    data = returned(loader, "the loader", loader(data_root, seed, seq_len, **kwargs), Dataset, "a bench.Dataset")
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


# -- raw arrays, cached per (reader, root), and the files they were read from -----------------------------
@lru_cache(maxsize=8)
def _read_raw(reader: Callable[[Path | None], tuple], root: Path | None) -> tuple[tuple, dict[str, str]]:
    with using() as usage:
        raw = reader(root)
    return raw, usage.files


def _raw(reader: Callable[[Path | None], tuple], root: Path | None) -> tuple:
    """reader(root): (train_x, train_y, test_x, test_y, source) as numpy, test_* None where the set has no split;
    read once per process, its files noted on every call."""
    raw, files = _read_raw(reader, root)
    for key, value in files.items():
        note_file(key, value)
    return raw


@lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def file_digest(path: Path) -> str:
    """sha256 (16 hex digits) of the file's bytes, once per process for a (path, size, mtime)."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def _bases(root: Path | None) -> list[tuple[str, Path]]:
    """Where a data file may lie, by the key prefix that names the place."""
    packages = [Path(p) for p in {*site.getsitepackages(), site.getusersitepackages()}]
    return ([("root", root.resolve())] if root is not None else []) + [("cache", CACHE_DIR.resolve())] + \
        [("package", p.resolve()) for p in sorted(packages) if p.is_dir()]


def data_key(path: Path, root: Path | None) -> str:
    """The file as a fingerprint names it: root:<path in the data root>, cache:<path in the download cache>,
    package:<path in site-packages>, else file:<absolute path>."""
    path = Path(path).resolve()
    for prefix, base in _bases(root):
        if path.is_relative_to(base):
            return f"{prefix}:{path.relative_to(base).as_posix()}"
    return f"file:{path}"


def find_data(key: str, root: Path | None) -> Path | None:
    """The file a key names on this machine (`data_key`), or None where it is not here."""
    prefix, _, rel = key.partition(":")
    if prefix == "file":
        candidates = [Path(rel)]
    elif prefix == "package":
        spec = importlib.util.find_spec(rel.split("/")[0]) if rel else None
        tops = list(spec.submodule_search_locations or []) if spec is not None else []
        candidates = [Path(t).parent / rel for t in tops]
    else:
        candidates = [base / rel for p, base in _bases(root) if p == prefix]
    return next((c for c in candidates if c.is_file()), None)


def note_data(*paths: Path, root: Path | None = None) -> None:
    """Note files the running computation reads (a tokenizer's, a checkpoint's) with their digests."""
    for path in paths:
        note_file(data_key(path, root), file_digest(Path(path)))


def read_data(path: Path, root: Path | None = None) -> bytes:
    """The file's bytes, noted for the cell's fingerprint."""
    path = Path(path)
    data = path.read_bytes()
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    note_file(data_key(path, root), _digest(*key))
    return data


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
