"""What a defense costs in utility: its difference to the undefended row of the same scenario, with a 95% interval.

Both rows of a scenario train on the same seeds and are scored on the same test set, so the interval is paired
where the records let it be: a bootstrap over test examples of the difference, read from each record's
`details["per_example"]`: `correct` (0/1 per test example, in test-set order) gives the accuracy difference,
`nll` (the summed negative log-likelihood of a test sequence, in nats) with `tokens` (its scored tokens) the
perplexity ratio. Pairing removes the variation both models share (the examples every model gets right or
wrong), so the interval is narrower than one from two independent accuracies whenever the two models agree more
often than chance would make them. A record without per-example results (computed before they were stored)
gets an unpaired interval, labelled so: Newcombe's hybrid score interval from the two Wilson intervals of
accuracy over `test_samples`; a perplexity without them gets none. A diverged training has no utility to
compare: it reads "diverged at round r", never a number. The bootstrap is seeded: a page renders the same twice.
"""
from __future__ import annotations

import math
import re
from typing import Any

from bench.evaluation.formats import is_number
from bench.evaluation.schema import defense_label, undefended
from bench.evaluation.usefulness import wilson

RESAMPLES = 2000
SEED = 0
CELLS = 4_000_000   # resampled entries held at once in the sequence bootstrap (memory bound, not a speed knob)


def diverged_round(rec: dict[str, Any]) -> int | str | None:
    """The round a diverged training stopped at ("?" when the record does not say), None when it did not diverge."""
    stored = rec["metrics"].get("diverged_round")
    if is_number(stored):
        return int(stored)
    if rec["status"] != "diverged":
        return None
    found = re.search(r"round (\d+)", rec.get("reason") or "")
    return int(found.group(1)) if found else "?"


def diverged_text(rec: dict[str, Any]) -> str:
    return f"diverged at round {diverged_round(rec)}"


