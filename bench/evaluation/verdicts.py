"""Absolute verdict bands: what a worst-case number means on its own, so a rank (which is relative to the
other rows of one table) never reads as safety by itself.

A band is keyed by the metric's name and read in the direction the record's schema snapshot gives
(lower_is_better): "leak" at or beyond the first cut point, "partial" at or beyond the second,
"resisted" otherwise. A row's verdict is its most severe band over the worst-case metrics that have
one; a metric without a band gives no opinion. The cut points are this benchmark's conventions; the
works cited fix the scale they sit on and the caveats.

Images (PSNR in dB on [0, 1] images, SSIM, LPIPS):
- recovered at PSNR >= 30 dB, SSIM >= 0.9 or LPIPS <= 0.1: the fidelity of a lossily coded copy.
  SSIM is 1 for identical images (Wang, Bovik, Sheikh, Simoncelli, "Image quality assessment: from
  error visibility to structural similarity", IEEE TIP 2004); 30 dB is the low end of the fidelity
  at which lossy image and video coding is judged acceptable (Huynh-Thu & Ghanbari, "Scope of
  validity of PSNR in image/video quality assessment", Electronics Letters 2008, discuss that range);
  LPIPS (Zhang et al., "The Unreasonable Effectiveness of Deep Features as a Perceptual Metric",
  CVPR 2018) below 0.1 is a near-duplicate.
- partly recovered at PSNR >= 18 dB, SSIM >= 0.5 or LPIPS <= 0.3: reconstructions that Geiping et al.
  ("Inverting Gradients", NeurIPS 2020, Fig. 1) call a privacy break are far below coding fidelity,
  and Sun et al. ("Privacy Assessment on Reconstructed Images: Are Existing Evaluation Metrics Faithful
  to Human Perception?", NeurIPS 2023) find PSNR and SSIM only weakly tied to whether a person
  recognises the image, so the middle band says "look at the thumbnails", never "safe".
- recovered also needs a rate: where the record counts the share of its draws (batches, seeds) recovered whole
  (`batch_recovered`: every image of the batch at 30 dB or more), that share must reach 90 %. An attack that
  returns 7 batches of 10 exactly averages far above 30 dB yet breaks the setting only on some draws: partly.
Text (recovered sentences matched to the batch's as the metrics match them):
- recovered at exact match >= 0.5 or ROUGE-1 >= 0.9; partly recovered when any sentence is exact
  (exact match > 0) or ROUGE-1 >= 0.5. DAGER (Petrov et al., NeurIPS 2024) and LAMP (Balunovic et al.,
  NeurIPS 2022) report ROUGE-1/2 F-measures; unrelated sentences of one corpus share function words, so
  ROUGE-1 of a failed attack is not 0 (0.06-0.36 on this benchmark's failed DAGER cells).
  A token set without its order (DAGER's first stage) is at most partly recovered: token F1 >= 0.5; it reveals
  which words a client typed, not what it wrote.
Membership:
- exposed at TPR >= 10% at 1% FPR (ten times chance) or AUROC >= 0.75; a signal at TPR >= 5% at 1% FPR
  or AUROC >= 0.6; near chance otherwise. Carlini et al. ("Membership Inference Attacks From First
  Principles", IEEE S&P 2022) argue for TPR at low FPR over AUROC; Duan et al. ("Do Membership
  Inference Attacks Work on Large Language Models?", COLM 2024) call AUROC 0.5-0.6 near random. An AUROC
  whose stored 95% bootstrap interval contains 0.5 is near chance whatever its point value; AUROC below
  0.5 is read as 1 - AUROC (an attacker flips the score). TPR at 1% FPR gives no opinion below 100
  non-members: there it is TPR at 0% FPR, a count of a handful of samples.
Labels:
- recovered at LnAcc >= 0.999 (every per-class count right: Ma et al., iLRG, ICLR 2023, report > 96%
  LnAcc on untrained models) or label acc. >= 0.9; partly at label acc. >= 0.3. LnAcc below 1 gives no
  opinion: it counts true negatives over all classes, so a random guess scores 0.8 on 10 classes.
  Label acc. (recovered multiset overlap) has no such floor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.evaluation.formats import is_number

LEVELS = ("blocked", "resisted", "partial", "leak")   # least to most severe; the page sorts on this order


@dataclass(frozen=True)
class Band:
    leak: float
    partial: float | None       # None: below `leak` the metric gives no opinion
    words: tuple[str, str, str]  # leak, partial, resisted
    fold: float | None = None   # a value on the wrong side of `fold` is read mirrored (AUROC < 0.5)
    chance: float | None = None  # a stored interval containing this value reads as resisted
    support: tuple[str, int] | None = None   # (details count, minimum): fewer gives no opinion
    rate: str | None = None     # the metric with the share of draws recovered whole: under RATE, "leak" reads partial


RATE = 0.9   # the share of draws an attack must break whole for "recovered" (a setting, not a lucky draw)


IMAGE = ("image recovered", "image partly recovered", "image not recovered")
TEXT = ("text recovered", "text partly recovered", "text not recovered")
MEMBERSHIP = ("membership exposed", "membership signal", "membership near chance")
LABELS = ("labels recovered", "labels partly recovered", "labels not recovered")

BANDS: dict[str, Band] = {
    "psnr": Band(30.0, 18.0, IMAGE, rate="batch_recovered"),
    "ssim": Band(0.9, 0.5, IMAGE, rate="batch_recovered"),
    "lpips": Band(0.1, 0.3, IMAGE, rate="batch_recovered"),
    "exact_match": Band(0.5, 1e-9, TEXT),
    "rouge1": Band(0.9, 0.5, TEXT),
    "token_f1": Band(math.inf, 0.5, TEXT),   # no order: never "recovered"
    "mia_auroc": Band(0.75, 0.6, MEMBERSHIP, fold=0.5, chance=0.5),
    "mia_tpr_at_1fpr": Band(0.1, 0.05, MEMBERSHIP, support=("n_nonmembers", 100)),
    "lnacc": Band(0.999, None, LABELS),
    "label_acc": Band(0.9, 0.3, LABELS),
}


@dataclass(frozen=True)
class Verdict:
    level: str        # one of LEVELS, or "" for no opinion
    text: str
    why: str = ""     # the metric and value that decided it

    @property
    def rank(self) -> int | str:
        return LEVELS.index(self.level) if self.level in LEVELS else ""


NONE = Verdict("", "no band", "no metric with a verdict band was measured")


def band(metric: str, value: Any, lower_is_better: bool | None, details: dict[str, Any] | None = None,
         metrics: dict[str, Any] | None = None) -> Verdict | None:
    """The band of one worst-case value, or None when the metric has no band or no opinion there. `details`
    are the record's: its stored interval (`<metric>_ci95`) and the counts a band needs; `metrics` the record's
    other values (the share of draws recovered whole that "leak" needs)."""
    spec = BANDS.get(metric)
    if spec is None or not is_number(value) or lower_is_better is None:
        return None
    details = details or {}
    bounds = details.get(f"{metric}_ci95")
    if spec.support is not None and is_number(details.get(spec.support[0])) \
            and details[spec.support[0]] < spec.support[1]:
        return None
    v = float(value)
    if spec.fold is not None and v < spec.fold:
        v = 2 * spec.fold - v
    if spec.chance is not None and isinstance(bounds, (list, tuple)) and len(bounds) == 2 \
            and all(is_number(b) for b in bounds) and bounds[0] <= spec.chance <= bounds[1]:
        return Verdict("resisted", spec.words[2], f"{metric} {value:.3f}: its 95% interval contains {spec.chance}")

    def beyond(cut: float) -> bool:   # toward the attacker: up when lower is better for the client
        return v >= cut if lower_is_better else v <= cut

    rate = (metrics or {}).get(spec.rate) if spec.rate else None
    if beyond(spec.leak) and is_number(rate) and float(rate) < RATE:
        return Verdict("partial", spec.words[1], f"{metric} {value:.3g}, but {spec.rate} {float(rate):.2g} of the "
                                                 f"draws (under {RATE:.0%})")
    if beyond(spec.leak):
        return Verdict("leak", spec.words[0], f"{metric} {value:.3g}")
    if spec.partial is None:
        return None
    if beyond(spec.partial):
        return Verdict("partial", spec.words[1], f"{metric} {value:.3g}")
    return Verdict("resisted", spec.words[2], f"{metric} {value:.3g}")


def worst(verdicts: list[Verdict | None]) -> Verdict:
    """The most severe of several verdicts; at one level, every distinct wording (image and labels recovered)."""
    seen = [v for v in verdicts if v is not None and v.level in LEVELS]
    if not seen:
        return NONE
    top = max(LEVELS.index(v.level) for v in seen)
    same = [v for v in seen if LEVELS.index(v.level) == top]
    whys = list(dict.fromkeys(v.why for v in same if v.why))
    more = f" (and {len(whys) - 3} more)" if len(whys) > 3 else ""
    return Verdict(LEVELS[top], " · ".join(dict.fromkeys(v.text for v in same)), "; ".join(whys[:3]) + more)


BLOCKED = Verdict("blocked", "blocked by design", "every attack that reports these metrics was blocked")
