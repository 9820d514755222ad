"""SPEAR's disaggregation of one ReLU linear layer's batch gradient (Dimitrov et al., NeurIPS 2024), as tensors:
the factors, the sampling, the filter and the candidate pool here; the scales and the greedy selection (steps 4
and 5) in attacks/gradient/spear_select.py.

A linear layer Z = X W^T + b (X: B x n inputs) followed by ReLU, trained on a batch of B, has the weight gradient
G = D X (m x n) with D = (dL/dZ)^T (m x B): rank <= B. Its factorization G = L R (L = U_B S_B, R = V_B^T of the SVD)
leaves one unknown, an invertible Q (B x B) with D = L Q and X = Q^{-1} R (the paper's theorem 3.2). ReLU makes
each column of D sparse: D[j, i] = 0 wherever neuron j is off for sample i (Z[i, j] <= 0). So each column q_i of Q
is orthogonal to the rows of L where sample i is off: B - 1 of them fix q_i up to scale. The steps, each one
function:

1. `decompose`: the SVD, rank B; rows with no gradient (neurons off for the whole batch) dropped; each row of L
   normalized so that a zero reads the same on every row; the zero tolerance from the spectrum's tail.
2. Sampling (`kernels`): a subset A of B - 1 rows gives the direction q with L_A q = 0 (the smallest right
   singular vector). The paper draws A uniformly (`uniform_subsets`); where an estimate of the batch is at hand it
   draws A among the rows that estimate predicts to be off for one sample (`guided_subsets`; the paper uses
   Geiping et al.'s reconstruction that way for batches past ~25).
3. Filtering: a direction is kept only if L_A has rank B - 1 (a unique kernel) and L q has at least
   `min_zeros` zeros, more than the B - 1 every proposal has by construction; a survivor is then re-solved on all
   the rows it leaves at zero (`polish`: exact to rounding, and spurious ones drop out) and repeats are merged
   (`Pool`).
4. Greedy selection (`select`): candidates by sparsity, each kept if it is independent of those kept, until B;
   then swaps that raise the sparsity-matching score (`consistency`: the share of entries where D is zero
   exactly where the reconstructed X switches the neuron off), as the paper's two greedy stages, with a guard
   the paper does not have (`swaps`): swaps across every column are kept only where they make the selection
   exact, else only the untrusted or filled-in columns are swapped, since with several wrong columns the score
   does not tell which are wrong.
5. Scale (`scales`): the bias gradient is D 1 = L Q_unit s, solved for s; then X = (Q_unit diag(s))^{-1} R.
   Where the bias gradient is hidden, each input's scale is bounded by the ReLU pattern (`sign_scales`).

Everything here is float64 on the CPU; the caller turns a view into G, the bias gradient, W and b.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Factors:
    """G = L R on the used rows; `rows` indexes them in the layer, `unit` is L with unit rows."""

    L: torch.Tensor        # (m', B)
    R: torch.Tensor        # (B, n)
    unit: torch.Tensor     # (m', B)
    rows: torch.Tensor     # (m',) layer rows used
    tol: torch.Tensor      # (m',) per row: |unit_j . q| below it reads as zero
    tail: float            # sigma_{B+1} / sigma_1: how far G is from rank B (float32 rounding for a batch gradient)


def decompose(grad: torch.Tensor, batch: int, noise: float = 0.0, base_tol: float = 1e-5,
              floor: float = 1e-4) -> Factors:
    """The rank-`batch` factorization of a weight gradient (m x n). Rows under `floor` of the largest row norm are
    left out (a neuron off for the whole batch has none; one barely on is rounding noise). The zero tolerance
    of row j grows as its norm shrinks: the rounding (or `noise`, relative) of G perturbs every row alike."""
    grad = grad.double()
    norms = grad.norm(dim=1)
    rows = torch.nonzero(norms > floor * norms.max().clamp_min(1e-300)).flatten()
    u, s, vh = torch.linalg.svd(grad[rows], full_matrices=False)
    rank = min(batch, len(s))
    L, R = u[:, :rank] * s[:rank], vh[:rank]
    tail = float(s[rank] / s[0]) if len(s) > rank and s[0] > 0 else 0.0
    row = L.norm(dim=1).clamp_min(1e-300)
    unit = L / row[:, None]
    tol = torch.clamp(1e3 * max(tail, noise) * row.max() / row, min=base_tol, max=1e-2)
    return Factors(L, R, unit, rows, tol, tail)


def kernels(unit: torch.Tensor, subsets: torch.Tensor, rank_tol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """For each subset of B - 1 rows (N x (B-1) indices): the unit q with unit[A] q = 0, and whether L_A has
    rank B - 1 (else the kernel is not unique and the proposal is void). At B = 1 the subsets are empty and the
    one direction is q = 1."""
    if subsets.shape[1] == 0:
        return torch.ones(len(subsets), unit.shape[1], dtype=unit.dtype), torch.ones(len(subsets), dtype=torch.bool)
    sv = torch.linalg.svd(unit[subsets])
    full = sv.S[:, -1] > rank_tol * sv.S[:, 0]
    return sv.Vh[:, -1, :], full


def zero_counts(unit: torch.Tensor, q: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """How many rows each direction (N x B) leaves at zero."""
    return ((unit @ q.T).abs() < tol[:, None]).sum(0)


def chance_zeros(f: Factors, batch: int, gen: torch.Generator, count: int = 2000, gap: int = 3) -> int:
    """How many zeros past the forced B - 1 uniform proposals reach by chance: rows that are collinear or lie in
    low-dimensional groups (neurons on for one or two samples of the batch) come along with the subset. The
    chance counts form a run from 0 up; hits on a sample lie far above it, past a `gap` of empty counts."""
    q, full = kernels(f.unit, uniform_subsets(len(f.rows), batch, count, gen))
    extra = torch.bincount(zero_counts(f.unit, q[full], f.tol) - (batch - 1))
    top = 0
    for e in range(1, len(extra)):
        if extra[e] > 0:
            if e - top > gap:
                break
            top = e
    return top


def uniform_subsets(rows: int, batch: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` subsets of B - 1 rows drawn uniformly without replacement (the paper's sampling)."""
    return torch.argsort(torch.rand(count, rows, generator=gen), dim=1)[:, :batch - 1]


