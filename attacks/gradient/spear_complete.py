"""The last one or two directions of a SPEAR selection from the ReLU pattern of the inputs they must belong to; an
addition to SPEAR's and SPEAR++'s steps (neither paper has it).

X = P R with P = Q^{-1}: row p_u of P is orthogonal to every column of Q but q_u. Once B - k columns are known
exactly, the k missing samples' rows of P lie in the k-dimensional complement of those columns, W, so their
inputs x = c W^T R lie in a known k-dimensional subspace of the layer's input space, whatever the missing columns
are. Each point c of it switches off the neurons j with w_j x + b_j <= 0, and the rows of L a missing sample leaves
at zero are exactly its off-neurons: so at the true input, and only there (the rows of one off-set have no
common kernel unless they belong to one sample), the unit rows of L on the off-neurons have a common kernel
vector, which is q_u. The off-set is constant on each cell of the arrangement of the m' hyperplanes
w_j x + b_j = 0 in that subspace: m' + 1 intervals of a line (k = 1), about m'^2 / 2 cells of a plane (k = 2,
each found from the segments every line is cut into). Each cell's off-set is tested by the smallest eigenvalue
of the Gram matrix of its rows; a passing cell's eigenvector is polished and joins the selection, whose
sparsity-matching score judges it, within MISMATCH alone (SPEAR's own test also forgives 3 entries, which on the
FCN's 64 rows lets a wrong last column pass). Which columns are known is not known: the selection's columns that
are no trusted pool candidate are the missing ones, else each column in turn (k = 1), and after the last round pairs of columns,
the worst-matching first (k = 2). The cost: a line is free, a plane about (m'^2 / 2) B^2 (a second or two at B = 32
on 256 rows), so the pairs tried are bounded by a budget.

What it cannot complete: a sample whose off-neurons are all off for another sample too (nested off-sets, common on
the FCN's 64 neurons) has zero rows of rank below B - 1: its direction is not fixed by zeros at all, in this step or
in SPEAR's."""
from __future__ import annotations

import itertools

import torch

from attacks.gradient.spear_select import MISMATCH, Selection, _evaluate, mismatches
from attacks.gradient.spear_solve import Factors, Pool, polish


