"""Warm start: a model trained centrally on a public split held out from every client.

Defenses such as DictPFL start from a pretrained model. The public split is the first
`public_fraction` of a seeded, stratified permutation of the training set; clients get
only the rest. Its size and the epochs are part of the scenario, hence of the cell id. Every row of a scenario
starts from the same warm start, so it is computed once for the same inputs and read back from a file keyed by
all of them (`cached_pretrain`).
"""
from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import numpy as np
import torch


def split_public(labels: torch.Tensor, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(public indices, client indices): a seeded per-class split, so both sides see every class."""
    rng = np.random.default_rng(seed + 7919)
    y = labels.numpy()
    public = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        public.append(idx[: int(round(fraction * len(idx)))])
    public = np.sort(np.concatenate(public)) if public else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(len(y)), public)
    return public, rest


def pretrain(model: torch.nn.Module, task, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
             lr: float, seed: int) -> dict[str, torch.Tensor]:
    """Central SGD on the public split; returns the trained state dict."""
    gen = torch.Generator().manual_seed(seed + 104729)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr, momentum=0.9)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=gen).split(batch_size):
            opt.zero_grad()
            task.loss(model, x[batch], y[batch]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def cache_dir() -> Path:
    """Where warm starts persist between processes (LEAKBENCH_WARM_CACHE=0 turns the cache off)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    return root / "leakbench" / "warm-starts"


def _code_digest(model: torch.nn.Module) -> str:
    """The sources a warm start's numbers depend on besides its inputs: this package (factories, losses, this
    module) and the module defining the model's class (a plugin's own file)."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    files = sorted(here.rglob("*.py")) + [Path(inspect.getsourcefile(type(model)) or __file__).resolve()]
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def warm_start_key(model: torch.nn.Module, task, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
                   lr: float, seed: int) -> str:
    """Every input of `pretrain`, hashed: the model's initial state (its architecture and seeded init), the
    public split's tensors, the settings, the task, the code, torch's version and thread count (which set the
    order of float reductions)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for tensor in (x, y):
        digest.update(str(tuple(tensor.shape)).encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    settings = (epochs, batch_size, repr(float(lr)), seed, type(task).__module__, type(task).__qualname__,
                torch.__version__, torch.get_num_threads(), _code_digest(model))
    digest.update(repr(settings).encode())
    return digest.hexdigest()[:24]


def cached_pretrain(model: torch.nn.Module, task, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
                    lr: float, seed: int) -> dict[str, torch.Tensor]:
    """`pretrain`, computed once for the same inputs (`warm_start_key`) and read back afterwards: every defense's
    row of a scenario starts from the same warm start, and a language model's takes minutes. Only the entries the
    training changed are stored; the model is left in the trained state either way."""
    if os.environ.get("LEAKBENCH_WARM_CACHE", "1") == "0":
        return pretrain(model, task, x, y, epochs, batch_size, lr, seed)
    path = cache_dir() / f"{warm_start_key(model, task, x, y, epochs, batch_size, lr, seed)}.pt"
    if path.is_file():
        changed = torch.load(path, map_location="cpu", weights_only=True)
        state = model.state_dict()
        model.load_state_dict({**state, **changed})
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.random.fork_rng(devices=[]):   # a cache hit draws nothing: neither may a miss, for what follows
        trained = pretrain(model, task, x, y, epochs, batch_size, lr, seed)
    changed = {k: v for k, v in trained.items() if not torch.equal(v, before[k])}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(changed, partial)
    os.replace(partial, path)   # atomic: a concurrent reader sees the whole file or none
    return trained
