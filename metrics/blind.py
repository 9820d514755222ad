"""Blind baseline of a membership split: how well the candidates alone, without any model, tell members from
non-members (Das, Zhang, Tramèr 2024, "Blind baselines beat membership inference attacks for foundation
models"). A split whose members differ from its non-members in length, compressibility or pixel
statistics hands every attack a signal that training did not create.

Features per candidate, model-free: text (token ids): length, compressed size over length (zlib on the
token ids' bytes), fraction of distinct tokens, mean and std of the ids; images: mean, std, min, max,
fraction of zero pixels, mean absolute neighbour difference; both: the one-hot label. A standardized
logistic regression is scored by 5-fold stratified cross-validation (out-of-fold probabilities, seeded)
on the same members and non-members the attacks score. A value above FLAG (0.55) is flagged on the page:
there the split, not the model, may be what leaks.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from bench.protocol.evidence import Evidence, metric

FLAG = 0.55


def features(x: torch.Tensor, y: torch.Tensor, num_classes: int, pad_id: int | None) -> np.ndarray:
    rows = []
    for xi in x:
        if not xi.is_floating_point():
            ids = xi[xi != pad_id] if pad_id is not None else xi.reshape(-1)
            ids = ids.numpy().astype(np.int64)
            n = max(len(ids), 1)
            rows.append([len(ids), len(zlib.compress(ids.tobytes())) / n, len(set(ids.tolist())) / n,
                         float(ids.mean()) if len(ids) else 0.0, float(ids.std()) if len(ids) else 0.0])
        else:
            img = xi.double().numpy()
            diff = np.abs(np.diff(img, axis=-1)).mean() if img.shape[-1] > 1 else 0.0
            rows.append([img.mean(), img.std(), img.min(), img.max(), float((img == 0).mean()), diff])
    onehot = np.eye(max(num_classes, 1))[y.numpy().astype(np.int64) % max(num_classes, 1)]
    return np.hstack([np.asarray(rows, dtype=np.float64), onehot])


def blind_auroc(x: torch.Tensor, y: torch.Tensor, member: np.ndarray, num_classes: int,
                pad_id: int | None, seed: int = 0) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    member = np.asarray(member, dtype=np.int64)
    folds = min(5, int(np.bincount(member, minlength=2).min()))
    if folds < 2:
        raise ValueError("a blind baseline needs at least two members and two non-members")
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    proba = cross_val_predict(model, features(x, y, num_classes, pad_id), member,
                              cv=StratifiedKFold(folds, shuffle=True, random_state=seed), method="predict_proba")
    return float(roc_auc_score(member, proba[:, 1]))


@metric("blind_auroc", "", None, "privacy",
        f"AUROC of a model-free classifier on the membership candidates alone (length, compressibility, pixel "
        f"statistics, label; 5-fold CV): above {FLAG} the split itself leaks (Das et al. 2024)",
        display="blind baseline AUROC", per_attack=False, flag_above=FLAG)
def blind(ev: Evidence):
    mk = ev.knowledge.membership if ev.knowledge is not None else None
    if mk is None or ev.truth is None or ev.truth.member is None or ev.truth.trial:
        return None
    pad = getattr(ev.knowledge.tokenizer, "pad_token_id", None) if ev.knowledge.tokenizer is not None else None
    return blind_auroc(mk.candidates_x, mk.candidates_y, ev.truth.member, ev.knowledge.num_classes, pad)