def guided_subsets(pre: torch.Tensor, batch: int, per_row: int, gen: torch.Generator,
                   skip: set[int] = frozenset()) -> tuple[torch.Tensor, torch.Tensor]:
    """Subsets of B - 1 rows among those an estimate predicts to be off for one sample: `pre` (k x m') holds the
    estimate's pre-activations; for each estimated sample the rows it switches off, most negative first, a random
    prefix of them, and B - 1 rows of that prefix. Returns the subsets and which estimated sample each serves."""
    out, owner = [], []
    for k in range(pre.shape[0]):
        off = torch.nonzero(pre[k] <= 0).flatten()
        if k in skip or len(off) < batch - 1:
            continue
        off = off[torch.argsort(pre[k, off])]
        for _ in range(per_row):
            size = int(torch.randint(batch - 1, len(off) + 1, (1,), generator=gen))
            out.append(off[:size][torch.randperm(size, generator=gen)[:batch - 1]])
            owner.append(k)
    if not out:
        return torch.zeros(0, batch - 1, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.stack(out), torch.tensor(owner)


def polish(f: Factors, q: torch.Tensor, unique: float = 1e-3) -> tuple[torch.Tensor, int] | None:
    """The direction least-squares orthogonal to every row q leaves at zero (not just the B - 1 it was drawn
    from), with its zero count; None if those rows are not orthogonal to exactly one direction (a spurious
    proposal: a mix of two samples whose zero sets overlap leaves their common zeros to a whole plane)."""
    for _ in range(2):
        rows = (f.unit @ q).abs() < f.tol
        if int(rows.sum()) < q.shape[0] - 1:
            return None
        sv = torch.linalg.svd(f.unit[rows])
        d = sv.Vh[-1]
        second = q.shape[0] - 2           # the (B-1)-th singular value: zero where the kernel is a plane or more
        if float(((f.unit[rows] @ d).abs() / f.tol[rows]).max()) >= 1.0 or \
                (second >= 0 and float(sv.S[second]) < unique * float(sv.S[0])):
            return None
        q = d
    return q, int(((f.unit @ q).abs() < f.tol).sum())


def plane_directions(f: Factors, d1: torch.Tensor, d2: torch.Tensor, min_zeros: int,
                     min_group: int = 5) -> list[torch.Tensor]:
    """Directions v = cos(t) d1 + sin(t) d2 with at least `min_zeros` zero rows. Row j is zero at the one angle
    with tan(t) = -a_j / b_j (a = L d1, b = L d2). In the plane of samples a and b, the rows where only a is off
    share a's angle and those where only b is off share b's, while every mix of the two is zero on one row more
    than the rows both leave off; so only angles shared by `min_group` rows or more mark a sample (a few rows meet at
    one angle by chance, within their tolerance). A mix of two
    samples found as a candidate thus yields both samples, with either sample or another mix beside it. Each
    row's angle is tried and its zeros counted at each row's own tolerance."""
    a, b = f.unit @ d1, f.unit @ d2
    both = (a.abs() < f.tol) & (b.abs() < f.tol)             # zero for the whole plane
    if bool(both.all()):
        return []
    theta = torch.atan2(-a[~both], b[~both])
    values = a[:, None] * torch.cos(theta)[None, :] + b[:, None] * torch.sin(theta)[None, :]   # (m', k)
    zero = values.abs() < f.tol[:, None]
    group = (zero & ~both[:, None]).sum(0)
    keep = (group >= min_group) & (zero.sum(0) >= min_zeros)
    out: list[torch.Tensor] = []
    for t in torch.nonzero(keep).flatten().tolist():
        v = torch.nn.functional.normalize(torch.cos(theta[t]) * d1 + torch.sin(theta[t]) * d2, dim=0)
        if not any(float((v @ u).abs()) > 1 - 1e-6 for u in out):
            out.append(v)
    return out


class Pool:
    """The filtered candidate directions, repeats merged (|cos| above `same`), with their zero counts and hits."""

    def __init__(self, batch: int, min_zeros: int, same: float = 1 - 1e-6, limit: int | None = None) -> None:
        self.batch, self.min_zeros, self.same = batch, min_zeros, same
        # a batch has B directions; where part of the layer is hidden, sparse mixes pass as trusted by the
        # thousand and each round's planes multiply them (the selection's N x N overlaps then outgrow memory),
        # so planes are drawn from, and pruning keeps, only the `limit` best-ranked candidates
        self.limit = max(256, 8 * batch) if limit is None else limit
        self.q = torch.zeros(0, batch, dtype=torch.float64)
        self.zeros: list[int] = []
        self.hits: list[int] = []
        self.owner: list[int] = []
        self.proposals = 0

    def add(self, f: Factors, subsets: torch.Tensor, owner: torch.Tensor | None = None) -> int:
        """Filter the proposals of these subsets and insert the survivors; how many new directions joined."""
        if len(subsets) == 0:
            return 0
        self.proposals += len(subsets)
        q, full = kernels(f.unit, subsets)
        zeros = zero_counts(f.unit, q, f.tol)
        before = len(self.q)
        for t in torch.nonzero(full & (zeros >= self.min_zeros)).flatten().tolist():
            self.insert(f, q[t], -1 if owner is None else int(owner[t]))
        return len(self.q) - before

    def add_planes(self, f: Factors, overlap: float = 0.8) -> int:
        """The sparse directions (`plane_directions`) in the plane of each candidate and the one sharing most of
        its zero rows, where that is at least `overlap` of them (a mix of samples a and b is zero where both are
        off, inside a's and b's zero sets); how many joined."""
        if len(self.q) < 2:
            return 0
        before = len(self.q)
        zero = ((f.unit @ self.q.T).abs() < f.tol[:, None]).double()        # (m', N)
        shared = (zero.T @ zero).fill_diagonal_(-1.0)                       # [d, t]: zeros in common
        for d in sorted(self.ranked()[:self.limit]):
            t = int(shared[d].argmax())
            if shared[d, t] >= overlap * self.zeros[d]:
                for v in plane_directions(f, self.q[d], self.q[t], self.min_zeros):
                    self.insert(f, v, -1)
        return len(self.q) - before

    def prune(self, f: Factors, spare: int) -> None:
        """Keep the trusted candidates (the `limit` best-ranked of them) and the `spare` best-ranked others (mixes
        of similar samples multiply with the proposals: they cost the selection time and add nothing once their
        samples are found)."""
        trusted = self.trusted(f)
        if len(trusted) > self.limit:
            trusted = self.ranked(trusted)[:self.limit]   # the trusted come first, sparsest first
        keep = sorted(set(trusted) | set([i for i in self.ranked(trusted) if i not in trusted][:spare]))
        self.q = self.q[keep]
        self.zeros, self.hits, self.owner = ([v[i] for i in keep] for v in (self.zeros, self.hits, self.owner))

    def insert(self, f: Factors, q: torch.Tensor, owner: int) -> None:
        """Polish a direction (`polish`) and keep it if sparse enough and new (else count a hit)."""
        found = polish(f, q)
        if found is None or found[1] < self.min_zeros:
            return
        d, count = found
        cos = (self.q @ d).abs() if len(self.q) else torch.zeros(0)
        if len(cos) and bool((cos > self.same).any()):
            self.hits[int(cos.argmax())] += 1
            return
        self.q = torch.cat([self.q, d[None]])
        self.zeros.append(count)
        self.hits.append(1)
        self.owner.append(owner)

    def trusted(self, f: Factors, slack: float = 0.05) -> list[int]:
        """Candidates that are no mix of two others: a mix of samples a and b is zero only where both are off (plus a
        row), so its zero set lies, but for `slack` of it, inside two sparser candidates' zero sets."""
        zero = ((f.unit @ self.q.T).abs() < f.tol[:, None]).double()   # (m', N)
        zeros = torch.tensor(self.zeros, dtype=torch.float64)
        outside = zeros[:, None] - zero.T @ zero                        # [c, a]: c's zeros a lacks
        inside = (outside <= torch.clamp(slack * zeros, min=2.0)[:, None]) & (zeros[None, :] > zeros[:, None])
        return [c for c in range(len(self.q)) if int(inside[c].sum()) < 2]

    def ranked(self, trusted: list[int] | None = None) -> list[int]:
        """Candidate indices: trusted ones first (all, if not given), then sparsest, then most often proposed."""
        first = set(range(len(self.q)) if trusted is None else trusted)
        return sorted(range(len(self.q)), key=lambda i: (i not in first, -self.zeros[i], -self.hits[i]))


__all__ = ["Factors", "Pool", "chance_zeros", "decompose", "guided_subsets", "kernels", "plane_directions", "polish",
           "uniform_subsets", "zero_counts"]