def cells(a: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """One point inside every cell of the arrangement of a_j . c + c0_j = 0 (a: m x k, k = 1 or 2), as rows."""
    m, k = a.shape
    if k == 1:
        ok = a[:, 0].abs() > 1e-300
        cuts = torch.sort(-c0[ok] / a[ok, 0]).values
        span = 1.0 + cuts.abs().max() if len(cuts) else torch.tensor(1.0, dtype=a.dtype)
        edges = torch.cat([cuts[:1] - span, cuts, cuts[-1:] + span]) if len(cuts) else torch.stack([-span, span])
        return ((edges[1:] + edges[:-1]) / 2)[:, None]
    norm = a.norm(dim=1)
    points = []
    for j in torch.nonzero(norm > 1e-300).flatten().tolist():
        foot = -c0[j] * a[j] / norm[j] ** 2                       # the line's point nearest the origin
        along = torch.stack([-a[j, 1], a[j, 0]]) / norm[j]
        den, num = a @ along, -(a @ foot + c0)
        cut = den.abs() > 1e-12 * norm
        cut[j] = False
        ts = torch.sort(num[cut] / den[cut]).values
        if len(ts) == 0:
            ts = torch.zeros(1, dtype=a.dtype)
        span = 1.0 + ts.abs().max()
        edges = torch.cat([ts[:1] - span, ts, ts[-1:] + span])
        mids = (edges[1:] + edges[:-1]) / 2                          # one point on each segment of the line
        step = ((edges[1:] - edges[:-1]).abs() * 1e-3).clamp_min(1e-9 * span)
        base = foot[None] + mids[:, None] * along[None]
        side = (a[j] / norm[j])[None] * step[:, None]
        points += [base + side, base - side]                         # the two cells the segment divides
    return torch.cat(points)


def directions(f: Factors, known: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, keep: int = 64,
               chunk: int = 4096) -> list[torch.Tensor]:
    """The directions of the k = B - len(known) missing samples (k = 1 or 2) given the known columns (B x (B-k),
    exact): the polished kernels of the `keep` cells whose off-rows come nearest to a common kernel."""
    batch = f.L.shape[1]
    k = batch - known.shape[1]
    if k not in (1, 2):
        return []
    space = torch.linalg.svd(known.T).Vh[batch - k:].T                 # B x k: where the missing rows of P lie
    a = weight.double()[f.rows] @ (space.T @ f.R).T                     # m' x k: pre-activation per unit of c
    b = bias.double()[f.rows]
    off = torch.unique((cells(a, b) @ a.T + b[None]) <= 0, dim=0)       # (cells, m') each cell's off-neurons
    off = off[off.sum(1) >= batch - 1]
    scores, vectors = [], []
    for start in range(0, len(off), chunk):
        o = off[start:start + chunk].double()
        gram = torch.einsum("nm,ma,mb->nab", o, f.unit, f.unit)
        val, vec = torch.linalg.eigh(gram)
        scores.append(val[:, 0] / o.sum(1))
        vectors.append(vec[:, :, 0])
    if not scores:
        return []
    score, vector = torch.cat(scores), torch.cat(vectors)
    out: list[torch.Tensor] = []
    for i in torch.argsort(score)[:keep].tolist():
        found = polish(f, vector[i])
        if found is not None and not any(float((found[0] @ v).abs()) > 1 - 1e-6 for v in out):
            out.append(found[0])
    return out


def last_directions(f: Factors, pool: Pool, sel: Selection, bias_grad, weight, bias, final: bool = False,
                    budget: float = 1.3e8, options: int = 12) -> Selection:
    """The selection with its missing columns recovered where at most two are missing (see the module), or as it
    was. A plane costs about (m'^2 / 2) B^2 (its cells' Gram matrices): a round tries a pair where that fits in
    `budget` (B <= 64 on 256 rows), and `final` tries pairs of columns, the worst-matching first, as many as fit in
    16 budgets (every pair of a batch of 8 on the FCN's 64 rows, about 70 at B = 32 on 256). Each try puts every
    arrangement of its first `options` directions into the missing columns."""
    batch = sel.q.shape[1]
    plane = len(f.rows) ** 2 / 2 * batch ** 2
    trusted = set(pool.trusted(f))
    suspects = [p for p, i in enumerate(sel.chosen) if i < 0 or i not in trusted]
    worst = mismatches(f, sel.q / sel.q.norm(dim=0), sel.x, weight, bias) if sel.score >= 0 else \
        torch.zeros(batch)
    order = sorted(range(batch), key=lambda p: -float(worst[p]))
    tries = [tuple(suspects)] if len(suspects) == 1 or (len(suspects) == 2 and plane <= budget) else []
    if len(suspects) <= 1:
        tries += [(p,) for p in order if (p,) not in tries]
    if final:
        pairs = [t for n in range(2, batch + 1) for t in itertools.combinations(order[:n], 2)
                 if order[n - 1] in t]
        tries += [t for t in pairs if t not in tries][:int(16 * budget / plane)]
    for missing in tries:
        rest = [p for p in range(batch) if p not in missing]
        found = directions(f, sel.q[:, rest], weight, bias)
        if len(found) < len(missing):
            continue
        for picked in itertools.permutations(found[:options], len(missing)):
            q = sel.q.clone()
            for pos, v in zip(missing, picked):
                q[:, pos] = v
            s, x, score = _evaluate(f, q, bias_grad, weight, bias)
            if score >= 1.0 - MISMATCH:   # stricter than `exact`'s few entries, which pass near misses on 64 rows
                chosen = [-3 if p in missing else i for p, i in enumerate(sel.chosen)]
                return Selection(q, s, x, score, chosen)
    return sel


__all__ = ["cells", "directions", "last_directions"]
