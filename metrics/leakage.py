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

from bench.protocol.evidence import Evidence, metric


def _standardize(a: np.ndarray) -> np.ndarray | None:
    std = a.std()
    if not np.isfinite(std) or std <= 1e-12 * max(1.0, float(np.abs(a).max())):
        return None
    return (a - a.mean()) / std


def _log_density(points: np.ndarray, bandwidth: float) -> np.ndarray:
    from sklearn.neighbors import KernelDensity

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


def _pairs(ev: Evidence, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the client's update, the server's estimate of it) over `names`, position by position: what it saw,
    minus the global weights it knows where the protocol uploads trained weights; hidden entries as 0."""
    weights = ev.knowledge is not None and ev.knowledge.uploads_weights
    xs, ss = [], []
    for n in names:
        x = ev.truth.update[n].detach().double().reshape(-1)
        if n in ev.view.values:
            seen = ev.view.values[n].detach().double()
            if weights:
                seen = seen - torch.nan_to_num(ev.knowledge.global_params[n].detach().double(), nan=0.0)
            s = torch.nan_to_num(seen, nan=0.0).reshape(-1)
        else:
            s = torch.zeros_like(x)
        xs.append(x)
        ss.append(s)
    return torch.cat(xs).numpy(), torch.cat(ss).numpy()


def _applies(ev: Evidence) -> bool:
    return ev.truth is not None and ev.view is not None and bool(getattr(ev.truth, "update", None))


@metric("kde_mi", "nats", True, "privacy",
        "KDE mutual information between the client's full update and the server's estimate of it from what it sees "
        "(SHE-LoRA F.3)", display="KDE MI", per_attack=False)
def kde_mi(ev: Evidence):
    if not _applies(ev):
        return None
    return kde_mutual_information(*_pairs(ev, list(ev.truth.update)))


@metric("kde_mi_protected", "nats", True, "privacy",
        "KDE MI as kde_mi, over the parameters the defense hides at least in part (SHE-LoRA Fig. 10: its LoRA-A "
        "factors); none when it hides nothing", display="KDE MI (protected)", per_attack=False)
def kde_mi_protected(ev: Evidence):
    if not _applies(ev):
        return None
    names = [n for n in ev.truth.update if n not in ev.view.visible or not bool(ev.view.visible[n].all())]
    return kde_mutual_information(*_pairs(ev, names)) if names else None


@metric("hidden_fraction", "", None, "cost", "share of the attacked upload's entries the server does not see in "
        "plaintext (encrypted, kept local or withheld): the attacked client's own HE ratio", per_attack=False)
def hidden_fraction(ev: Evidence):
    if ev.view is None:
        return None
    return 1.0 - ev.view.visible_fraction()
