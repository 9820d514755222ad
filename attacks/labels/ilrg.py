"""iLRG (Ma et al., ICLR 2023): the batch's label counts from the last layer's gradients, by one linear solve.

With the head z = W e + b and batch-averaged cross-entropy over K samples,
db_i = (1/K) sum_k (p_ki - y_ki) and dW_i = (1/K) sum_k (p_ki - y_ki) e_k. So

1. e_i = dW_i / db_i approximates the mean embedding of class i's samples (untrained nets:
   p_ki ~ 1/C, so the samples labelled i dominate row i);
2. p_i = softmax(alpha * (W e_i + b)) through the server's copy of the head approximates
   their mean softmax vector (`estimate=True`: the uniform 1/C vector, the paper's ablation);
3. K db_i = sum_j n_j p_ji - n_i for every i, plus sum_j n_j = K, is a (C+1) x C system,
   solved by the Moore-Penrose pseudo-inverse; negatives are clipped, counts rounded, and
   counts above K zeroed, as the official code does (its "res" vector).

`ilrg` is the official algorithm: the ratio is taken in decimal scientific notation as the
official `get_emb` does (7-significant-digit mantissas divide, the exponent difference is
clamped to +-10, a zero db_i counts as mantissa 1 and exponent -64, so its row becomes
dW_i's mantissas times 1e10), and the head and softmax run in float32 like the official
`model.fc`.

`ilrg-guarded` is this benchmark's variant, not the paper's: with few classes the ratio is
often ill-conditioned. K db_i sums n_i negative weights (p - 1) and K - n_i positive ones (p),
so when they nearly cancel (n_i ~ K/C, common when C = 10) e_i mixes in the other classes'
mean embedding amplified by gain = sum|w| / |sum w|. Where the gain, computed from a first
count estimate, exceeds `max_gain`, the class takes the mean probability vector of the
well-conditioned classes instead (an untrained net's softmax barely depends on the label),
and the system is solved again with the refined counts; a |db_i| below 1e-7 of the largest
gets the zero embedding. Untrained 10-class digits models, B = 32, 40 batches: LnAcc 0.73 ->
0.99 (simplecnn), 0.95 -> 1.0 (mlp).

Partial view: only entries the server sees are used. A class takes part when its bias entry
is visible; its embedding is the ratio over the visible columns of its weight row, the hidden
coordinates set to zero (their values are unknown, and zero drops them from W e_i). Classes
with a hidden bias entry have no equation; their counts are unknown (reported 0), but their
samples still sit in the visible equations and the batch-size row, so they are pooled into
one extra unknown, the hidden-class mass, whose probability on visible class i is the mean of
the visible classes' p_ji (j != i). Without it the batch-size row would force the visible
counts to add up to K.

A multi-step model delta (update_kind "delta", local_steps > 1) is turned into a gradient
by knowledge.gradient as -update / (lr * steps): an approximation the paper does not
cover, recorded in the reconstruction's extra["approximate"].
"""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.attack import Attack, Reconstruction, Setting, head_applicable, head_blocked
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS

DB_GUARD = 1e-7   # ilrg-guarded: |db_i| below this fraction of max |db| gets the zero embedding
PASSES = 2        # ilrg-guarded: first solve, then one re-solve with the gain computed from its counts
EXP_CLAMP = 10    # official get_emb: the decimal exponent of the ratio is clamped to +-10
ZERO_EXP = -64    # official get_emb: a zero bias gradient counts as 1e-64


def visible_classes(view: ServerView, bias: str) -> np.ndarray:
    """Classes whose bias gradient entry is visible: each has one equation."""
    return view.visible[bias].reshape(-1).numpy().astype(bool)


