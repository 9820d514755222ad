"""SPEAR's last two steps (Dimitrov et al., NeurIPS 2024) on the candidates of attacks/gradient/spear_solve.py: the
scale of each input from the bias gradient (or, where it is hidden, the ReLU pattern), and the greedy selection of
B directions by the sparsity-matching score: the share of (neuron, sample) entries where the disaggregated
dL/dZ is zero exactly where the reconstructed input switches the neuron off. Float64 on the CPU."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks.gradient.spear_solve import Factors, Pool, plane_directions, polish

MISMATCH = 1e-3   # a sparsity-matching score within this share (or 3 entries) of 1 is an exact disaggregation:
#                   a wrong direction mismatches about 1 % of the entries, rounding at the zero tolerance a few


def exact(f: Factors, score: float) -> bool:
    """Whether a sparsity-matching score reads as the exact batch."""
    return score >= 1.0 - max(MISMATCH, 3.0 / (f.L.shape[0] * f.L.shape[1]))


def scales(f: Factors, q: torch.Tensor, bias_grad: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor) -> torch.Tensor:
    """s with L Q_unit s = dL/db on the used rows (hidden entries of the bias gradient left out); with fewer
    than B of them visible, `sign_scales`."""
    target = bias_grad.double()[f.rows]
    seen = torch.isfinite(target)
    if int(seen.sum()) < q.shape[1]:
        return sign_scales(f, q, weight, bias)
    return torch.linalg.lstsq((f.L @ q)[seen], target[seen][:, None]).solution[:, 0]


def sign_scales(f: Factors, q: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Without the bias gradient: x_i = t_i xhat_i (xhat from unit scales); neuron j is off for sample i exactly
    where t_i (W xhat_i)_j + b_j <= 0, each row a bound on t_i. s_i = 1 / t_i at the middle of the interval that
    meets the most bounds (a neuron on whose gradient is nonetheless zero breaks one)."""
    xhat = inputs(f, q, torch.ones(q.shape[1], dtype=torch.float64))
    a = (xhat @ weight.double()[f.rows].T).T                                 # (m', B)
    off = (f.unit @ q).abs() < f.tol[:, None]
    cut = -bias.double()[f.rows][:, None] / a
    above = (~off & (a > 0)) | (off & (a < 0))                               # the row wants t > cut
    out = torch.ones(q.shape[1], dtype=torch.float64)
    for i in range(q.shape[1]):
        lo, hi = cut[above[:, i], i].sort().values, cut[~above[:, i] & (a[:, i] != 0), i].sort().values
        points = torch.cat([lo, hi]).sort().values
        if len(points) == 0:
            continue
        edges = torch.cat([points[:1] - 1.0, points, points[-1:] + 1.0])
        mids = (edges[1:] + edges[:-1]) / 2
        met = torch.searchsorted(lo, mids) + (len(hi) - torch.searchsorted(hi, mids))
        best = int(met.argmax())
        out[i] = 1.0 / mids[best]
    return out


