"""How far a recomputed cell may move from its stored record and still reproduce it: the table and the reason for
each entry are in bench/run/verify.py's docstring; here is the arithmetic.

Every check returns `Difference`s (what moved, stored, recomputed, the tolerance it broke); none means the
recomputation reproduces the record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bench.evaluation.calibration import record_verdict
from bench.evaluation.formats import is_number
from bench.evaluation.schema import schema_of
from bench.evaluation.usefulness import no_utility
from bench.evaluation.verdicts import BANDS, band

SAMPLES = 5          # test samples an accuracy may move by
PSNR_DB = 0.5        # dB
SIMILARITY = 0.01    # SSIM and LPIPS, on their [0, 1] scale
RELATIVE = 1e-3      # every other real number
RANDOM_LEAKAGE = 0.25   # relative, in a randomized run: an estimate of leakage (kind privacy) without a rule of its own
RANDOM_RELATIVE = 5e-3  # relative, in a randomized run: any other real number without one
CIPHER_BYTES = 1e-3  # relative, a byte count of a run that sent ciphertexts (SEAL compresses CKKS ones)
ABSOLUTE = 1e-6      # near zero

ACCURACIES = ("accuracy", "accuracy_personal", "accuracy_own_labels")
PER_ITEM = ("label_acc", "irec", "exact_match", "images_recovered")   # fractions of the attacked batch's items
PER_CLASS = ("lnacc", "leacc")                                        # accuracies over the C classes
EXACT = ("test_samples", "chance_accuracy", "label_f1", "client_class_f1")
STRUCTURE = ("family", "threat_model", "undefended")   # details that place a cell on a page (column, calibration)


@dataclass(frozen=True)
class Difference:
    what: str           # a metric, "status", "reason", "band of psnr", "rank", ...
    stored: Any
    recomputed: Any
    tolerance: str = "exact"

    def __str__(self) -> str:
        return f"{self.what} stored {self.stored!r}, recomputed {self.recomputed!r} ({self.tolerance})"


@dataclass(frozen=True)
class Rule:
    """One metric's tolerance: absolute (in its unit) or relative; neither: exact."""

    absolute: float | None = None
    relative: float | None = None
    text: str = "exact"

    def agree(self, a: Any, b: Any) -> bool:
        """Two values at this tolerance; None, text and a missing value compare exactly, NaN equals NaN."""
        numbers = is_number(a) and is_number(b)
        if not numbers or (self.absolute is None and self.relative is None):
            return a == b or numbers and math.isnan(a) and math.isnan(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if self.relative is not None:
            return math.isclose(a, b, rel_tol=self.relative, abs_tol=ABSOLUTE)
        return abs(a - b) <= self.absolute + ABSOLUTE * max(1.0, abs(a))   # float slack on the bound itself


@dataclass(frozen=True)
class Tolerance:
    """The table, with the overrides of the command line: `relative` for every real number without an entry of
    its own, `per_metric` an absolute tolerance in the metric's unit in place of its entry."""

    relative: float = RELATIVE
    per_metric: dict[str, float] = field(default_factory=dict)
    randomized: str = ""   # what two recomputations of the row differ in, where they do (`randomized`)

    def of_randomized_run(self, spread: str) -> "Tolerance":
        """The same table for a row whose recomputations differ from each other by `spread`."""
        return Tolerance(self.relative, self.per_metric, spread)

    @classmethod
    def parse(cls, texts: list[str]) -> "Tolerance":
        """--tolerance REL (the real numbers without an entry) or METRIC=ABS (one metric, in its unit),
        repeatable; ValueError names a bad one."""
        relative, per = RELATIVE, {}
        for text in texts:
            name, _, value = text.rpartition("=")
            try:
                number = float(value)
            except ValueError:
                number = -1.0
            if not number >= 0 or not math.isfinite(number):
                raise ValueError(f"--tolerance {text!r}: expected a relative tolerance >= 0 (e.g. 1e-3) or "
                                 "METRIC=ABS, an absolute one in the metric's unit (e.g. psnr=0.5)")
            if name:
                per[name] = number
            else:
                relative = number
        return cls(relative, per)

    def of(self, name: str, rec: dict[str, Any]) -> Rule:
        """The tolerance of metric `name` in the stored record `rec` (timing metrics are left out before)."""
        if name in self.per_metric:
            return Rule(self.per_metric[name], text=f"±{self.per_metric[name]:g} (--tolerance)")
        entry = _entry(name, rec)
        if entry.get("unit") == "B" and _sent_ciphertexts(rec):
            return Rule(relative=CIPHER_BYTES, text=f"relative {CIPHER_BYTES:g} (SEAL compresses each randomized "
                                                    "ciphertext: its length moves with every encryption)")
        if name in EXACT or entry.get("unit") == "B" or str(entry.get("fmt", "")).endswith(".0f}"):
            return Rule()
        metrics, details = rec["metrics"], rec["details"]
        if name in ACCURACIES:
            n = metrics.get("test_samples")
            if is_number(n) and n > 0:
                return self._rate(Rule(SAMPLES / n, text=f"±{SAMPLES} of {n:.0f} test samples"), metrics.get(name), n)
            return Rule(SAMPLES / 500, text=f"±{SAMPLES / 500:g} (the record does not say its test samples)")
        if name == "psnr":
            return Rule(PSNR_DB, text=f"±{PSNR_DB:g} dB")
        if name in ("ssim", "lpips"):
            return Rule(SIMILARITY, text=f"±{SIMILARITY:g}")
        items, uploads = _batch(rec), _uploads(name, rec)
        if name in PER_ITEM:
            return self._rate(Rule(1 / (items * uploads), text=f"±1 item of {items} in one of {uploads} attacked "
                                                               "upload(s)"), metrics.get(name), items * uploads)
        if name in PER_CLASS:
            chance = metrics.get("chance_accuracy")
            if is_number(chance) and chance > 0:
                classes = round(1 / chance)
                return Rule(2 / (classes * uploads),
                            text=f"±1 label (2 of {classes} class counts) in one of {uploads} upload(s)")
            return Rule(text="exact (the record does not say its classes)")
        m, n = details.get("n_members"), details.get("n_nonmembers")
        if name.startswith("mia_") and is_number(m) and is_number(n) and m > 0 and n > 0:
            if name == "mia_auroc":
                return Rule((m + n) / (m * n), text=f"±{m + n:.0f} of {m * n:.0f} member/non-member pairs swapped")
            if name.startswith("mia_tpr_at_"):
                return self._rate(Rule(1 / m, text=f"±1 of {m:.0f} members"), metrics.get(name), m)
            if name.startswith("mia_fpr_at_"):
                return self._rate(Rule(1 / n, text=f"±1 of {n:.0f} non-members"), metrics.get(name), n)
            if name == "mia_balanced_acc":
                return self._rate(Rule((1 / m + 1 / n) / 2, text=f"±1 member and 1 non-member of {m:.0f} and {n:.0f}"),
                                  metrics.get(name), m + n)
        value, relative = metrics.get(name), max(self.relative, RANDOM_RELATIVE) if self.randomized else self.relative
        run = " in a randomized run" if self.randomized else ""
        if name.startswith("perplexity") and is_number(value) and value > 1:
            within = math.expm1(relative * math.log(value))
            return Rule(relative=within, text=f"relative {within:.2g} (the loss it exponentiates at relative "
                                              f"{relative:g}{run})")
        if self.randomized and entry.get("kind") == "privacy":
            return Rule(relative=RANDOM_LEAKAGE, text=f"relative {RANDOM_LEAKAGE:g} (an estimate of leakage{run}: its "
                                                      "update moves with fresh randomness)")
        return Rule(relative=relative, text=f"relative {relative:g}{run}")

    def _rate(self, rule: Rule, p: Any, count: float) -> Rule:
        """A rate over `count` samples: in a randomized run, within two binomial standard errors of the stored value
        where that is wider (another model scores every sample: more than one crosses a threshold)."""
        if not self.randomized or not is_number(p) or not 0 <= p <= 1:
            return rule
        within = 2 * math.sqrt(max(p * (1 - p), 1 / count) / count)
        if within <= (rule.absolute or 0):
            return rule
        return Rule(within, text=f"±{within * count:.1f} of {count:.0f} (two binomial standard errors: a randomized "
                                 "run)")


def _entry(name: str, rec: dict[str, Any]) -> dict[str, Any]:
    return (rec["details"].get("metric_schema") or {}).get(name) or {}


def _sent_ciphertexts(rec: dict[str, Any]) -> bool:
    """Whether the run's uploads carried ciphertexts, whose serialized length is not a fact of the protocol."""
    nbytes = rec["metrics"].get("ciphertext_bytes")
    return is_number(nbytes) and nbytes > 0


def _batch(rec: dict[str, Any]) -> int:
    scenario = (rec.get("config") or {}).get("scenario") or {}
    size = scenario.get("attack_batch_size") or scenario.get("batch_size")
    return int(size) if is_number(size) and size >= 1 else 1


def _uploads(name: str, rec: dict[str, Any]) -> int:
    values = (rec["details"].get("per_target") or {}).get(name)
    if isinstance(values, list) and values:
        return len(values)
    repeats = ((rec.get("config") or {}).get("scenario") or {}).get("attack_repeats")
    return int(repeats) if is_number(repeats) and repeats >= 1 else 1


def timing(name: str, stored: dict[str, Any], fresh: dict[str, Any]) -> bool:
    """Whether the metric is a time (never compared), by the running code's schema or else the record's."""
    return bool((_entry(name, fresh) or _entry(name, stored)).get("timing"))


def differences(stored: dict[str, Any], fresh: dict[str, Any], tol: Tolerance) -> list[Difference]:
    """Where the recomputed record `fresh` does not reproduce `stored`: its status and reason, the details that place
    it on a page, every metric but times at its tolerance, every stored 95% interval's bounds at its metric's, the
    verdict band of every banded metric and of the record, and its row's utility flag."""
    if stored["status"] != fresh["status"]:
        return [Difference("status", stored["status"], f"{fresh['status']} ({fresh['reason']})" if fresh["reason"]
                           else fresh["status"])]
    out = []
    if stored["status"] in ("blocked", "diverged") and stored["reason"] != fresh["reason"]:
        out.append(Difference("reason", stored["reason"], fresh["reason"]))
    for key in STRUCTURE:
        if stored["details"].get(key) != fresh["details"].get(key):
            out.append(Difference(key, stored["details"].get(key), fresh["details"].get(key)))
    for name in sorted(set(stored["metrics"]) | set(fresh["metrics"])):
        if timing(name, stored, fresh):
            continue
        rule = tol.of(name, stored)
        a, b = stored["metrics"].get(name), fresh["metrics"].get(name)
        if not rule.agree(a, b):
            out.append(Difference(name, a, b, rule.text))
        mine, theirs = stored["details"].get(f"{name}_ci95"), fresh["details"].get(f"{name}_ci95")
        if (mine or theirs) and not (_pair(mine) and _pair(theirs) and all(map(rule.agree, mine, theirs))):
            out.append(Difference(f"95% interval of {name}", mine, theirs, rule.text))
    return out + verdicts(stored, fresh)


def randomized(runs: list[list[dict[str, Any]]], tol: Tolerance) -> str:
    """What two recomputations of a row (its scored cells' fresh records, in one order) differ in at `tol` ("" for
    one run, or two that agree): a row computed twice with the same code, threads and numerical path differs only
    by randomness no seed fixes (a CKKS encryption draws fresh noise that its decryption carries into the model)."""
    if len(runs) < 2:
        return ""
    moved = [d for first, second in zip(*runs[:2]) for d in differences(first, second, tol)]
    return "; ".join(dict.fromkeys(f"{d.what} {d.stored!r} and {d.recomputed!r}" for d in moved))


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value)


