"""Checkpoint files a model factory reads, checked at suite load without loading them, so that a damaged or
mismatched file is one line (exit 2) before anything runs, not a transformers traceback mid-run.

A factory that reads a checkpoint declares it as `factory.checkpoint = Checkpoint(architecture, gguf, default)`:
the architecture its code builds (a transformers folder's config.json `model_type`, a GGUF file's
`general.architecture`), whether a .gguf file is accepted beside a folder, and what an empty `weights` reads
(the file a package ships). The checks read headers only: a GGUF file's magic, version, metadata and tensor
table, and that every tensor the table lists lies inside the file; a folder's config.json (JSON, its
model_type) and its weights (model.safetensors, pytorch_model.bin or a sharded index with every shard, each
safetensors header within its file)."""
from __future__ import annotations

import json
import math
import mmap
import struct
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types with a fixed size (bytes); 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_U64 = struct.Struct("<Q")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as the model expects; the message is the one-line fix."""


@dataclass(frozen=True)
class Checkpoint:
    architecture: str                          # model_type / general.architecture the factory builds
    gguf: bool = False                         # a .gguf file is accepted as well as a transformers folder
    default: Callable[[], Path] | None = None  # the checkpoint an empty `weights` reads


def check_weights(model: str, factory: Any, weights: str) -> None:
    """The checkpoint `model` would read with `weights` ('' = its default) is there, whole, and of the
    architecture the factory builds; CheckpointError (one line) otherwise. Nothing for a factory that reads none."""
    spec = getattr(factory, "checkpoint", None)
    if not isinstance(spec, Checkpoint) or not (weights or spec.default):
        return
    path = Path(weights).expanduser() if weights else spec.default()
    what = "a saved transformers folder (save_pretrained)" + (" or a .gguf file" if spec.gguf else "")
    if not path.exists():
        raise CheckpointError(f"weights '{path}' does not exist; point weights at {what}")
    if path.is_file():
        if not spec.gguf:
            raise CheckpointError(f"weights '{path}' is a file; model '{model}' reads {what}")
        found, source = _gguf(str(path), *_stamp(path)), "its general.architecture"
    else:
        found, source = _folder(path), "its config.json model_type"
    if found != spec.architecture:
        from bench.registry import MODELS
        specs = {n: getattr(MODELS.get(n), "checkpoint", None) for n in MODELS.names()}
        alt = [n for n, s in specs.items() if isinstance(s, Checkpoint) and s.architecture == found
               and (s.gguf or not path.is_file())]
        hint = f"did you mean model '{alt[0]}'?" if alt else f"point weights at a '{spec.architecture}' checkpoint"
        raise CheckpointError(f"weights '{path}' hold a '{found}' model ({source}); model '{model}' builds "
                              f"'{spec.architecture}' ones; {hint}")


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


class _Short(Exception):
    """The file ends before what its header promises."""


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Short
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def int(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        return self.take(self.int("Q"))

    def value(self, kind: int) -> Any:
        if kind in _FIXED:
            raw = self.take(_FIXED[kind])
            return int.from_bytes(raw, "little") if kind in (4, 10) else None
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, count = self.int("I"), self.int("Q")
            if inner in _FIXED:
                self.take(count * _FIXED[inner])
            elif inner == 8:   # a vocabulary: tens of thousands of strings, skipped without copying them
                pos, end, length = self.pos, len(self.buf), _U64.unpack_from
                for _ in range(count):
                    if pos + 8 > end:
                        raise _Short
                    pos += 8 + length(self.buf, pos)[0]
                if pos > end:
                    raise _Short
                self.pos = pos
            else:
                for _ in range(count):
                    self.value(inner)
            return None
        raise CheckpointError(f"unknown metadata value type {kind}")


def _type_sizes() -> dict[int, tuple[int, int]]:
    """ggml tensor type -> (block size, bytes per block), from the gguf package where it is installed."""
    try:
        from gguf.constants import GGML_QUANT_SIZES
        return {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    except ImportError:   # F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16
        return {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 30: (1, 2)}


@lru_cache(maxsize=8)
def _gguf(path: str, size: int, mtime_ns: int) -> str:
    """The architecture of a whole GGUF file (cached per path, size and mtime: a suite names a file many times)."""
    if size < 24:
        raise CheckpointError(f"weights '{path}' holds {size} bytes, too few for a GGUF file; restore the file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != GGUF_MAGIC:
            raise CheckpointError(f"weights '{path}' is not a GGUF file (it starts {bytes(buf[:4])!r}, not "
                                  f"{GGUF_MAGIC!r}); restore the file or point weights at a .gguf model")
        r = _Reader(buf)
        r.take(4)
        version = r.int("I")
        if version not in (2, 3):
            raise CheckpointError(f"weights '{path}' is GGUF version {version}; versions 2 and 3 are read")
        meta: dict[bytes, Any] = {}
        try:
            tensors, keys = r.int("Q"), r.int("Q")
            for _ in range(keys):
                key = r.string()
                meta[key] = r.value(r.int("I"))
            table = []
            for _ in range(tensors):
                name = r.string()
                dims = [r.int("Q") for _ in range(r.int("I"))]
                table.append((name, dims, r.int("I"), r.int("Q")))
        except _Short:
            raise CheckpointError(f"weights '{path}' is cut short: its {size:,} bytes end inside the GGUF header "
                                  f"(after {len(meta):,} metadata entries); restore the whole file") from None
        align = meta.get(b"general.alignment") or 32
        start = -(-r.pos // align) * align
        sizes = _type_sizes()
        end = start
        for name, dims, kind, offset in table:
            if kind not in sizes:
                raise CheckpointError(f"weights '{path}': tensor {name.decode(errors='replace')} has unknown "
                                      f"ggml type {kind}")
            block, nbytes = sizes[kind]
            end = max(end, start + offset + -(-math.prod(dims) // block) * nbytes)
        if end > size:
            raise CheckpointError(f"weights '{path}' is cut short: its tensor table needs {end:,} bytes, the file "
                                  f"holds {size:,}; restore the whole file")
        arch = meta.get(b"general.architecture")
        if not isinstance(arch, bytes):
            raise CheckpointError(f"weights '{path}' names no general.architecture; it is not a model file")
        return arch.decode(errors="replace")


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        where = f" (line {err.lineno}, column {err.colno}: {err.msg})" if isinstance(err, json.JSONDecodeError) else ""
        raise CheckpointError(f"{what} '{path}' is not JSON{where}; restore it from the saved model") from None
    except OSError as err:
        raise CheckpointError(f"{what} '{path}' cannot be read ({err.strerror})") from None


def _folder(path: Path) -> str:
    """The model_type of a transformers folder whose config and weights are whole."""
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"weights folder '{path}' has no config.json; point weights at a folder saved with "
                              "save_pretrained")
    data = _json(config, "config")
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise CheckpointError(f"config '{config}' names no model_type; restore it from the saved model")
    shards = [path / f for f in WEIGHT_FILES if (path / f).is_file()]
    for index in (path / f"{f}.index.json" for f in WEIGHT_FILES):
        if index.is_file():
            table = _json(index, "weights index")
            files = sorted(set((table.get("weight_map") or {}).values())) if isinstance(table, dict) else []
            if not files or not all(isinstance(f, str) for f in files):
                raise CheckpointError(f"weights index '{index}' maps no tensor to a file; restore it")
            missing = [f for f in files if not (path / Path(f).name).is_file()]
            if missing:
                raise CheckpointError(f"weights folder '{path}' lacks {missing[0]}, which {index.name} lists; "
                                      "copy every shard of the saved model")
            shards += [path / Path(f).name for f in files]
    if not shards:
        raise CheckpointError(f"weights folder '{path}' holds config.json but no weights ({', '.join(WEIGHT_FILES)} "
                              "or a sharded index); save the model with save_pretrained, not only its config")
    for shard in shards:
        _check_shard(shard)
    return data["model_type"]


def _check_shard(path: Path) -> None:
    size = path.stat().st_size
    if path.suffix != ".safetensors":
        if not zipfile.is_zipfile(path):
            raise CheckpointError(f"weights '{path}' is not a whole torch checkpoint (no zip directory at its end); "
                                  "restore the file")
        return
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise CheckpointError(f"weights '{path}' is cut short: its safetensors header needs {8 + max(n, 0):,} "
                                  f"bytes, the file holds {size:,}; restore the whole file")
        try:
            header = json.loads(f.read(n))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise CheckpointError(f"weights '{path}' has no readable safetensors header; restore the file") from None
    if 8 + n + end > size:
        raise CheckpointError(f"weights '{path}' is cut short: its tensors need {8 + n + end:,} bytes, the file "
                              f"holds {size:,}; restore the whole file")