def inputs(f: Factors, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """X = (Q_unit diag(s))^{-1} R: the batch's inputs to the layer (B x n); NaN if Q is singular."""
    x, info = torch.linalg.solve_ex(q * s[None, :], f.R)
    return x if int(info) == 0 else torch.full_like(x, float("nan"))


def mismatches(f: Factors, q: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per sample, the rows where L q is zero but the layer's pre-activation of the reconstructed input is > 0,
    or the reverse."""
    zero = (f.unit @ (q / q.norm(dim=0, keepdim=True))).abs() < f.tol[:, None]        # (m', B)
    pre = x @ weight.double()[f.rows].T + bias.double()[f.rows]             # (B, m')
    return (zero != (pre.T <= 0)).sum(0)


def consistency(f: Factors, q: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> float:
    """The sparsity-matching score: the share of (row, sample) pairs where L q is zero exactly where the layer's
    pre-activation of the reconstructed input is <= 0."""
    return 1.0 - float(mismatches(f, q, x, weight, bias).sum()) / (q.shape[1] * len(f.rows))


@dataclass
class Selection:
    q: torch.Tensor         # (B, B) unit columns
    s: torch.Tensor         # (B,) scales
    x: torch.Tensor         # (B, n) the inputs
    score: float            # sparsity-matching score of the selection
    chosen: list[int]       # pool indices (-1: a column filled in from `fill`)


def _independent(chosen: torch.Tensor, q: torch.Tensor, floor: float = 1e-3) -> bool:
    if chosen.shape[1] == 0:
        return True
    coef = torch.linalg.lstsq(chosen, q[:, None]).solution
    return float((q[:, None] - chosen @ coef).norm()) > floor


def _evaluate(f: Factors, q: torch.Tensor, bias_grad, weight, bias) -> tuple[torch.Tensor, torch.Tensor, float]:
    s = scales(f, q, bias_grad, weight, bias)
    if not torch.isfinite(s).all() or bool((s == 0).any()):
        return s, torch.full((q.shape[1], f.R.shape[1]), float("nan"), dtype=torch.float64), -1.0
    x = inputs(f, q, s)
    return s, x, consistency(f, q, x, weight, bias) if bool(torch.isfinite(x).all()) else -1.0


def improve(f: Factors, q: torch.Tensor, chosen: list[int], options: list[tuple[int, torch.Tensor]],
            slots: list[int], bias_grad, weight, bias, budget: int = 4000) -> tuple[torch.Tensor, list[int], float]:
    """Swaps that raise the sparsity-matching score: the column (of `slots`) that matches worst first, each option
    (label, direction) in turn, the first improvement taken; at most `budget` trials. A column given up rejoins the
    options if it came from the pool (label >= 0)."""
    q, chosen, options = q.clone(), list(chosen), list(options)
    s, x, score = _evaluate(f, q, bias_grad, weight, bias)
    trials = 0
    while not exact(f, score) and options and trials < budget:
        worst = mismatches(f, q, x, weight, bias) if score >= 0 else torch.zeros(q.shape[1])
        taken = None
        for pos in sorted(slots, key=lambda p: -float(worst[p])):
            for n, (label, v) in enumerate(options):
                trial = q.clone()
                trial[:, pos] = v
                trials += 1
                value = _evaluate(f, trial, bias_grad, weight, bias)[2]
                if value > score:
                    taken = (pos, n, value)
                    break
            if taken or trials >= budget:
                break
        if taken is None:
            break
        pos, n, score = taken
        label, v = options.pop(n)
        if chosen[pos] >= 0:
            options.append((chosen[pos], q[:, pos].clone()))
        q[:, pos], chosen[pos] = v, label
        s, x, score = _evaluate(f, q, bias_grad, weight, bias)
    return q, chosen, score


def swaps(f: Factors, q: torch.Tensor, chosen: list[int], options, doubtful: list[int], bias_grad, weight,
          bias) -> tuple[torch.Tensor, list[int], float]:
    """`improve` in every column, kept where it reaches an exact score; else `improve` in the `doubtful` columns
    (untrusted or filled in) alone. With several wrong columns the score is no guide to which are wrong: a mix
    contaminates the inputs of every sample in it, and swapping a trusted column for another mix can raise the
    score (measured on a Fashion-MNIST batch of 32: swaps traded 3 to 5 of the 30 true columns for mixes, where the
    completion finds the last two once the 30 are kept). `options` lists the (label, direction) options."""
    wide = improve(f, q, chosen, options, list(range(q.shape[1])), bias_grad, weight, bias)
    if exact(f, wide[2]):
        return wide
    return improve(f, q, chosen, options, doubtful, bias_grad, weight, bias)


def select(f: Factors, pool: Pool, bias_grad, weight, bias, fill: torch.Tensor | None = None,
           swap_pool: int = 64) -> Selection:
    """Greedy selection of B directions: trusted, then sparsest independent candidates first (columns of `fill`, unit
    directions from an estimate, complete a short pool), then swaps that raise the sparsity-matching score
    (`swaps`) among the `swap_pool` best-ranked candidates, until none does or the score is exact."""
    batch = f.L.shape[1]
    trusted = set(pool.trusted(f))
    order = pool.ranked(list(trusted))
    cols: list[torch.Tensor] = []
    chosen: list[int] = []
    for i in order:
        if len(cols) == batch:
            break
        if _independent(torch.stack(cols, 1) if cols else torch.zeros(batch, 0, dtype=torch.float64), pool.q[i]):
            cols.append(pool.q[i])
            chosen.append(i)
    extra = [] if fill is None else [c / c.norm() for c in fill.T.double()]
    for c in sorted(extra, key=lambda c: float(torch.stack(cols, 1).T.matmul(c).abs().max()) if cols else 0.0):
        if len(cols) == batch:
            break
        if _independent(torch.stack(cols, 1) if cols else torch.zeros(batch, 0, dtype=torch.float64), c):
            cols.append(c)
            chosen.append(-1)
    while len(cols) < batch:   # nothing left to fill with: random directions (the score will say it is not exact)
        cols.append(torch.nn.functional.normalize(torch.randn(batch, dtype=torch.float64), dim=0))
        chosen.append(-1)
    q = torch.stack(cols, 1)
    doubtful = [p for p, i in enumerate(chosen) if i < 0 or i not in trusted]
    spare = [(i, pool.q[i]) for i in order[:swap_pool] if i not in chosen]
    q, chosen, _ = swaps(f, q, chosen, spare, doubtful, bias_grad, weight, bias)
    s, x, score = _evaluate(f, q, bias_grad, weight, bias)
    return Selection(q, s, x, score, chosen)


def repair(f: Factors, pool: Pool, sel: Selection, bias_grad, weight, bias) -> Selection:
    """For a selection that is not exact: two samples whose zero sets differ by a row or two are as sparse as
    every mix of them, so the sample may be missing from the pool while mixes are in it. Every direction with a
    shared zero angle (one row suffices) in the plane of each untrusted candidate and the trusted candidate
    sharing most of its zeros is tried in the selection's untrusted or filled-in columns (in any column only
    where that makes it exact: `swaps`), best swap first, while the sparsity-matching score rises."""
    trusted = pool.trusted(f)
    untrusted = [i for i in range(len(pool.q)) if i not in trusted]
    if not untrusted or not trusted:
        return sel
    zero = (f.unit @ pool.q.T).abs() < f.tol[:, None]
    tried: list[torch.Tensor] = []
    for d in untrusted:
        t = trusted[int((zero[:, [d]] & zero[:, trusted]).sum(0).argmax())]
        for v in plane_directions(f, pool.q[d], pool.q[t], pool.min_zeros, min_group=1):
            found = polish(f, v)
            if found is not None and not any(float((u @ found[0]).abs()) > pool.same for u in tried):
                tried.append(found[0])
    doubtful = [p for p, i in enumerate(sel.chosen) if i < 0 or i in untrusted]
    q, chosen, score = swaps(f, sel.q, sel.chosen, [(-2, v) for v in tried], doubtful, bias_grad, weight, bias)
    if score <= sel.score:
        return sel
    s, x, score = _evaluate(f, q, bias_grad, weight, bias)
    return Selection(q, s, x, score, chosen)


__all__ = ["MISMATCH", "Selection", "consistency", "exact", "improve", "inputs", "mismatches", "repair", "scales",
           "select", "sign_scales", "swaps"]
