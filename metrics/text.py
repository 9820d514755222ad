"""Text reconstruction metrics: ROUGE-1/2/L F-measure, exact match and token accuracy.

Predictions are matched to references as DAGER's official code does: for a decoder, each
reference takes the prediction with the most position-wise equal tokens (a prediction may
serve several references); for an encoder, a Hungarian assignment on 1 - ROUGE-1 F. The
attack says which (`Reconstruction.extra["matching"]`). ROUGE is rouge-score's F-measure
without stemming. DAGER reports the bootstrap "mid" of an aggregate over every sentence of
every batch; we report the plain mean over sentences (deterministic). The runner averages
per-batch means, which equals the pooled mean because every attacked batch has the same
size. Special tokens ([CLS], [SEP], padding) are dropped from both sides before scoring,
so they cannot inflate ROUGE.

Token set: DAGER's first stage reads which tokens a batch holds without their order (the whole reconstruction where
the second stage cannot run; attacks/dager/tokens.py). An attack that reports it (Reconstruction.extra "tokens",
ids) is scored on it as such: precision, recall and F1 of the recovered ids against the batch's distinct tokens,
and ROUGE-1 of the bag, each recovered token once, against the batch's tokens with their counts (unigram counts
clipped, on the model's token ids), special tokens removed from both.
"""
from __future__ import annotations

import numpy as np

from bench.protocol.evidence import Evidence, metric

_SCORER = None


def _scorer():
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer
        _SCORER = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    return _SCORER


def reference_ids(ev: Evidence) -> list[list[int]]:
    """The attacked batch's sentences as token ids, padding and special tokens removed."""
    tok = ev.knowledge.tokenizer
    special = set(getattr(tok, "all_special_ids", []))
    return [[int(t) for t in row if int(t) not in special] for row in ev.truth.x.tolist()]


def _ids(tok, text: str) -> list[int]:
    special = set(getattr(tok, "all_special_ids", []))
    return [t for t in tok(text, add_special_tokens=False)["input_ids"] if t not in special]


def matched(ev: Evidence) -> tuple[list[str], list[str]] | None:
    """(prediction matched to each reference, references), or None when the cell has no text reconstruction."""
    rec = ev.reconstruction
    if rec is None or rec.texts is None or ev.truth is None or ev.knowledge is None:
        return None
    if "_matched" in rec.extra:
        return rec.extra["_matched"]
    tok = ev.knowledge.tokenizer
    refs = [tok.decode(ids).strip() for ids in reference_ids(ev)]
    preds = [p.strip() for p in rec.texts] or [""]
    if rec.extra.get("matching") == "encoder":
        from scipy.optimize import linear_sum_assignment

        cost = np.array([[1.0 - _scorer().score(r, p)["rouge1"].fmeasure for p in preds] for r in refs])
        rows, cols = linear_sum_assignment(cost)
        pick = dict(zip(rows, cols))
        out = [preds[pick[i]] if i in pick else "" for i in range(len(refs))]
    else:
        pred_ids = [_ids(tok, p) for p in preds]
        out = []
        for r in refs:
            rid = _ids(tok, r)
            hits = [sum(a == b for a, b in zip(rid, q)) for q in pred_ids]
            out.append(preds[int(np.argmax(hits))])
    rec.extra["_matched"] = (out, refs)
    return out, refs


def _rouge(kind: str):
    def compute(ev: Evidence):
        pairs = matched(ev)
        if pairs is None:
            return None
        return float(np.mean([_scorer().score(r, p)[kind].fmeasure for p, r in zip(*pairs)]))
    return compute


def _rouge_metric(kind: str, what: str):
    return metric(kind, "", True, "privacy", f"ROUGE {what} F-measure of recovered vs true sentences "
                  "(rouge-score, no stemming; mean over all attacked sentences)")(_rouge(kind))


rouge1 = _rouge_metric("rouge1", "unigram")
rouge2 = _rouge_metric("rouge2", "bigram")
rougeL = _rouge_metric("rougeL", "longest-common-subsequence")


@metric("exact_match", "", True, "privacy", "fraction of true sentences recovered exactly (after matching)")
def exact_match(ev: Evidence):
    pairs = matched(ev)
    return None if pairs is None else float(np.mean([p == r for p, r in zip(*pairs)]))


@metric("token_acc", "", True, "privacy", "fraction of true tokens recovered at their position (after matching)")
def token_acc(ev: Evidence):
    pairs = matched(ev)
    if pairs is None:
        return None
    tok = ev.knowledge.tokenizer
    hit = total = 0
    for p, r in zip(*pairs):
        rid, pid = _ids(tok, r), _ids(tok, p)
        hit += sum(a == b for a, b in zip(rid, pid))
        total += len(rid)
    return hit / max(total, 1)


def _token_sets(ev: Evidence) -> tuple[list[int], list[int]] | None:
    """(recovered token ids, the batch's token ids with their counts), special tokens removed; None without a set."""
    rec = ev.reconstruction
    if rec is None or "tokens" not in rec.extra or ev.truth is None or ev.knowledge is None:
        return None
    special = set(getattr(ev.knowledge.tokenizer, "all_special_ids", []))
    found = sorted({int(t) for t in rec.extra["tokens"]} - special)
    return found, [t for row in reference_ids(ev) for t in row]


def _token_scores(ev: Evidence) -> dict[str, float] | None:
    sets = _token_sets(ev)
    if sets is None:
        return None
    found, batch = sets
    truth = set(batch)
    hit = len(truth.intersection(found))
    precision, recall = hit / max(len(found), 1), hit / max(len(truth), 1)
    overlap = sum(1 for t in found if t in truth)      # each recovered token once against its count in the batch
    p_bag, r_bag = overlap / max(len(found), 1), overlap / max(len(batch), 1)
    f1 = lambda p, r: 2 * p * r / (p + r) if p + r else 0.0   # noqa: E731
    return {"token_precision": precision, "token_recall": recall, "token_f1": f1(precision, recall),
            "bag_rouge1": f1(p_bag, r_bag)}


def _token_metric(name: str, description: str, display: str):
    def compute(ev: Evidence):
        scores = _token_scores(ev)
        return None if scores is None else scores[name]
    return metric(name, "", True, "privacy", description, display=display)(compute)


token_precision = _token_metric("token_precision", "fraction of the recovered token set that the batch holds "
                                "(a set without order, as DAGER's first stage reads it)", "token precision")
token_recall = _token_metric("token_recall", "fraction of the batch's distinct tokens recovered (a set without "
                             "order, as DAGER's first stage reads it)", "token recall")
token_f1 = _token_metric("token_f1", "F1 of the recovered token set against the batch's distinct tokens (a set "
                         "without order, as DAGER's first stage reads it)", "token F1")
bag_rouge1 = _token_metric("bag_rouge1", "ROUGE-1 F of the recovered token set, each token once, against the "
                           "batch's tokens with their counts (on the model's token ids)", "bag ROUGE-1")
