"""Audited epsilon: an empirical lower bound on the DP epsilon implied by a distinguishing attack.

The procedure is Jagielski, Ullman and Oprea (NeurIPS 2020), Algorithm 2, with the threshold chosen on
held-apart data as in jax_privacy's `Split` strategy: (epsilon, delta)-DP bounds every test's rates by
FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta, so

    eps >= max( ln((1 - delta - FPR) / FNR), ln((1 - delta - FNR) / FPR) ).

Given scores ("higher = member/canary in") and labels:
1. The trials are split in half by a seeded permutation; on the first half the threshold (over its
   scores, midway between neighbours) maximizing the bound of step 3 computed on that half is chosen.
2. On the second half FP and FN are counted at that threshold, and Clopper-Pearson one-sided upper
   bounds at level 1 - ALPHA / 2 each replace FPR and FNR (so both hold together with probability at
   least 1 - ALPHA = 95 %, by the union bound).
3. The bound above is reported (0 when it is not positive: the counts support no leak).
With fewer than MIN_PER_CLASS trials of either kind in the second half the bound is unavailable: the
counts cannot support one. The largest reportable bound grows with the trials (about ln(n / 3)
for n per class at 95 %), so a plaintext upload reads "large" only up to what the count allows.

One run (Steinke, Nasr and Jagielski, NeurIPS 2023): m canaries in one upload, each in by its own fair coin
(bench/federation/canary.py). The auditor guesses "in" for the highest scores and "out" for the lowest and
abstains on the rest (their Algorithm 1); a canary hidden from the server has no score and is never guessed.
Which side a guess falls on is read from the scores alone: the split of the two-cluster (Otsu) threshold t,
the r most confident being the r farthest from t (a function of the view only, as the theorem allows; with a
fixed k+ = k- a separable upload whose coins did not split evenly would be forced into errors). With r guesses
of which v are right, an (eps, delta)-DP upload gives (their Theorem 3, q = e^eps / (1 + e^eps),
f(u) = P[Binomial(r, q) >= u])

    P[v correct] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i,

and the bound is the largest eps whose p-value stays at or below the level. r runs over a grid fixed by m
alone (2, 4, 8, ... up to m, and m), each at level ALPHA / (grid size) (Bonferroni), so the reported maximum
holds at 95 %. Audited epsilon of canary trials and of one run are separate metrics; each applies to its own
evidence only.
"""
from __future__ import annotations

import math

import numpy as np

from bench.protocol.evidence import Evidence, metric

ALPHA = 0.05
MIN_PER_CLASS = 10


