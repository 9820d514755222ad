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


def _audit(ev: Evidence) -> dict | None:
    rec, truth = ev.reconstruction, ev.truth
    if rec is None or rec.scores is None or truth is None or truth.member is None:
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
