"""Split a training set among federated clients: iid, Dirichlet label skew, or k classes each.

Only labels are needed, so the same code partitions images and text (text keeps its
sentiment label for this). Every scheme returns disjoint, sorted index arrays and is
deterministic for a seed, so a scenario always gives each client the same data.
"""
from __future__ import annotations

import numpy as np
import torch

SCHEMES = ("iid", "dirichlet", "k-classes")
_MAX_DRAWS = 1000


def partition(labels: torch.Tensor | np.ndarray, num_clients: int, scheme: str, *, alpha: float = 0.5,
              classes_per_client: int = 2, seed: int = 0, min_size: int = 1) -> list[np.ndarray]:
    """One int64 index array per client; disjoint, and their union is every sample (iid, dirichlet)."""
    y = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    y = y.reshape(-1)
    n = len(y)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if n < num_clients * min_size:
        raise ValueError(f"{n} samples cannot give {num_clients} clients >= {min_size} each; "
                         f"lower num_clients to {max(n // max(min_size, 1), 1)} or use more data")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), num_clients)
    elif scheme == "dirichlet":
        parts = _dirichlet(y, num_clients, alpha, min_size, rng)
    elif scheme == "k-classes":
        parts = _k_classes(y, num_clients, classes_per_client, min_size, rng)
    else:
        raise ValueError(f"unknown partition scheme '{scheme}'; use one of {', '.join(SCHEMES)}")
    return [np.sort(p).astype(np.int64) for p in parts]


def _dirichlet(y: np.ndarray, num_clients: int, alpha: float, min_size: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Per class, Dirichlet(alpha) client shares; redrawn until every client has >= min_size samples."""
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}; typical values are 0.1 (skewed) to 100 (iid)")
    by_class = [rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)]
    for _ in range(_MAX_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].append(piece)
        out = [np.concatenate(p) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(f"dirichlet alpha={alpha} left a client with < {min_size} samples in {_MAX_DRAWS} draws; "
                     f"raise alpha, lower num_clients or lower min_size")


def _k_classes(y: np.ndarray, num_clients: int, k: int, min_size: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Client i holds classes order[(i*k + j) % C]: consecutive blocks, so every class is used once
    num_clients*k >= C; each class's samples are split evenly among the clients holding it."""
    classes = rng.permutation(np.unique(y))
    if not 1 <= k <= len(classes):
        raise ValueError(f"classes_per_client must be in [1, {len(classes)}], got {k}")
    held = [[classes[(i * k + j) % len(classes)] for j in range(k)] for i in range(num_clients)]
    holders: dict[int, list[int]] = {}
    for client, cs in enumerate(held):
        for c in cs:
            holders.setdefault(int(c), []).append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in holders.items():
        idx = rng.permutation(np.flatnonzero(y == c))
        if len(idx) < len(clients):
            raise ValueError(f"class {c} has {len(idx)} samples for {len(clients)} clients; "
                             f"lower num_clients or classes_per_client, or use more data")
        for client, piece in zip(clients, np.array_split(idx, len(clients))):
            parts[client].append(piece)
    out = [np.concatenate(p) for p in parts]
    if min(len(p) for p in out) < min_size:
        raise ValueError(f"k-classes left a client with < {min_size} samples; lower num_clients or use more data")
    return out
