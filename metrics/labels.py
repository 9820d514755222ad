"""Label-recovery metrics, defined as the official iLRG code does.

LeAcc and LnAcc are accuracies over all C classes (of the existence vector and of the
rounded counts), so true negatives inflate them when B << C; IRec and the existence F1
do not saturate that way and sit beside them on the leaderboard.
"""
from __future__ import annotations

import numpy as np

from bench.protocol.evidence import Evidence, metric


def _counts(ev: Evidence) -> tuple[np.ndarray, np.ndarray] | None:
    rec = ev.reconstruction
    if rec is None or rec.label_counts is None or ev.truth is None:
        return None
    true = np.bincount(ev.truth.y.numpy(), minlength=len(rec.label_counts))
    return np.asarray(rec.label_counts, dtype=np.int64), true


@metric("label_acc", "", True, "privacy",
        "recovered label multiset overlap / max(B, #recovered): 1 = every label recovered, nothing extra", display="label acc.")
def label_acc(ev: Evidence):
    pair = _counts(ev)
    if pair is None:
        return None
    rec, true = pair
    return float(np.minimum(rec, true).sum() / max(true.sum(), rec.sum()))


@metric("leacc", "", True, "privacy", "iLRG LeAcc: accuracy of the class-existence vector over all C classes", display="LeAcc")
def leacc(ev: Evidence):
    from sklearn.metrics import accuracy_score

    pair = _counts(ev)
    return None if pair is None else float(accuracy_score(pair[1] > 0, pair[0] > 0))


@metric("lnacc", "", True, "privacy", "iLRG LnAcc: accuracy of the rounded per-class counts over all C classes", display="LnAcc")
def lnacc(ev: Evidence):
    from sklearn.metrics import accuracy_score

    pair = _counts(ev)
    return None if pair is None else float(accuracy_score(pair[1], pair[0]))


@metric("irec", "", True, "privacy", "iLRG IRec: instances recovered, sum_c min(n_hat_c, n_c) / B", display="IRec")
def irec(ev: Evidence):
    pair = _counts(ev)
    return None if pair is None else float(np.minimum(pair[0], pair[1]).sum() / pair[1].sum())


@metric("label_f1", "", True, "privacy", "F1 of the recovered class-existence vector (no true-negative inflation)", display="label F1")
def label_f1(ev: Evidence):
    from sklearn.metrics import f1_score

    pair = _counts(ev)
    return None if pair is None else float(f1_score(pair[1] > 0, pair[0] > 0, zero_division=0.0))


@metric("client_class_f1", "", True, "privacy",
        "F1 of the recovered set of classes the attacked client holds (what negotiation messages leak)")
def client_class_f1(ev: Evidence):
    from sklearn.metrics import f1_score

    rec = ev.reconstruction
    if rec is None or rec.client_classes is None or ev.truth is None or ev.truth.client_y is None:
        return None
    true = np.bincount(ev.truth.client_y.numpy(), minlength=len(rec.client_classes)) > 0
    return float(f1_score(true, np.asarray(rec.client_classes, bool), zero_division=0.0))