def verdicts(stored: dict[str, Any], fresh: dict[str, Any]) -> list[Difference]:
    """What the page reads from the record: each banded metric's verdict band, the record's verdict and its row's
    utility flag, all unchanged (a value within its tolerance but across a cut point does not reproduce)."""
    if stored["status"] != "ok":
        return []
    try:
        schema = schema_of([stored, fresh])
    except ValueError as err:   # a metric no installed code defines, read another way than the record says
        return [Difference("metric schema", "as stored", str(err), "the same reading")]
    out = []
    for name in sorted(k for k in set(stored["metrics"]) | set(fresh["metrics"]) if k in BANDS and k in schema):
        levels = [getattr(band(name, r["metrics"].get(name), schema[name].lower_is_better, r["details"],
                                    r["metrics"]), "level", "")
                  for r in (stored, fresh)]
        if levels[0] != levels[1]:
            out.append(Difference(f"band of {name}", levels[0] or "no opinion", levels[1] or "no opinion",
                                  "same verdict band"))
    mine, theirs = record_verdict(stored, schema), record_verdict(fresh, schema)
    if mine.level != theirs.level:
        out.append(Difference("verdict", mine.text, theirs.text, "same verdict"))
    flags = [bool(no_utility(r, None, None)) for r in (stored, fresh)]
    if flags[0] != flags[1]:
        out.append(Difference("utility flag", "no utility" if flags[0] else "useful",
                              "no utility" if flags[1] else "useful", "same utility flag"))
    return out


__all__ = ["Difference", "Rule", "Tolerance", "differences", "randomized", "timing", "verdicts"]
