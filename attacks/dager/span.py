"""DAGER's linear algebra: rank estimate, span basis, and the distance of candidates to the span.

For a linear map applied to token inputs X, the weight gradient is delta^T X: its rows lie
in span{x_t}. The rank counts singular values above tol, default sigma_max * 10 * eps of the
gradient's dtype, computed from the eigenvalues of the float64 Gram matrix G^T G (one d x d
eigendecomposition that resolves values far below float32's eps). Why not numpy's
matrix_rank rule (sigma_max * max(M, N) * eps, 2.7e-4 relative for GPT-2's 2304 x 768
c_attn): on float32 client gradients at d = 768 and B = 8, every true input direction sits
at >= 1e-4 sigma_max and the float32 floor at about 2e-8 sigma_max, with nothing between;
numpy's rule cut into the true spectrum (rank 94 for 95 distinct layer-1 inputs, 127 for
about 140), and the missing direction made sentences that share a first token stop early.
10 * eps (1.2e-6 relative) sits two orders above the floor and two below the weakest input. The distance of a candidate v is
||v/|v| - P v/|v|||_2 (DAGER's check_if_in_span, l2), computed directly against an
orthonormal basis of the span when its rank is under d/2 and against one of its
orthogonal complement otherwise: either way one float32 matmul of width min(k, d - k),
with no 1 - |Pv|^2 cancellation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NOISE_FLOOR_EPS = 10.0   # default rank tolerance in units of sigma_max * eps (see the module docstring)


@dataclass
class Span:
    """An orthonormal basis of a row space (or of its complement), with the rank used."""

    basis: torch.Tensor          # (d, k) if complement is False, else (d, d - k); float32
    complement: bool
    rank: int
    transform: torch.Tensor | None = None   # (r, d): candidates are mapped v -> A v first (LoRA grad B)
    coords: torch.Tensor | None = None      # visible input coordinates kept (partial views)
    hidden: torch.Tensor | None = None      # transform columns the server does not know (attacks/dager/hidden.py)

    def distance(self, v: torch.Tensor) -> torch.Tensor:
        """l2 distance of each unit-normalized row of v (..., d_in) to the span, shape (...)."""
        v = self.mapped(v.float())
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        if self.complement:
            return (v @ self.basis).norm(dim=-1)
        return (v - (v @ self.basis) @ self.basis.T).norm(dim=-1)

    def mapped(self, v: torch.Tensor) -> torch.Tensor:
        """What the span is compared with: v (..., d_in) through the transform and onto the kept coordinates."""
        if self.transform is not None:
            v = v @ self.transform.T
        return v[..., self.coords] if self.coords is not None else v

    def mapped_adjoint(self, y: torch.Tensor, width: int) -> torch.Tensor:
        """The adjoint of `mapped` for inputs of `width`: mapped(x) . y == x . mapped_adjoint(y)."""
        if self.coords is not None:
            full = y.new_zeros(y.shape[:-1] + (self.transform.shape[0] if self.transform is not None else width,))
            full[..., self.coords] = y
            y = full
        return y @ self.transform if self.transform is not None else y

    def residual(self, v: torch.Tensor) -> torch.Tensor:
        """v (..., d) minus its orthogonal projection on the span."""
        return (v @ self.basis) @ self.basis.T if self.complement else v - (v @ self.basis) @ self.basis.T

    def residual_sq(self, v: torch.Tensor) -> torch.Tensor:
        """|residual(v)|^2 in one product of width min(rank, d - rank) (the basis form cancels: a pre-test's)."""
        return (v @ self.basis).pow(2).sum(-1) if self.complement else \
            v.pow(2).sum(-1) - (v @ self.basis).pow(2).sum(-1)


def spectrum(mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(singular values descending, right singular vectors as columns) of mat (m, d), via float64 G^T G.

    On a CPU the eigendecomposition runs on one thread: threaded LAPACK spins when another process
    holds a core (d = 576: 0.05 s on one thread, 3-8 s on two of two busy cores)."""
    g = mat.double()
    gram = g.T @ g
    threads = torch.get_num_threads()
    if gram.device.type == "cpu":
        torch.set_num_threads(1)
    try:
        evals, evecs = torch.linalg.eigh(gram)
    finally:
        torch.set_num_threads(threads)
    order = torch.argsort(evals, descending=True)
    return evals[order].clamp_min(0).sqrt(), evecs[:, order]


def rank_of(singular: torch.Tensor, shape: tuple[int, int], tol: float | None,
            dtype: torch.dtype = torch.float32) -> int:
    """Singular values above tol (default sigma_max * NOISE_FLOOR_EPS * eps of dtype); shape is kept
    for callers that pass numpy's rule explicitly as tol."""
    if singular.numel() == 0 or float(singular[0]) == 0.0:
        return 0
    if tol is None:
        tol = float(singular[0]) * NOISE_FLOOR_EPS * torch.finfo(dtype).eps
    return int((singular > tol).sum())


def make_span(vectors: torch.Tensor, rank: int, transform: torch.Tensor | None = None,
              coords: torch.Tensor | None = None, hidden: torch.Tensor | None = None) -> Span:
    """Span of the top-`rank` right singular vectors (vectors: (d, d) from `spectrum`)."""
    d = vectors.shape[0]
    if rank <= d // 2:
        return Span(vectors[:, :rank].float().contiguous(), False, rank, transform, coords, hidden)
    return Span(vectors[:, rank:].float().contiguous(), True, rank, transform, coords, hidden)
