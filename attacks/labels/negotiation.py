"""Label leakage from the per-entry maps a client sends in the clear while negotiating.

SenseCrypt's sensitivity vector (|w * dL/dw| at the client's model over its whole data),
SelectiveShield's sensitive mask (normalized Fisher information > tau) and MaskCrypt's mask
proposal (the top-rho entries of a gradient-guided score) are per-entry maps of the client's
gradient on its local data, and they travel in the clear (the server view's metadata, layouts
in bench/protocol/wire.py). Their classifier-head rows carry the client's labels: the weight-gradient
row of class i is mean_k (p_ki - y_ki) e_k, driven by the (p - 1) terms of the samples the
client holds of class i, and only by the small p terms otherwise.

Per class, the score is the map's mean over that head row; a float map is first divided by the
server's |W_ij| (so |w * g| becomes |g|; entries with W_ij = 0 are left out). With several maps
each score vector is normalized to sum 1 and they are averaged. Choices, stated:
- Negotiation messages ("sent/...") are read when the view has any, latest per kind; otherwise
  the upload's own per-entry metadata (e.g. SenseCrypt's mask). MaskCrypt's upload indices are
  the union over all clients, so they only count when nothing client-specific was sent.
- The client's classes: those above the largest gap of the sorted log scores (a two-group split
  that needs no threshold), reported as `client_classes` and scored by `client_class_f1`
  against every label the client holds.
- The attacked batch's labels: B labels spread over those classes in proportion to their
  scores (largest remainder; B = 1 takes the top class), scored by the usual label metrics.
"""
from __future__ import annotations

import numpy as np

from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS


def _chosen_maps(view: ServerView) -> dict[str, np.ndarray]:
    maps = view.entry_maps()
    sent = {k: m for k, m in maps.items() if k.startswith("sent/")}
    if not sent:
        return maps
    latest: dict[str, tuple[int, str]] = {}
    for key in sent:
        _, round, what = key.split("/", 2)
        if what not in latest or int(round) > latest[what][0]:
            latest[what] = (int(round), key)
    return {key: sent[key] for _, key in latest.values()}


def head_scores(entry: np.ndarray, view: ServerView, knowledge: Knowledge, scale: bool) -> np.ndarray:
    """Mean of a per-entry map over each row of the head's weight (optionally per |W_ij|)."""
    weight = knowledge.head[0]
    offset = 0
    for name, value in view.values.items():
        if name == weight:
            break
        offset += value.numel()
    rows = entry[offset:offset + view.values[weight].numel()].reshape(view.values[weight].shape[0], -1)
    if scale:
        w = knowledge.global_params[weight].double().reshape(rows.shape).abs().numpy()
        ok = np.isfinite(w) & (w > 0)
        rows = np.where(ok, rows / np.where(ok, w, 1.0), 0.0)
        return rows.sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
    return rows.mean(axis=1)


def split_classes(scores: np.ndarray) -> np.ndarray:
    """Classes above the largest gap of the sorted log scores."""
    floor = max(float(scores.max()) * 1e-12, 1e-300)
    logs = np.log(np.maximum(scores, floor))
    order = np.argsort(-logs, kind="stable")
    gaps = logs[order][:-1] - logs[order][1:]
    present = np.zeros(len(scores), dtype=bool)
    present[order[:int(np.argmax(gaps)) + 1] if len(gaps) else order] = True
    return present


def spread(scores: np.ndarray, present: np.ndarray, batch_size: int) -> np.ndarray:
    """B labels over the present classes in proportion to their scores, by largest remainder."""
    share = np.where(present, scores, 0.0)
    share = share / share.sum() * batch_size if share.sum() > 0 else present / present.sum() * batch_size
    counts = np.floor(share).astype(np.int64)
    for i in np.argsort(-(share - counts), kind="stable")[:batch_size - int(counts.sum())]:
        counts[i] += 1
    return counts


@ATTACKS.register("negotiation-labels", "the client's classes and the batch's labels from the head rows of "
                                        "per-entry maps sent in the clear (sensitivity vectors, masks, proposals)")
class NegotiationLabels(Attack):
    family = "label"

    def applicable(self, setting: Setting) -> str | None:
        if setting.knowledge.task != "classification" or not setting.knowledge.head[0]:
            return f"reads classifier-head rows, this scenario is {setting.knowledge.task}"
        return None

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if not view.entry_maps():
            return "nothing per-entry was sent in the clear (no sensitivity vector, mask or proposal in the view)"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        maps = _chosen_maps(view)
        vectors = []
        for key, entry in maps.items():
            s = head_scores(entry, view, knowledge, scale=view.layouts[key] == "entries:f4")
            vectors.append(s / s.sum() if s.sum() > 0 else np.full_like(s, 1.0 / len(s)))
        scores = np.mean(vectors, axis=0)
        present = split_classes(scores)
        counts = spread(scores, present, knowledge.batch_size)
        labels = [int(c) for c in np.repeat(np.arange(len(counts)), counts)]
        return Reconstruction(label_counts=counts, labels=labels, client_classes=present, read_meta=sorted(maps),
                              extra={"class_scores": scores.tolist()})