def run_of(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record that speaks for a (scenario, defense) run's utility: every cell of the run carries the same
    utility metrics; one with per-example results where any has them."""
    ran = [r for r in records if r["metrics"]]
    return next((r for r in ran if r["details"].get("per_example")), ran[0] if ran else None)


def undefended_run(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The undefended row's run in one scenario's records (the first row whose records say it is undefended,
    bench/evaluation/calibration.py, that ran there), or None."""
    labels = [defense_label(r) for r in records if undefended(r) and r["metrics"]]
    return run_of([r for r in records if labels and defense_label(r) == labels[0]])


def _rng():
    import numpy as np
    return np.random.default_rng(SEED)


def paired_accuracy_gap(plain: list[int], other: list[int]) -> tuple[float, float, float]:
    """(accuracy of plain - accuracy of other, 95% percentile bootstrap interval), resampling test examples.
    Each example's difference is -1, 0 or 1, so resampling n examples with replacement is a multinomial draw of
    the three counts: the same distribution as resampling indices, at a cost independent of n."""
    import numpy as np
    diff = np.asarray(plain, dtype=float) - np.asarray(other, dtype=float)
    n = len(diff)
    counts = _rng().multinomial(n, [float((diff == v).mean()) for v in (-1.0, 0.0, 1.0)], size=RESAMPLES)
    boot = (counts[:, 2] - counts[:, 0]) / n
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(diff.mean()), float(low), float(high)


def paired_perplexity_ratio(plain_nll: list[float], other_nll: list[float], tokens: list[float]
                            ) -> tuple[float, float, float]:
    """(perplexity of other / perplexity of plain, 95% percentile bootstrap interval), resampling test sequences:
    exp(sum of the per-sequence NLL differences / sum of their tokens)."""
    import numpy as np
    diff = np.asarray(other_nll, dtype=float) - np.asarray(plain_nll, dtype=float)
    tok = np.asarray(tokens, dtype=float)
    n, rng, boot = len(diff), _rng(), []
    step = max(1, CELLS // n)
    for start in range(0, RESAMPLES, step):
        idx = rng.integers(0, n, size=(min(step, RESAMPLES - start), n))
        boot.append(np.exp(diff[idx].sum(axis=1) / tok[idx].sum(axis=1)))
    low, high = np.percentile(np.concatenate(boot), [2.5, 97.5])
    return float(math.exp(diff.sum() / tok.sum())), float(low), float(high)


def unpaired_accuracy_gap(plain: float, n_plain: int, other: float, n_other: int) -> tuple[float, float, float]:
    """plain - other with Newcombe's hybrid score interval (method 10 of Newcombe 1998) from two Wilson intervals."""
    l1, u1 = wilson(plain, n_plain)
    l2, u2 = wilson(other, n_other)
    d = plain - other
    return d, d - math.sqrt((plain - l1) ** 2 + (u2 - other) ** 2), d + math.sqrt((u1 - plain) ** 2 + (other - l2) ** 2)


def _per_example(rec: dict[str, Any], key: str) -> list | None:
    """A record's per-example results: a list of numbers, or 0/1 outcomes packed as the cell scorer stores them
    (`pack_bits`: base64 with their count `n`)."""
    stored = rec["details"].get("per_example") or {}
    values = stored.get(key)
    if isinstance(values, str) and isinstance(stored.get("n"), int) and not isinstance(stored["n"], bool):
        from bench.models.losses import unpack_bits   # where they are packed (it imports torch: only when needed)
        try:
            values = [int(v) for v in unpack_bits(values, stored["n"])]
        except ValueError:   # not base64 of that many bits: no paired interval (the unpaired one is said why)
            return None
    return values if isinstance(values, list) and values and all(is_number(v) for v in values) else None


def _accuracy(rec, plain) -> tuple[tuple[float, float, float] | None, str]:
    mine, theirs = _per_example(rec, "correct"), _per_example(plain, "correct")
    why = ""
    if mine and theirs:
        agree = all(abs(sum(c) / len(c) - r["metrics"]["accuracy"]) <= 0.5 / len(c)
                    for c, r in ((mine, rec), (theirs, plain)))
        if len(mine) != len(theirs):
            why = "their per-example results cover different test sets"
        elif not set(mine) | set(theirs) <= {0, 1}:
            why = "a per-example result is not 0 or 1"
        elif not agree:
            why = "the per-example results disagree with the stored accuracy"
        else:
            return paired_accuracy_gap(theirs, mine), f"paired bootstrap over {len(mine):,} test examples"
    n, m = rec["metrics"].get("test_samples"), plain["metrics"].get("test_samples")
    if is_number(n) and is_number(m) and n > 0 and m > 0:
        gap = unpaired_accuracy_gap(plain["metrics"]["accuracy"], int(m), rec["metrics"]["accuracy"], int(n))
        return gap, f"unpaired (Wilson, {int(n):,} test samples{': ' + why if why else ''})"
    return None, "no interval: the records store neither per-example results nor the test-set size"


def _perplexity(rec, plain) -> tuple[tuple[float, float, float] | None, str]:
    mine, theirs = _per_example(rec, "nll"), _per_example(plain, "nll")
    tokens = _per_example(rec, "tokens")
    if mine and theirs and tokens and len(mine) == len(theirs) == len(tokens) \
            and tokens == _per_example(plain, "tokens") and sum(tokens) > 0:
        return paired_perplexity_ratio(theirs, mine, tokens), f"paired bootstrap over {len(mine):,} test sequences"
    return None, "no interval: the records store no per-sequence losses"


def utility_loss(rec: dict[str, Any], plain: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row's utility against the undefended row `plain` of its scenario: accuracy (points lost: plain - row)
    or else perplexity (ratio row / plain), its 95% interval and how it was computed; `relative` compares losses
    of different metrics (the fraction of plain's accuracy lost, the fraction perplexity rose). None when the
    row has no utility metric."""
    metric = next((m for m in ("accuracy", "perplexity") if is_number(rec["metrics"].get(m))), None)
    if metric is None and diverged_round(rec) is None:
        return None
    base = plain["metrics"].get(metric) if plain is not None and metric else None
    out = {"metric": metric or "utility", "value": rec["metrics"].get(metric) if metric else None,
           "plain": base if is_number(base) else None, "diverged": diverged_round(rec), "paired": False,
           "reference": False}
    fmt = "{:.3f}" if metric == "accuracy" else "{:.4g}"
    out.update({f"{k}_text": fmt.format(out[k]) if is_number(out[k]) else "" for k in ("value", "plain")})
    if out["diverged"] is not None:   # the last finite model's number is no utility: none is shown
        return {**out, "value": None, "value_text": "", "loss": None, "interval": None, "relative": math.inf,
                "method": "", "text": diverged_text(rec)}
    if out["plain"] is not None and defense_label(rec) == defense_label(plain):
        return {**out, "loss": 0.0 if metric == "accuracy" else 1.0, "interval": None, "relative": 0.0,
                "method": "the undefended row", "reference": True, "text": f"{metric} {out['value_text']}"}
    if out["plain"] is None:
        return {**out, "loss": None, "interval": None, "relative": 0.0, "method": "no undefended row to compare",
                "text": f"{metric} {out['value_text']}"}
    gap, method = (_accuracy if metric == "accuracy" else _perplexity)(rec, plain)
    if metric == "accuracy":
        loss = base - out["value"]
        relative = loss / base if base else loss
        text = f"{loss:+.3f}" + (f" [{gap[1]:+.3f}, {gap[2]:+.3f}]" if gap else "")
    else:
        loss = out["value"] / base if base else math.inf
        relative = loss - 1
        text = f"×{loss:.3g}" + (f" [{gap[1]:.3g}, {gap[2]:.3g}]" if gap else "")
    return {**out, "loss": loss, "interval": gap[1:] if gap else None, "relative": relative, "method": method,
            "paired": method.startswith("paired"), "text": text}
