"""Recovered text beside the sentence it recovers, paired as the text metrics pair them.

metrics/text.py matches each true sentence of a batch to one recovered sentence (decoders: the
prediction with the most position-wise equal tokens, as DAGER's code does; encoders: a Hungarian
assignment on 1 - ROUGE-1) and the record stores that pairing as `matched`, one prediction per
reference. The page lists every reference in full beside its matched prediction, so a batch
recovered exactly in another order reads as exact. A record without `matched` is paired here by a
Hungarian assignment on word-level F1 (ROUGE-1 on whitespace words). A reference whose prediction is
empty is "nothing recovered", never a match.
"""
from __future__ import annotations

from collections import Counter
from typing import Any


def word_f1(got: str, ref: str) -> float:
    """Unigram F-measure on lower-cased whitespace words (ROUGE-1 without its tokenizer)."""
    a, b = Counter(got.lower().split()), Counter(ref.lower().split())
    hit = sum((a & b).values())
    if not hit:
        return 0.0
    p, r = hit / sum(a.values()), hit / sum(b.values())
    return 2 * p * r / (p + r)


def hungarian(recovered: list[str], references: list[str]) -> list[str]:
    """One recovered sentence per reference, maximizing total word F1; "" where none is left."""
    preds = [p.strip() for p in recovered if p and p.strip()]
    if not preds or not references:
        return ["" for _ in references]
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    cost = np.array([[1.0 - word_f1(p, r) for p in preds] for r in references])
    rows, cols = linear_sum_assignment(cost)
    pick = dict(zip(rows.tolist(), cols.tolist()))
    return [preds[pick[i]] if i in pick else "" for i in range(len(references))]


def pairs(block: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per reference sentence of a batch: reference, its matched prediction, exact/partial/none."""
    refs = [str(r) for r in block.get("reference") or []]
    matched = block.get("matched")
    if not (isinstance(matched, list) and len(matched) == len(refs)):
        matched = hungarian([str(p) for p in block.get("recovered") or []], refs)
    rows = []
    for ref, got in zip(refs, matched):
        got = str(got or "").strip()
        status = "none" if not got else ("exact" if got == ref.strip() else "partial")
        rows.append({"reference": ref, "recovered": got, "status": status,
                     "overlap": 1.0 if status == "exact" else word_f1(got, ref)})
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """"40/40 exact", or "3/40 exact, 20 partial, 17 nothing recovered"."""
    n = len(rows)
    count = Counter(r["status"] for r in rows)
    parts = [f"{count['exact']}/{n} exact"]
    if count["partial"]:
        parts.append(f"{count['partial']} partial")
    if count["none"]:
        parts.append(f"{count['none']} nothing recovered")
    return ", ".join(parts)


def recovered_texts(blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A record's recovered texts for the page: the batches' rows and a one-line summary over all of them."""
    batches = [pairs(b) for b in blocks or []]
    rows = [r for b in batches for r in b]
    if not rows:
        return None
    return {"batches": batches, "summary": summary(rows),
            "exact": sum(r["status"] == "exact" for r in rows), "total": len(rows)}
