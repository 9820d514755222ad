"""Utility beside privacy: a defense whose model learned nothing protects nothing worth having.

A row is flagged "no utility" when its training diverged, when its test accuracy cannot be told from a uniform
guess (the 95% Wilson interval of the accuracy over the test samples contains 1 / classes, or the accuracy is at
or below it), or when its perplexity is no better than the untrained model's in the same scenario. Such a row
never ranks above a useful one and is never called the best of anything. Chance accuracy and the test-set size
come from the record (`chance_accuracy`, `test_samples`) or, for records computed before they were stored, from
the page info (`chance`); without the test-set size the accuracy is compared with chance + 0.05.

A scenario whose undefended row (as its records say, bench/evaluation/calibration.py) itself has no utility (one
FedSGD step on a text model, scored on a few test sentences) does not measure utility: nothing there is flagged,
since it would flag every row alike; nor does a scenario its suite declares privacy and cost only (`privacy_only`
in its [[scenarios]] table: a model sized for a cost, not to learn the task), whose page shows no utility.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from bench.evaluation.formats import is_number
from bench.evaluation.schema import undefended

Z95 = 1.96
MARGIN = 0.05   # without a test-set size: an accuracy within this of chance reads as chance


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion p over n trials."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def no_utility(rec: dict[str, Any], chance: float | None, untrained: float | None) -> str:
    """Why this record's model has no utility, or ''."""
    m = rec["metrics"]
    if rec["status"] == "diverged" or is_number(m.get("diverged_round")):
        return "training diverged"
    acc, chance = m.get("accuracy"), m.get("chance_accuracy", chance)
    if is_number(acc) and is_number(chance):
        n = m.get("test_samples")
        if is_number(n) and n > 0:
            low, high = wilson(float(acc), int(n))
            if low <= chance <= high or acc <= chance:
                return (f"accuracy {acc:.3f} [{low:.3f}, {high:.3f}] over {int(n)} test samples contains chance "
                        f"({chance:.3f})")
        elif acc <= chance + MARGIN:
            return f"accuracy {acc:.3f} within {MARGIN} of chance ({chance:.3f})"
    ppl = m.get("perplexity")
    if is_number(ppl) and is_number(untrained) and ppl >= untrained:
        return f"perplexity {ppl:.4g} no better than the untrained model's {untrained:.4g}"
    return ""


def yardsticks(records, info, scenario) -> tuple[float | None, float | None]:
    """(chance accuracy, the untrained model's perplexity) of one scenario."""
    untrained_names = set(info.get("untrained") or ())
    base = [r["metrics"]["perplexity"] for r in records
            if r["defense"] in untrained_names and is_number(r["metrics"].get("perplexity"))]
    return (info.get("chance") or {}).get(scenario), (min(base) if base else None)


def measures_utility(records: list[dict[str, Any]], info: dict[str, Any], scenario: str,
                     label: Callable[[dict[str, Any]], str]) -> bool:
    """False when the suite declares the scenario privacy and cost only (`privacy_only`), or when its undefended row
    itself has no utility: then it tells no row's utility apart."""
    if scenario in (info.get("privacy_only") or {}):
        return False
    chance, untrained = yardsticks(records, info, scenario)
    plain = [r for r in records if undefended(r) and r["status"] != "diverged"]
    return not (plain and all(no_utility(r, chance, untrained) for r in plain))


def useless(records: list[dict[str, Any]], info: dict[str, Any], scenario: str,
            label: Callable[[dict[str, Any]], str]) -> dict[str, str]:
    """Per defense label of one scenario's records: why it has no utility (labels with utility are left out)."""
    untrained_names = set(info.get("untrained") or ())
    chance, untrained = yardsticks(records, info, scenario)
    if not measures_utility(records, info, scenario, label):
        return {}   # the scenario does not measure utility: its undefended model is no better than chance
    out: dict[str, str] = {}
    for rec in records:
        if rec["defense"] in untrained_names:
            continue   # the untrained model is the yardstick, not a defense
        why = no_utility(rec, chance, untrained)
        if why:
            out.setdefault(label(rec), why)
    return out