def scientific(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mantissa and decimal exponent of every entry as printed by '%e' (7 significant digits)."""
    parts = [f"{v:e}".split("e") for v in x.reshape(-1).tolist()]
    mantissa = np.array([float(m) for m, _ in parts]).reshape(x.shape)
    exponent = np.array([int(e) for _, e in parts], dtype=np.int64).reshape(x.shape)
    return mantissa, exponent


def official_embeddings(grad_w: np.ndarray, grad_b: np.ndarray) -> np.ndarray:
    """e_i = dW_i / db_i as the official get_emb computes it (see the module docstring)."""
    mw, ew = scientific(grad_w)
    mb, eb = scientific(grad_b)
    zero = mb == 0.0
    mb, eb = np.where(zero, 1.0, mb), np.where(zero, ZERO_EXP, eb)
    power = np.clip(ew - eb[:, None], -EXP_CLAMP, EXP_CLAMP)
    return (1.0 / mb)[:, None] * mw * np.power(10.0, power)


def guarded_embeddings(grad_w: np.ndarray, grad_b: np.ndarray) -> np.ndarray:
    """e_i = dW_i / db_i, zero where db_i is too small for the ratio to mean anything."""
    scale = np.nanmax(np.abs(grad_b)) if np.isfinite(grad_b).any() else 0.0
    ok = np.isfinite(grad_b) & (np.abs(grad_b) > DB_GUARD * scale) & (np.abs(grad_b) > 0)
    ok &= np.isfinite(grad_w).all(axis=1)
    emb = np.zeros_like(grad_w)
    emb[ok] = grad_w[ok] / grad_b[ok, None]
    return emb


def class_probabilities(emb: np.ndarray, weight: torch.Tensor, bias: torch.Tensor, alpha: float) -> np.ndarray:
    """Row i: softmax(alpha * (W e_i + b)) in float32, the estimated mean softmax vector of class i's samples."""
    logits = torch.nn.functional.linear(torch.from_numpy(emb).float(), weight.float(), bias.float()) * alpha
    return torch.softmax(logits, dim=-1).double().numpy()


def ratio_gain(counts: np.ndarray, own_prob: np.ndarray, grad_b: np.ndarray, batch_size: int) -> np.ndarray:
    """sum_k |w_k| / |sum_k w_k| of each class's bias gradient: how much e_i amplifies mixing errors."""
    total = batch_size * grad_b                            # sum_k w_k
    negative = np.clip(counts, 0, None) * (1.0 - own_prob)  # the n_i weights (1 - p), in magnitude
    spread = negative + np.clip(negative + total, 0, None)  # plus the positive weights, sum_k p_ki
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total != 0, spread / np.abs(total), np.inf)


