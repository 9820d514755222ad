"""Sensitivity (eq. 2), its optional DP noising (Algorithm 2) and Affinity Propagation clustering (section 3.1).

Sensitivity is per entry, Gamma = |w * dL/dw|, at the client's trained model with the
gradient of its whole local data (buffers score 0). The server compares clients by the
Euclidean distance of their vectors, so AP gets similarities -||Gamma_i - Gamma_j||
(precomputed; sklearn's own `euclidean` affinity would square them) with sklearn's default
preference, the median similarity, unless told otherwise: the paper names none.

DP (Algorithm 2): clip to L2 norm G, add N(0, sigma^2 G^2 I) with the Gaussian-mechanism
sigma = sqrt(2 ln(1.25/delta)) / epsilon. G is an input the paper leaves open (`dp_clip`).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

PREFERENCES = ("median", "min")


@torch.no_grad()
def model_at(fed, values: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A fresh copy of the public architecture holding `values`."""
    model = fed.new_model()
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    for n, v in values.items():
        state[n].copy_(v)
    return model


def sensitivity(fed, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Flat |w * grad| over fed.names at `model` on (x, y)."""
    grads = fed.gradient(x, y, model)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return np.concatenate([(state[n].detach() * grads[n]).abs().reshape(-1).double().numpy() for n in fed.names])


def warm_model(fed, client, epochs: int, generator: torch.Generator) -> torch.nn.Module:
    """Phase 1's W_i^1: `epochs` passes of local SGD from the global model (appendix E trains one iteration)."""
    model = fed.new_model()
    model.load_state_dict(fed.model.state_dict())
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=fed.scenario.lr)
    for _ in range(epochs):
        for batch in torch.randperm(client.num_samples, generator=generator).split(fed.scenario.batch_size):
            opt.zero_grad()
            fed.task.loss(model, client.x[batch], client.y[batch]).backward()
            opt.step()
    return model


def dp_sigma(epsilon: float, delta: float) -> float:
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def dp_accounting(epsilon: float, delta: float, clip: float, attacked: str) -> dict:
    """Algorithm 2's guarantee for the one sensitivity vector each client sends, the attacked client's as every
    other's: the paper's Gaussian mechanism (Dwork & Roth 2014, Thm A.1: sigma = sqrt(2 ln(1.25/delta)) / epsilon
    gives (epsilon, delta) for l2 sensitivity G, proven for epsilon < 1) and Opacus' RDP and PRV accountants for
    one release at the same sigma (valid at every epsilon); `epsilon` is the smallest valid bound. Adjacency: the
    paper's, a client's clipped vector against none (sensitivity G, user-level add/remove); replacing a client's
    data moves it by 2 G (`epsilon_replace_one`: the accountants at sigma / 2, the closed form at 2 epsilon where
    that is below 1)."""
    from bench.federation.accounting import report

    sigma = dp_sigma(epsilon, delta)
    closed = {"gaussian_mechanism": (epsilon if epsilon < 1 else math.inf, 2 * epsilon if 2 * epsilon < 1
                                     else math.inf)}
    epsilons, details = report(
        delta, [(sigma, 1.0, 1)], [(sigma, 1.0, 1)], level="user",
        sensitivity="G = dp_clip: a client's clipped sensitivity vector against none (Algorithm 2)",
        sampling="none: one release per client at setup", bounds=closed,
        covers="the sensitivity vector each client sends for clustering; model updates are not noised")
    return epsilons | {"dp": details | {"attacked_client": attacked, "noise_multiplier": sigma, "steps": 1,
                                        "clip": clip, "epsilon_nominal": epsilon}}


def dp_noise(gamma: np.ndarray, epsilon: float, delta: float, clip: float, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2, client side: clip to norm `clip`, add Gaussian noise of std sigma * clip per entry."""
    clipped = gamma / max(1.0, float(np.linalg.norm(gamma)) / clip)
    return clipped + rng.normal(0.0, dp_sigma(epsilon, delta) * clip, size=gamma.shape)


def distances(vectors: np.ndarray) -> np.ndarray:
    """Pairwise Euclidean distances of the clients' sensitivity vectors, one row at a time: memory N x D, not the
    N x N x D of a broadcast difference (10 clients of an 11.2 M-parameter model: 0.9 GB, not 18 GB); each
    pair's sum runs over the same contiguous row as before, so the values are the same to the bit."""
    out = np.empty((len(vectors), len(vectors)))
    for i, row in enumerate(vectors):
        out[i] = np.sqrt(((vectors - row) ** 2).sum(-1))
    return out


def affinity_propagation(dist: np.ndarray, preference: str | float = "median",
                         seed: int = 0) -> tuple[np.ndarray, bool]:
    """Cluster labels 0..k-1 and whether AP converged; non-convergence leaves every client on its own."""
    from sklearn.cluster import AffinityPropagation
    from sklearn.exceptions import ConvergenceWarning

    sim = -dist
    off = sim[~np.eye(len(sim), dtype=bool)] if len(sim) > 1 else sim.reshape(-1)
    pref = float(np.median(off)) if preference == "median" else float(off.min()) if preference == "min" \
        else float(preference)
    if len(sim) == 1:
        return np.zeros(1, int), True
    for damping in (0.5, 0.9):  # sklearn's default first; heavier damping if it oscillates
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            try:
                ap = AffinityPropagation(affinity="precomputed", preference=pref, damping=damping, max_iter=1000,
                                         random_state=seed).fit(sim)
            except ConvergenceWarning:
                continue
        if (ap.labels_ >= 0).all():
            return _relabel(ap.labels_), True
    return np.arange(len(sim)), False


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Cluster ids in order of first appearance, so the same partition always has the same ids."""
    ids: dict[int, int] = {}
    return np.array([ids.setdefault(int(v), len(ids)) for v in labels])


def merge_singletons(dist: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Every one-client cluster joins the cluster nearest to it (mean sensitivity distance to its members).

    The key server decrypts each cluster's aggregate; a cluster of one would hand that client's update to
    the aggregation server in the clear. Singletons are merged in client order, so when AP leaves every
    client alone (non-convergence) they pair up. Returns the relabelled clusters and how many merged."""
    labels = np.asarray(labels).copy()
    merged = 0
    while len(set(labels.tolist())) > 1:
        ids, counts = np.unique(labels, return_counts=True)
        alone = [c for c, n in zip(ids, counts) if n == 1]
        if not alone:
            break
        member = int(np.flatnonzero(labels == alone[0])[0])
        others = [c for c in ids if c != alone[0]]
        nearest = min(others, key=lambda c: (float(dist[member, labels == c].mean()), int(c)))
        labels[member] = nearest
        merged += 1
    return _relabel(labels), merged


def cluster_scores(dist: np.ndarray, labels: np.ndarray, truth: list[int] | None) -> dict:
    """ARI against the ground-truth categories (None without them) and the silhouette (None if undefined)."""
    from sklearn.metrics import adjusted_rand_score, silhouette_score

    k = len(set(labels.tolist()))
    sil = float(silhouette_score(dist, labels, metric="precomputed")) if 1 < k < len(labels) else None
    ari = float(adjusted_rand_score(truth, labels)) if truth is not None else None
    return {"ari": ari, "silhouette": sil, "ap_cluster_count": int(k)}