def clopper_pearson_upper(k: int, n: int, level: float) -> float:
    """One-sided upper confidence bound at `level` on a binomial rate from k successes in n trials."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def _bound(fpr: float, fnr: float, delta: float) -> float:
    out = -math.inf
    for a, b in ((fpr, fnr), (fnr, fpr)):
        if b > 0 and 1.0 - delta - a > 0:
            out = max(out, math.log((1.0 - delta - a) / b))
        elif b == 0 and 1.0 - delta - a > 0:
            out = math.inf
    return out


def _rates(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    """(false positives, negatives, false negatives, positives) of guessing "in" for score >= threshold."""
    guess = scores >= threshold
    neg, pos = labels == 0, labels == 1
    return int((guess & neg).sum()), int(neg.sum()), int((~guess & pos).sum()), int(pos.sum())


def epsilon_lower_bound(scores, labels, delta: float, seed: int = 0) -> dict:
    """The audit: bound, threshold, counts and confidence; bound None when the counts cannot support one."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    keep = ~np.isnan(s)
    s, y = s[keep], y[keep]
    order = np.random.default_rng(seed).permutation(len(s))
    pick, held = order[: len(s) // 2], order[len(s) // 2:]
    out = {"confidence": 1.0 - ALPHA, "delta": delta, "trials": int(len(s)), "threshold_trials": int(len(pick))}
    if min(int((y[held] == 0).sum()), int((y[held] == 1).sum())) < MIN_PER_CLASS or len(pick) == 0:
        return out | {"bound": None, "why": f"needs >= {MIN_PER_CLASS} trials of each kind in the held-apart half"}
    best, threshold = -math.inf, math.inf
    level = 1.0 - ALPHA / 2
    seen = np.unique(s[pick])
    for t in np.r_[seen[:1], (seen[1:] + seen[:-1]) / 2]:   # midway between neighbouring scores of the half
        fp, n, fn, p = _rates(s[pick], y[pick], t)
        value = _bound(clopper_pearson_upper(fp, n, level), clopper_pearson_upper(fn, p, level), delta)
        if value > best:
            best, threshold = value, float(t)
    fp, n, fn, p = _rates(s[held], y[held], threshold)
    fpr_up, fnr_up = clopper_pearson_upper(fp, n, level), clopper_pearson_upper(fn, p, level)
    bound = max(0.0, _bound(fpr_up, fnr_up, delta))
    return out | {"bound": bound, "threshold": threshold, "false_positives": fp, "negatives": n,
                  "false_negatives": fn, "positives": p, "fpr_upper": fpr_up, "fnr_upper": fnr_up}


def _one_run(ev: Evidence) -> bool:
    canary = ev.knowledge.canary if ev.knowledge is not None else None
    return canary is not None and canary.kind == "one-run"


def _audit(ev: Evidence) -> dict | None:
    rec, truth = ev.reconstruction, ev.truth
    if rec is None or rec.scores is None or truth is None or truth.member is None or _one_run(ev):
        return None
    delta = ev.knowledge.delta if ev.knowledge is not None else 1e-5
    return epsilon_lower_bound(rec.scores, truth.member, delta)


@metric("audited_epsilon", "", True, "privacy",
        "empirical lower bound on epsilon at the scenario's delta from the attack's guesses (Jagielski et al. 2020, "
        "Clopper-Pearson, 95 %; threshold chosen on half the trials): the same scale as DP-FedAvg's accountant epsilon",
        fmt="{:.2f}", display="audited ε (lower bound)",
        details=lambda ev: {"audit": _audit(ev)} if _audit(ev) is not None else {})
def audited_epsilon(ev: Evidence):
    audit = _audit(ev)
    if audit is None:
        return None
    return audit["bound"] if audit["bound"] is not None else f"unavailable: {audit['why']}"


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P-value of v correct among r guesses on m canaries if the upload were (eps, delta)-DP (Theorem 3)."""
    from scipy.stats import binom

    if v <= 0:
        return 1.0
    q = 1.0 / (1.0 + math.exp(-eps))
    tail = binom.sf(np.arange(v - 1, -1, -1), r, q)     # f(v), f(v - 1), ..., f(1): P[Binomial >= u]
    lead = float(tail[0])
    if delta == 0:
        return min(lead, 1.0)
    lower = np.r_[tail[1:], 1.0]                         # f(v - i) for i = 1..v (f(0) = 1)
    spread = float(np.max((lower - lead) / np.arange(1, v + 1)))
    return min(lead + 2.0 * m * delta * spread, 1.0)


def one_run_bound(m: int, r: int, v: int, delta: float, level: float = ALPHA, tol: float = 1e-6) -> float:
    """The largest eps at which v correct of r guesses on m canaries rejects (eps, delta)-DP at `level`; 0 when
    even eps = 0 is not rejected (bisection: the p-value grows with eps)."""
    if one_run_p_value(m, r, v, 0.0, delta) > level:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) <= level:
        lo, hi = hi, 2.0 * hi
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) <= level else (lo, mid)
    return lo


def guess_grid(m: int) -> list[int]:
    """Guesses tried: 2, 4, 8, ... up to m, and m; fixed by the number of canaries alone."""
    return sorted({1 << j for j in range(1, m.bit_length()) if (1 << j) <= m} | {m})


def split(scores: np.ndarray) -> float:
    """The two-cluster threshold of 1-d scores (Otsu: the cut maximizing the between-cluster variance), midway
    between the neighbours it separates."""
    s = np.sort(scores)
    n = len(s)
    if n < 2 or s[0] == s[-1]:
        return float(s[0]) if n else 0.0
    left = np.cumsum(s)[:-1]
    size = np.arange(1, n)
    between = size * (n - size) * (left / size - (s.sum() - left) / (n - size)) ** 2
    cut = int(np.argmax(between))
    return float((s[cut] + s[cut + 1]) / 2)


def one_run_audit(scores, labels, delta: float) -> dict:
    """The one-run audit: the best bound over the guess grid (Bonferroni), with the counts that gave it."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    m, grid = len(s), guess_grid(len(s))
    seen = np.flatnonzero(~np.isnan(s))
    t = split(s[seen])
    order = seen[np.argsort(-np.abs(s[seen] - t), kind="stable")]   # most confident first; hidden abstain
    right = (s[order] > t) == (y[order] == 1)
    level = ALPHA / len(grid)
    out = {"method": "one run (Steinke et al. 2023)", "confidence": 1.0 - ALPHA, "delta": delta, "canaries": m,
           "scored": int(len(seen)), "threshold": t, "level_per_r": level, "grid": grid, "bound": 0.0,
           "guesses": 0, "correct": 0}
    for r in grid:
        if r > len(order):
            break
        v = int(right[:r].sum())
        bound = one_run_bound(m, r, v, delta, level)
        if bound > out["bound"]:
            out |= {"bound": bound, "guesses": r, "correct": v}
    return out


def _one_run_audit(ev: Evidence) -> dict | None:
    rec, truth = ev.reconstruction, ev.truth
    if rec is None or rec.scores is None or truth is None or truth.member is None or not _one_run(ev):
        return None
    return one_run_audit(rec.scores, truth.member, ev.knowledge.delta)


@metric("one_run_epsilon", "", True, "privacy",
        "empirical lower bound on epsilon at the scenario's delta from one upload holding many canaries (Steinke, "
        "Nasr, Jagielski 2023, Theorem 3; the r scores farthest from the two-cluster split guessed, r over a fixed "
        "grid, Bonferroni, 95 %)",
        fmt="{:.2f}", display="audited ε, one run (lower bound)",
        details=lambda ev: {"one_run_audit": _one_run_audit(ev)} if _one_run_audit(ev) is not None else {})
def one_run_epsilon(ev: Evidence):
    audit = _one_run_audit(ev)
    return None if audit is None else audit["bound"]