def solve_counts(probs: np.ndarray, grad_b: np.ndarray, batch_size: int,
                 seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares counts over the visible classes (plus the pooled hidden mass); (rounded, raw)."""
    num_classes = probs.shape[0]
    idx = np.flatnonzero(seen)
    hidden = len(idx) < num_classes
    a = np.zeros((len(idx) + 1, len(idx) + int(hidden)))
    v = np.zeros(len(idx) + 1)
    a[0, :] = 1.0
    v[0] = batch_size
    sub = probs[np.ix_(idx, idx)]                           # sub[j, i] = p_{j, i} for visible j, i
    a[1:, :len(idx)] = sub.T - np.eye(len(idx))
    v[1:] = (np.float32(batch_size) * grad_b[idx].astype(np.float32)).astype(np.float64)
    if hidden and len(idx) > 1:
        a[1:, -1] = (sub.sum(axis=0) - np.diag(sub)) / (len(idx) - 1)
    elif hidden:
        a[1:, -1] = (1.0 - sub[0, 0]) / (num_classes - 1)
    raw = np.linalg.pinv(a) @ v
    found = np.rint(np.clip(raw[:len(idx)], 0, None)).astype(np.int64)
    found[found > batch_size] = 0
    counts = np.zeros(num_classes, dtype=np.int64)
    counts[idx] = found
    full = np.full(num_classes, np.nan)
    full[idx] = raw[:len(idx)]
    return counts, full


@ATTACKS.register("ilrg", "iLRG, the official algorithm: label counts from the head's gradients by one "
                          "pseudo-inverse solve")
class ILRG(Attack):
    links = {"paper": "https://openreview.net/forum?id=FIrQfNSOoTr", "code": "https://github.com/BUAA-CST/iLRG"}
    family = "label"

    def __init__(self, alpha: float = 1.0, estimate: bool = False) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        super().__init__(alpha=alpha, estimate=estimate)
        self.alpha, self.estimate = float(alpha), bool(estimate)

    def applicable(self, setting: Setting) -> str | None:
        return head_applicable(setting.knowledge, need_bias=True)

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        """A hidden head does not block: the attack runs on what it sees and scores what it gets."""
        reason = head_blocked(view, knowledge, need_bias=True, need_visible_head=False)
        if reason:
            return reason
        weight, bias = knowledge.head
        if any(torch.isnan(knowledge.global_params[n]).any() for n in (weight, bias)):
            return "needs the server's copy of the classifier head, but the global head weights are not known to it"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        weight, bias = knowledge.head
        num_classes, batch = knowledge.num_classes, knowledge.batch_size
        seen = visible_classes(view, bias)
        if not seen.any():  # no class has an equation: every count is unknown, predicted 0
            return Reconstruction(label_counts=np.zeros(num_classes, dtype=np.int64), labels=[],
                                  extra={"visible_classes": 0})
        vis_w = view.visible[weight].reshape(num_classes, -1).numpy()
        grad_w = knowledge.gradient(view, weight).reshape(num_classes, -1).double().numpy()
        grad_b = knowledge.gradient(view, bias).reshape(-1).double().numpy()
        grad_w = np.where(vis_w & seen[:, None], grad_w, 0.0)
        grad_b = np.where(seen, grad_b, 0.0)
        counts, raw, extra = self.solve(grad_w, grad_b, seen, knowledge)
        labels = [int(c) for c in np.repeat(np.arange(num_classes), counts)]
        approximate = knowledge.update_kind == "delta" and knowledge.local_steps > 1
        return Reconstruction(label_counts=counts, labels=labels,
                              extra={"raw_counts": raw, "visible_classes": int(seen.sum()),
                                     "visible_head_weights": float(vis_w[seen].mean()),
                                     "approximate": approximate} | extra)

    def head(self, knowledge: Knowledge) -> tuple[torch.Tensor, torch.Tensor]:
        weight, bias = knowledge.head
        num_classes = knowledge.num_classes
        return (knowledge.global_params[weight].reshape(num_classes, -1),
                knowledge.global_params[bias].reshape(-1))

    def solve(self, grad_w, grad_b, seen, knowledge) -> tuple[np.ndarray, np.ndarray, dict]:
        num_classes, batch = knowledge.num_classes, knowledge.batch_size
        if self.estimate:
            probs = np.full((num_classes,) * 2, 1.0 / num_classes)
        else:
            probs = class_probabilities(official_embeddings(grad_w, grad_b), *self.head(knowledge), self.alpha)
        counts, raw = solve_counts(probs, grad_b, batch, seen)
        return counts, raw, {}


@ATTACKS.register("ilrg-guarded", "iLRG with this benchmark's conditioning guard (not the paper's): "
                                  "ill-conditioned classes take the mean softmax of the others")
class ILRGGuarded(ILRG):
    def __init__(self, alpha: float = 1.0, estimate: bool = False, max_gain: float = 5.0) -> None:
        if not max_gain >= 0:
            raise ValueError(f"max_gain must be >= 0 (0 turns the conditioning guard off), got {max_gain}")
        super().__init__(alpha=alpha, estimate=estimate)
        self.params["max_gain"] = max_gain
        self.max_gain = float(max_gain)

    def solve(self, grad_w, grad_b, seen, knowledge) -> tuple[np.ndarray, np.ndarray, dict]:
        if self.estimate:
            return super().solve(grad_w, grad_b, seen, knowledge)
        num_classes, batch = knowledge.num_classes, knowledge.batch_size
        ratio_probs = class_probabilities(guarded_embeddings(grad_w, grad_b), *self.head(knowledge), self.alpha)
        estimate = batch / num_classes - batch * grad_b          # counts if every p were 1/C
        own = np.full(num_classes, 1.0 / num_classes)
        guarded = np.zeros(num_classes, dtype=bool)
        for _ in range(PASSES if self.max_gain > 0 else 1):
            probs, guarded = self._guard(ratio_probs, ratio_gain(estimate, own, grad_b, batch), seen)
            counts, raw = solve_counts(probs, grad_b, batch, seen)
            estimate, own = np.nan_to_num(raw), np.diag(probs)
        return counts, raw, {"guarded_classes": int(guarded.sum())}

    def _guard(self, probs: np.ndarray, gain: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ill-conditioned classes take the mean probability vector of the well-conditioned visible ones."""
        bad = seen & (gain > self.max_gain) if self.max_gain > 0 else np.zeros_like(seen)
        good = seen & ~bad
        if not bad.any() or not good.any():
            return probs, np.zeros_like(seen)
        out = probs.copy()
        out[bad] = probs[good].mean(axis=0)
        return out, bad
