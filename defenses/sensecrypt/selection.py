"""Per-client mask selection (eqs. 4-9): the scalarized knapsack under budget, security and MI constraints.

With the objectives normalized over their budget-feasible ranges (f1 in [0, K], f2 in
[0, F], K = floor(alpha N) and F the sensitivity of the top-K entries) and beta1 = beta2 = 1,
the scalarized problem is

    min  sum_k x_k (1/K - gamma_k / F)   s.t.  sum_k x_k <= K,  sum_k x_k gamma_k >= L * sum_k gamma_k,

L = 1 - C exp(-B alpha). For any feasible mask of m entries the top-m entries by sensitivity
are feasible too and score no worse, so the optimum is a top-m prefix; over prefixes the
objective m/K - G(m)/F is convex (G, the prefix sum of sorted sensitivities, is concave), so
m = clip(m*, m_S, K) with m* the number of entries whose gamma exceeds F/K (negative cost)
and m_S the shortest prefix meeting the security level. `solver="exact"` computes that in
O(N log N) (the complexity the paper quotes for its LP relaxation); `solver="milp"` hands
the same problem to scipy's HiGHS MILP and serves as the check.

Constraint (8), I(u; (1-X) u) <= eta_MI, is not linear. It is estimated as eq. 3 reads:
the entries are the samples, x the value and y the value as the server sees it (0 where
encrypted), binned into `bins` equal-width bins over the value range, plug-in estimate in
bits. It is enforced by growing the prefix (the smallest m' >= m that satisfies it, found by
bisection and checked) within the budget.

Infeasible: when the budget cannot meet the security level or the MI bound, the client
encrypts its top-K entries (the most protection its straggler-free budget allows) and the
violation is reported, never hidden.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SOLVERS = ("exact", "milp")


@dataclass(frozen=True)
class MaskResult:
    mask: np.ndarray          # flat bool over all update entries
    budget: int               # K = floor(alpha N)
    level: float              # required security level 1 - C exp(-B alpha)
    coverage: float           # achieved share of total sensitivity
    mi_bits: float            # I(u; (1-X) u) of the chosen mask
    security_ok: bool
    mi_ok: bool

    @property
    def feasible(self) -> bool:
        return self.security_ok and self.mi_ok

    def summary(self) -> dict:
        return {"fraction": float(self.mask.mean()) if self.mask.size else 0.0, "budget": self.budget,
                "level": self.level, "coverage": self.coverage, "mi_bits": self.mi_bits,
                "security_ok": self.security_ok, "mi_ok": self.mi_ok}


def histogram_mi(values: np.ndarray, mask: np.ndarray, bins: int = 32) -> float:
    """I(x; y) in bits with y = x outside the mask and 0 inside, plug-in over equal-width bins."""
    x = np.asarray(values, np.float64).reshape(-1)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    if x.size == 0 or hi <= lo:
        return 0.0
    inner = np.linspace(lo, hi, bins + 1)[1:-1]
    bx = np.digitize(x, inner)
    by = np.where(mask, np.digitize(0.0, inner), bx)
    joint = np.bincount(bx * bins + by, minlength=bins * bins).reshape(bins, bins) / x.size
    px, py = joint.sum(1), joint.sum(0)
    nz = joint > 0
    return max(0.0, float((joint[nz] * np.log2(joint[nz] / np.outer(px, py)[nz])).sum()))  # >= 0 up to rounding


def _prefix_mask(order: np.ndarray, m: int) -> np.ndarray:
    mask = np.zeros(order.size, bool)
    mask[order[:m]] = True
    return mask


def _milp_count(gamma: np.ndarray, budget: int, need: float, cost: np.ndarray) -> int | None:
    """Entries the MILP optimum selects (None if infeasible); the optimum is a prefix, so the count suffices."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    rows = np.vstack([np.ones(gamma.size), gamma])
    res = milp(cost, constraints=LinearConstraint(rows, [-np.inf, need], [budget, np.inf]),
               integrality=np.ones(gamma.size), bounds=Bounds(0, 1))
    if res.status != 0:
        return None
    return int(np.round(res.x).sum())


def solve_mask(gamma: np.ndarray, values: np.ndarray, alpha: float, B: float, C: float, eta_mi: float,
               bins: int = 32, solver: str = "exact") -> MaskResult:
    """The client's mask for sensitivities `gamma` of the update `values` under budget alpha."""
    if solver not in SOLVERS:
        raise ValueError(f"solver '{solver}' must be one of {', '.join(SOLVERS)}")
    gamma = np.asarray(gamma, np.float64).reshape(-1)
    n = gamma.size
    budget = int(math.floor(alpha * n + 1e-9))
    level = 1.0 - C * math.exp(-B * alpha)
    order = np.argsort(-gamma, kind="stable")
    total = float(gamma.sum())
    prefix = np.concatenate([[0.0], np.cumsum(gamma[order])]) / total if total > 0 else np.ones(n + 1)
    m_security = int(np.searchsorted(prefix, level - 1e-12, side="left")) if level > 0 else 0
    security_ok = m_security <= budget
    if not security_ok:
        m = budget
    elif budget == 0:
        m = 0
    else:
        top = prefix[budget] * total
        cost = 1.0 / budget - gamma / top if top > 0 else np.full(n, 1.0 / budget)
        if solver == "milp":
            m = _milp_count(gamma, budget, level * total, cost)
            m = budget if m is None else m
        else:
            m_star = int((cost < 0).sum())
            m = min(max(m_star, m_security), budget)
    mi = histogram_mi(values, _prefix_mask(order, m), bins)
    mi_ok = mi <= eta_mi
    if not mi_ok and m < budget:
        lo, hi = m, budget  # invariant: MI(lo) > eta; find the smallest passing prefix in (lo, hi]
        if histogram_mi(values, _prefix_mask(order, hi), bins) <= eta_mi:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if histogram_mi(values, _prefix_mask(order, mid), bins) <= eta_mi:
                    hi = mid
                else:
                    lo = mid
            m, mi_ok = hi, True
        else:
            m = budget
        mi = histogram_mi(values, _prefix_mask(order, m), bins)
        mi_ok = mi <= eta_mi
    mask = _prefix_mask(order, m)
    return MaskResult(mask, budget, level, float(prefix[m]), mi, security_ok, mi_ok)
