"""LoRA algebra of SHE-LoRA: layer pairs, column importance, column swapping, reparameterization.

A layer is one adapted matrix: B (m x r) and A (r x n), Delta W = B A (m x n); columns of A
are the layer's input features. A client of rank r_i uses the first r_i rows of A and columns
of B of the model's (maximum) rank; the rest stay zero, so they also get zero gradients.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Layer:
    a: str        # parameter name of lora_A (r_max x n)
    b: str        # parameter name of lora_B (m x r_max)
    module: str   # the adapted module (its input features are A's columns)


def layers(names: list[str]) -> list[Layer]:
    """Every (lora_A, lora_B) pair among the update's names; none means the model has no LoRA adapters."""
    out = []
    for a in names:
        if ".lora_A." in a:
            b = a.replace(".lora_A.", ".lora_B.")
            if b not in names:
                raise ValueError(f"'{a}' has no matching lora_B parameter")
            out.append(Layer(a, b, a.split(".lora_A.")[0]))
    return out


def importance(a: np.ndarray, feature_norms: np.ndarray) -> np.ndarray:
    """Section 3.1.1: S_j = sum_k |A_kj| * ||x_j||_2 (Wanda over the columns of A)."""
    return np.abs(a).sum(axis=0) * feature_norms


def feature_norms(model: torch.nn.Module, modules: list[str], x: torch.Tensor) -> dict[str, np.ndarray]:
    """||x_j||_2 of every input feature of each adapted module over the calibration tokens."""
    found = dict(model.named_modules())
    sums: dict[str, torch.Tensor] = {}
    hooks = []
    for name in modules:
        def hook(_mod, inputs, _output, name=name):
            feats = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + (feats ** 2).sum(0)
        hooks.append(found[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return {n: sums[n].sqrt().numpy() for n in modules}


def swap_order(n: int, order: list[int]) -> np.ndarray:
    """Section 3.2's column swap as a permutation: untouched columns first (in place order), then the
    negotiated columns in reverse, so every client's last k_i columns are the first k_i of `order`."""
    chosen = set(order)
    return np.array([j for j in range(n) if j not in chosen] + list(reversed(order)), dtype=int)


def svd(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD; LAPACK's divide-and-conquer (gesdd) can fail to converge on valid ill-conditioned
    matrices, so then the slower QR-iteration driver (gesvd) decides."""
    if not np.isfinite(w).all():
        raise ValueError("the LoRA update holds NaN or inf values (training diverged); lower lr")
    try:
        return np.linalg.svd(w, full_matrices=False)
    except np.linalg.LinAlgError:
        import scipy.linalg
        return scipy.linalg.svd(w, full_matrices=False, lapack_driver="gesvd")


def low_rank(b: np.ndarray, a: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Best rank-`rank` factors of B A from thin QRs of both factors (section 3.4's client-side SVD)."""
    qb, rb = np.linalg.qr(b)
    qa, ra = np.linalg.qr(a.T)
    u, s, vt = svd(rb @ ra.T)
    root = np.sqrt(s[:rank])
    return (qb @ u[:, :rank]) * root, (root[:, None] * vt[:rank]) @ qa.T


def svd_factors(w: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """U sqrt(S) and sqrt(S) V^T of a matrix, sliced to `rank` (the server's step for the plaintext part)."""
    if w.size == 0:
        return np.zeros((w.shape[0], 0)), np.zeros((0, w.shape[1]))
    u, s, vt = svd(w)
    root = np.sqrt(s[:rank])
    return u[:, :rank] * root, root[:, None] * vt[:rank]


def reparameterize(plain: tuple[np.ndarray, np.ndarray], cipher: np.ndarray, swap: np.ndarray,
                   rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Client side (eq. 4): plaintext factors over the first K swapped columns, SVD of the decrypted
    last k swapped columns (`cipher`, m x k, in swapped order), both zero-padded to n, stacked,
    columns restored to their places, re-factored to `rank`. Where K and k overlap the two add up."""
    b_p, a_p = plain
    k = cipher.shape[1]
    m, n = b_p.shape[0], len(swap)
    a_pad = np.zeros((a_p.shape[0], n))
    a_pad[:, :a_p.shape[1]] = a_p
    b_c, a_c = svd_factors(cipher, min(cipher.shape)) if k else (np.zeros((m, 0)), np.zeros((0, k)))
    a_c_pad = np.zeros((a_c.shape[0], n))
    a_c_pad[:, n - k:] = a_c
    b_g = np.concatenate([b_p, b_c], axis=1)
    a_g = np.concatenate([a_pad, a_c_pad], axis=0)
    unswapped = np.zeros_like(a_g)
    unswapped[:, swap] = a_g
    if b_g.shape[1] == 0:
        return np.zeros((m, rank)), np.zeros((rank, n))
    b_hat, a_hat = low_rank(b_g, unswapped, min(rank, b_g.shape[1]))
    pad = rank - b_hat.shape[1]
    return np.pad(b_hat, ((0, 0), (0, pad))), np.pad(a_hat, ((0, pad), (0, 0)))
