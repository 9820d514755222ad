"""Information-theoretic leakage: KDE mutual information between an update and the server's view of it.

As in SHE-LoRA (appendix F.3, after Moon et al. 1995): flatten the full update x and what
the server sees of it s into paired samples (x_j, s_j), fit Gaussian kernel density
estimates of p(x), p(s) and p(x, s), and average log p(x,s) - log p(x) - log p(s) over the
samples. Hidden entries enter s as the server sees them, as one constant (0): an encrypted
entry tells it nothing about x_j, so a fully hidden update has MI 0 and plaintext has the
most. Differences from the paper's snippet, each so numbers compare across cells: both
variables are standardized (so one bandwidth suits every model scale), the sample is drawn
with a fixed seed (every defense is scored on the same positions), the default bandwidth is
Scott's rule for the 2-d joint, n^(-1/6), used for all three fits as the paper uses one
bandwidth for all three, and the result is clipped at 0 (KDE bias can make it slightly negative).
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.neighbors import KernelDensity

from metrics.schema import Evidence, metric


def _standardize(a: np.ndarray) -> np.ndarray | None:
    std = a.std()
    if not np.isfinite(std) or std <= 1e-12 * max(1.0, float(np.abs(a).max())):
        return None
    return (a - a.mean()) / std


def _log_density(points: np.ndarray, bandwidth: float) -> np.ndarray:
    kde = KernelDensity(kernel="gaussian", bandwidth=bandwidth, rtol=1e-4).fit(points)
    return kde.score_samples(points)


def kde_mutual_information(x: np.ndarray, s: np.ndarray, *, max_samples: int = 2000,
                           bandwidth: float | None = None, seed: int = 0) -> float:
    """MI in nats between paired samples x and s; 0 when either is constant (nothing to share)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    if x.shape != s.shape:
        raise ValueError(f"x and s must pair up, got {x.size} and {s.size} entries")
    if x.size < 2:
        return 0.0
    if x.size > max_samples:
        pick = np.random.default_rng(seed).choice(x.size, size=max_samples, replace=False)
        x, s = x[pick], s[pick]
    x, s = _standardize(x), _standardize(s)
    if x is None or s is None:
        return 0.0
    h = bandwidth if bandwidth is not None else x.size ** (-1.0 / 6.0)
    joint = _log_density(np.column_stack([x, s]), h)
    mi = joint - _log_density(x[:, None], h) - _log_density(s[:, None], h)
    return max(0.0, float(mi.mean()))


def _seen(value: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(value.detach().double(), nan=0.0)


@metric("kde_mi", "nats", True, "privacy",
        "KDE mutual information between the client's full update and what the server sees of it (SHE-LoRA F.3)", display="KDE MI", per_attack=False)
def kde_mi(ev: Evidence):
    if ev.truth is None or ev.view is None or not getattr(ev.truth, "update", None):
        return None
    names = list(ev.truth.update)
    missing = [n for n in names if n not in ev.view.values]
    x = torch.cat([ev.truth.update[n].detach().double().reshape(-1) for n in names])
    s = torch.cat([torch.zeros(ev.truth.update[n].numel(), dtype=torch.float64) if n in missing
                   else _seen(ev.view.values[n]).reshape(-1) for n in names])
    return kde_mutual_information(x.numpy(), s.numpy())


@metric("hidden_fraction", "", None, "cost", "share of the attacked upload's entries the server does not see in "
        "plaintext (encrypted, kept local or withheld): the attacked client's own HE ratio", per_attack=False)
def hidden_fraction(ev: Evidence):
    if ev.view is None:
        return None
    return 1.0 - ev.view.visible_fraction()
