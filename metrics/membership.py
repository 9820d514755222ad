"""Membership-inference metrics from raw scores, one definition each (anchors A3).

Scores are oriented "higher = member" suite-wide; every attack converts its native sign
before it hands scores over. Definitions:

- AUROC (sklearn), with a 95% percentile bootstrap interval (1000 paired resamples,
  seeded) in the record's details;
- TPR@alpha = max TPR over ROC points with FPR <= alpha (LeakPro's rule, inclusive);
- FPR@95%TPR = min FPR over ROC points with TPR >= 0.95;
- balanced accuracy = max over thresholds of (TPR + 1 - FPR) / 2 (the LiRA code's);
- TPR@0.1%FPR only with >= 1000 non-members: with fewer it collapses to TPR@0%FPR,
  so it is recorded as unavailable with that reason.

NaN scores are dropped and counted (n_dropped), never silently imputed; +-inf keep their rank.
When no member/non-member pair is left (a diverged model), the metrics are recorded as unavailable. The raw scores
and membership labels go into the record's details so the page can draw ROC curves.
"""
from __future__ import annotations

import numpy as np

from bench.protocol.evidence import Evidence, metric

MIN_NONMEMBERS_FOR_0_1 = 1000
BOOTSTRAP = 1000


def _clean(scores, labels) -> tuple[np.ndarray, np.ndarray, int]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if s.shape != y.shape:
        raise ValueError(f"{s.size} membership scores for {y.size} labels")
    keep = ~np.isnan(s)
    s, y = s[keep], y[keep]
    finite = s[np.isfinite(s)]   # +-inf are valid extreme ranks (e.g. -inf for an infinite loss): keep the order
    hi, lo = (finite.max() + 1.0, finite.min() - 1.0) if finite.size else (1.0, -1.0)
    return np.nan_to_num(s, posinf=hi, neginf=lo), y, int((~keep).sum())


def _both_classes(y: np.ndarray) -> None:
    if not (y == 1).any() or not (y == 0).any():
        raise ValueError("membership metrics need at least one member and one non-member with a non-NaN score")


def _unscorable(labels: np.ndarray, scores: np.ndarray) -> str | None:
    """Why no ROC metric exists (every member's or non-member's score is NaN, e.g. a diverged model)."""
    _, y, dropped = _clean(scores, labels)
    if (y == 1).any() and (y == 0).any():
        return None
    return f"unavailable: {dropped} of {len(labels)} scores are NaN, leaving no member/non-member pair to rank"


def auroc(scores, labels) -> float:
    from sklearn.metrics import roc_auc_score

    s, y, _ = _clean(scores, labels)
    _both_classes(y)
    return float(roc_auc_score(y, s))


def tpr_at_fpr(scores, labels, alpha: float) -> float:
    from sklearn.metrics import roc_curve

    s, y, _ = _clean(scores, labels)
    _both_classes(y)
    fpr, tpr, _ = roc_curve(y, s)
    return float(tpr[fpr <= alpha].max())


def fpr_at_tpr(scores, labels, level: float = 0.95) -> float:
    from sklearn.metrics import roc_curve

    s, y, _ = _clean(scores, labels)
    _both_classes(y)
    fpr, tpr, _ = roc_curve(y, s)
    return float(fpr[tpr >= level].min())


def balanced_accuracy(scores, labels) -> float:
    from sklearn.metrics import roc_curve

    s, y, _ = _clean(scores, labels)
    _both_classes(y)
    fpr, tpr, _ = roc_curve(y, s)
    return float(np.max((tpr + 1.0 - fpr) / 2.0))


def bootstrap_auroc(scores, labels, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of AUROC over paired resamples (Mann-Whitney form, vectorized);
    resamples that draw a single class are skipped."""
    from scipy.stats import rankdata

    s, y, _ = _clean(scores, labels)
    _both_classes(y)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(s), size=(n, len(s)))
    ys, ss = y[idx], s[idx]
    pos = ys.sum(1)
    neg = len(s) - pos
    ok = (pos > 0) & (neg > 0)
    ranks = rankdata(ss[ok], axis=1)
    u = (ranks * ys[ok]).sum(1) - pos[ok] * (pos[ok] + 1) / 2.0
    values = u / (pos[ok] * neg[ok])
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def _evidence(ev: Evidence) -> tuple[np.ndarray, np.ndarray] | None:
    rec, truth = ev.reconstruction, ev.truth
    scores = getattr(rec, "scores", None) if rec is not None else None
    labels = getattr(truth, "member", None) if truth is not None else None
    if scores is None or labels is None:
        return None
    return np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)


def membership_details(ev: Evidence) -> dict:
    """Raw scores and labels (for ROC curves), counts, and the AUROC bootstrap interval."""
    pair = _evidence(ev)
    if pair is None:
        return {}
    scores, labels = pair
    s, y, dropped = _clean(scores, labels)
    lo, hi = bootstrap_auroc(s, y) if _unscorable(labels, scores) is None else (float("nan"), float("nan"))
    return {"scores": [float(v) if np.isfinite(v) else str(v) for v in scores], "labels": [int(v) for v in labels],
            "n_members": int(y.sum()), "n_nonmembers": int(len(y) - y.sum()), "n_dropped": dropped,
            "mia_auroc_ci95": [lo, hi]}


def _scored(fn):
    def compute(ev: Evidence):
        pair = _evidence(ev)
        if pair is None:
            return None
        return _unscorable(pair[1], pair[0]) or fn(*pair)
    return compute


metric("mia_auroc", "", True, "privacy", "membership AUROC (0.5 = chance); 95% bootstrap interval in details",
       details=membership_details)(_scored(auroc))
metric("mia_tpr_at_1fpr", "", True, "privacy", "max TPR with FPR <= 1%")(
    _scored(lambda s, y: tpr_at_fpr(s, y, 0.01)))
metric("mia_tpr_at_5fpr", "", True, "privacy", "max TPR with FPR <= 5%")(
    _scored(lambda s, y: tpr_at_fpr(s, y, 0.05)))
metric("mia_fpr_at_95tpr", "", False, "privacy", "min FPR with TPR >= 95% (higher = harder to catch members)")(
    _scored(lambda s, y: fpr_at_tpr(s, y, 0.95)))
metric("mia_balanced_acc", "", True, "privacy", "best balanced accuracy over thresholds (0.5 = chance)")(
    _scored(balanced_accuracy))


@metric("mia_tpr_at_0.1fpr", "", True, "privacy",
        f"max TPR with FPR <= 0.1%; only with >= {MIN_NONMEMBERS_FOR_0_1} non-members")
def tpr_at_0_1(ev: Evidence):
    pair = _evidence(ev)
    if pair is None:
        return None
    if _unscorable(pair[1], pair[0]):
        return _unscorable(pair[1], pair[0])
    s, y, _ = _clean(*pair)
    n_non = int(len(y) - y.sum())
    if n_non < MIN_NONMEMBERS_FOR_0_1:
        return (f"unavailable: needs >= {MIN_NONMEMBERS_FOR_0_1} non-members, has {n_non} "
                "(it would collapse to TPR at 0% FPR)")
    return tpr_at_fpr(s, y, 0.001)
