"""Image data sets: scikit-learn's embedded digits, MNIST and Fashion-MNIST (IDX files), CIFAR-10 (pickled
batches, full or the partial offline copy); each read once per data root (bench/data/loading.py's cache).

Each loader names its reader, and no statement run at import names a loader, so a loader's fingerprint holds its
own code and what it calls (bench/run/closure.py): an edit to CIFAR's reader stales no MNIST cell."""
from __future__ import annotations

import gzip
import io
import pickle
import struct
from pathlib import Path

import numpy as np

from bench.data.loading import _HINT, CACHE_DIR, DataError, Dataset, _image_dataset, _raw, _split, read_data
from bench.registry import DATASETS


def _image(loader):
    """Marks an image loader: text-only scenario keys (seq_len) are refused on it at load (bench/run/mistakes.py)."""
    loader.modality = "image"
    return loader


def _read_digits(root: Path | None) -> tuple:
    """scikit-learn's digits.csv.gz read as its load_digits reads it, without importing sklearn.datasets (a second
    and a half: it loads pandas and scipy), unless the file is not where scikit-learn keeps it."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(next(iter(spec.submodule_search_locations or [""]), "")) / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        table = np.loadtxt(io.StringIO(gzip.decompress(read_data(path)).decode()), delimiter=",")
        images, target = table[:, :-1], table[:, -1].astype(int)
    else:
        from sklearn.datasets import load_digits
        d = load_digits()
        images, target = d.images, d.target
    return images.reshape(-1, 1, 8, 8).astype(np.uint8), target.astype(np.int64), None, None, "scikit-learn"


@DATASETS.register("digits", "scikit-learn 8x8 handwritten digits (1,8,8), 10 classes; embedded, always offline")
@_image
def digits(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    x, y, _, _, source = _raw(_read_digits, None)
    train, test = _split(len(y), y, 300, seed)   # seeded stratified 1497/300 split
    return _image_dataset("digits", (x[train], y[train], x[test], y[test], source), max_train, max_test, seed, 16.0)


# -- MNIST / Fashion-MNIST: IDX files -----------------------------------------------------------------
_IDX = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def read_idx(path: Path, root: Path | None = None) -> np.ndarray:
    """An IDX (optionally .gz) file as a uint8 array shaped by its header."""
    data = read_data(path, root)
    if path.suffix == ".gz":
        data = gzip.decompress(data)
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
    tx, ty, vx, vy = (read_idx(p, root) for p in paths)
    return tx[:, None], ty.astype(np.int64), vx[:, None], vy.astype(np.int64), str(paths[0].parent)


def _read_mnist(root: Path | None) -> tuple:
    return _read_idx_set("mnist", root)


def _read_fashion_mnist(root: Path | None) -> tuple:
    return _read_idx_set("fashion-mnist", root)


@DATASETS.register("mnist", "MNIST handwritten digits (1,28,28), 10 classes, 60000/10000")
@_image
def mnist(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    return _image_dataset("mnist", _raw(_read_mnist, data_root), max_train, max_test, seed, 255.0)


@DATASETS.register("fashion-mnist", "Fashion-MNIST clothing images (1,28,28), 10 classes, 60000/10000")
@_image
def fashion_mnist(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    return _image_dataset("fashion-mnist", _raw(_read_fashion_mnist, data_root), max_train, max_test, seed, 255.0)


# -- CIFAR-10: pickled batches (full or the partial offline copy) --------------------------------------
def _cifar_dir(root: Path) -> Path | None:
    for sub in ("cifar-10-batches-py", "cifar-10-partial"):
        if any((root / sub / f"data_batch_{i}").is_file() for i in range(1, 6)):
            return root / sub
    return None


def _read_cifar_batch(path: Path, root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    d = pickle.loads(read_data(path, root), encoding="bytes")
    return np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32), np.asarray(d[b"labels"], np.int64)


def _read_cifar(root: Path | None) -> tuple:
    folder = _cifar_dir(root) if root is not None else None
    if folder is None:
        folder = _cifar_dir(_online_or_fail("cifar10", root, "cifar-10-batches-py/ or cifar-10-partial/"))
    if folder is None or not (folder / "test_batch").is_file():
        raise DataError(f"dataset 'cifar10' needs a test_batch beside the data batches in {folder}; {_HINT}")
    train = [_read_cifar_batch(p, root) for p in sorted(folder.glob("data_batch_[1-5]"))]
    vx, vy = _read_cifar_batch(folder / "test_batch", root)
    tx, ty = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    return tx, ty, vx, vy, f"{folder} ({len(ty)} train / {len(vy)} test images)"


@DATASETS.register("cifar10", "CIFAR-10 natural images (3,32,32), 10 classes; full or the partial offline copy")
@_image
def cifar10(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
    return _image_dataset("cifar10", _raw(_read_cifar, data_root), max_train, max_test, seed, 255.0)
