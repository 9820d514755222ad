"""Load-time checks of a suite's data: the root exists, the files are present and intact, labels fit images.

MNIST and Fashion-MNIST files are checked against the md5 values torchvision lists
(`MNIST.resources`, `FashionMNIST.resources`; the uncompressed copies against the md5 of
those verified files decompressed), CIFAR-10's full batches against `CIFAR10.train_list`/
`test_list`. Header checks come first so a truncated or mismatched file gets a specific
message (e.g. "1000 labels for 60000 images"). Digests are cached in-process by
(path, size, mtime), so a suite touching one dataset many times hashes it once. Nothing is
written anywhere. Each check returns the training-set size and class count, which the
scenario checks use (an attacked batch larger than a client's share fails here, not mid-run).
"""
from __future__ import annotations

import gzip
import hashlib
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.data.loading import _HINT, DataError

# torchvision.datasets.MNIST.resources / FashionMNIST.resources, plus the decompressed files' md5
_MD5 = {
    "MNIST": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    "FashionMNIST": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}
# torchvision.datasets.CIFAR10.train_list / test_list (the full batches; the partial copy has none)
CIFAR10_MD5 = {"data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
               "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
               "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e"}
_FOLDER = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}


@dataclass(frozen=True)
class DataInfo:
    train_size: int | None      # examples a run can partition (before max_train), None where not known cheaply
    num_classes: int | None


@lru_cache(maxsize=64)
def _md5(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def md5(path: Path) -> str:
    st = path.stat()
    return _md5(str(path), st.st_size, st.st_mtime_ns)


def _header(path: Path, ndim: int) -> tuple[int, ...]:
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            head = f.read(4 + 4 * ndim)
    except (OSError, EOFError) as err:
        raise DataError(f"{path} cannot be read ({type(err).__name__}); restore the original file") from None
    if len(head) < 4 + 4 * ndim or head[:3] != b"\x00\x00\x08" or head[3] != ndim:
        raise DataError(f"{path} is not a uint8 IDX file with {ndim} dimension(s); restore the original file")
    return struct.unpack(f">{ndim}I", head[4:])


def _labels_max(path: Path) -> int:
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:   # a truncated .gz: the md5 check names it next
        return 0 if isinstance(err, EOFError) or "gzip" in str(err).lower() else _raise(path, err)
    return max(data[8:]) if len(data) > 8 else 0


def _raise(path: Path, err: Exception) -> int:
    raise DataError(f"{path} cannot be read ({type(err).__name__}); restore the original file")


def check_idx(name: str, root: Path) -> DataInfo:
    folder = _FOLDER[name]
    raw = root / folder / "raw"
    sizes = {}
    for split in ("train", "t10k"):
        paths = {}
        for kind, ndim in (("images", 3), ("labels", 1)):
            stem = f"{split}-{kind}-idx{ndim}-ubyte"
            found = [p for p in (raw / stem, raw / f"{stem}.gz") if p.is_file()]
            if not found:
                raise DataError(f"dataset '{name}' needs {folder}/raw/{stem}.gz under the data root {root}; {_HINT}")
            paths[kind] = found[0]   # the reader prefers the uncompressed copy, so that one is checked
        images, labels = _header(paths["images"], 3), _header(paths["labels"], 1)[0]
        if images[1:] != (28, 28):
            raise DataError(f"{paths['images']} holds {images[1]}x{images[2]} images, not 28x28; "
                            f"restore the original file")
        if labels != images[0]:
            raise DataError(f"{paths['labels']} holds {labels} labels for {images[0]} images in "
                            f"{paths['images'].name}; restore the matching original files")
        top = _labels_max(paths["labels"])
        if top > 9:
            raise DataError(f"{paths['labels']} holds label {top}; {name} has classes 0-9, restore the original")
        for kind, path in paths.items():
            want = _MD5[folder].get(path.name)
            if want is not None and md5(path) != want:
                raise DataError(f"{path} does not match torchvision's md5 {want} (truncated or altered); "
                                f"restore the original file")
        sizes[split] = images[0]
    return DataInfo(sizes["train"], 10)


def check_cifar10(root: Path) -> DataInfo:
    for sub in ("cifar-10-batches-py", "cifar-10-partial"):
        folder = root / sub
        if any((folder / f"data_batch_{i}").is_file() for i in range(1, 6)):
            if not (folder / "test_batch").is_file():
                raise DataError(f"dataset 'cifar10' needs {sub}/test_batch beside the data batches under {root}")
            if sub == "cifar-10-batches-py":
                for fname, want in CIFAR10_MD5.items():
                    path = folder / fname
                    if path.is_file() and md5(path) != want:
                        raise DataError(f"{path} does not match torchvision's md5 {want} (truncated or altered); "
                                        f"restore the original file")
            return DataInfo(None, 10)
    raise DataError(f"dataset 'cifar10' needs cifar-10-batches-py/ or cifar-10-partial/ under the data root {root}; "
                    f"{_HINT}")


_TEXT = {"sst2": ("text/sst2", ("train.tsv", "dev.tsv")),
         "rt-polarity": ("text/rt-polarity", ("rt-polarity.neg", "rt-polarity.pos"))}


def check_dataset(name: str, root: Path | None) -> DataInfo:
    """What a run of `name` would need from `root`; DataError (one line) when it is missing or damaged."""
    if name == "digits":
        return DataInfo(1497, 10)   # the seeded 1497/300 split of scikit-learn's 1797 digits
    if root is None:
        return DataInfo(None, None)  # the loader downloads into the user cache; nothing to check here
    if name in _FOLDER:
        return check_idx(name, root)
    if name == "cifar10":
        return check_cifar10(root)
    if name in _TEXT:
        sub, files = _TEXT[name]
        for f in files:
            if not (root / sub / f).is_file():
                raise DataError(f"dataset '{name}' needs {sub}/{f} under the data root {root}; {_HINT}")
    return DataInfo(None, None)
