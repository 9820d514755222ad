"""Per-parameter scores that selective defenses rank, and the selection rules over them.

All scores are computed on a client's local data at the model it holds, over the
update entries (fed.names); buffers get score 0 (they carry no gradient).
"""
from __future__ import annotations

import numpy as np
import torch


def _per_sample_grads(fed, x: torch.Tensor, y: torch.Tensor, cap: int):
    """Yields the loss gradient of each of up to `cap` samples at the global model."""
    for i in range(min(cap, len(y))):
        yield fed.gradient(x[i:i + 1], y[i:i + 1])


def sensitivity(fed, x, y, cap: int = 64) -> dict[str, torch.Tensor]:
    """|w * dL/dw| (SenseCrypt eq. 2) with the batch gradient of the local data."""
    grads = fed.gradient(x[:cap], y[:cap])
    params = fed.params()
    return {n: (params[n] * grads[n]).abs() for n in fed.names}


def fisher(fed, x, y, cap: int = 32) -> dict[str, torch.Tensor]:
    """Empirical diagonal Fisher: mean over samples of the squared per-sample gradient."""
    acc = {n: torch.zeros(s) for n, s in fed.shapes.items()}
    count = 0
    for g in _per_sample_grads(fed, x, y, cap):
        count += 1
        for n in fed.names:
            acc[n] += g[n] ** 2
    return {n: v / max(count, 1) for n, v in acc.items()}


def label_sensitivity(fed, x, y, cap: int = 32) -> dict[str, torch.Tensor]:
    """FedML-HE's sensitivity |d g_m / d y_true|, computed exactly without one autograd call per parameter.

    With cross-entropy l = -sum_c y_c log p_c the gradient g = dl/dw is linear in the
    label vector y, so d g / d y_c = -d log p_c / d w: at the true class this is the
    per-sample loss gradient itself. The map is the mean of its magnitude over samples.
    """
    acc = {n: torch.zeros(s) for n, s in fed.shapes.items()}
    count = 0
    for g in _per_sample_grads(fed, x, y, cap):
        count += 1
        for n in fed.names:
            acc[n] += g[n].abs()
    return {n: v / max(count, 1) for n, v in acc.items()}


SCORES = {"sensitivity": sensitivity, "fisher": fisher, "label-sensitivity": label_sensitivity}
RULES = ("max", "min", "random")


def select(scores: dict[str, torch.Tensor], ratio: float, rule: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Global selection over all entries: the top (max), bottom (min) or a random `ratio` fraction."""
    if rule not in RULES:
        raise ValueError(f"selection rule '{rule}' must be one of {', '.join(RULES)}")
    flat = np.concatenate([s.detach().reshape(-1).double().numpy() for s in scores.values()])
    k = int(round(ratio * flat.size))
    chosen = np.zeros(flat.size, bool)
    if k > 0:
        if rule == "random":
            order = rng.permutation(flat.size)
        else:
            order = np.argsort(-flat if rule == "max" else flat, kind="stable")
        chosen[order[:k]] = True
    out, offset = {}, 0
    for name, s in scores.items():
        out[name] = chosen[offset:offset + s.numel()]
        offset += s.numel()
    return out
