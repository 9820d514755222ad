"""The front page's reading rules on hand-built records: utility loss carries a paired interval where per-example
results allow one, and the across-suites table reads utility only where a scenario measures it."""
import math
import random

import pytest
from test_leaderboard import rec

from leaderboards.overview import overview
from leaderboards.utility_loss import (paired_accuracy_gap, paired_perplexity_ratio, unpaired_accuracy_gap,
                                       utility_loss)


def test_the_paired_interval_is_narrower_when_the_models_agree_and_wider_when_they_disagree():
    n = 1000
    plain = [1] * 800 + [0] * 200
    close = [0] * 20 + [1] * 780 + [0] * 200          # the same model, 20 of its right answers now wrong
    d, low, high = paired_accuracy_gap(plain, close)
    assert d == pytest.approx(0.02) and low > 0 and high < 0.035
    _, ulow, uhigh = unpaired_accuracy_gap(0.8, n, 0.78, n)
    assert ulow < 0 < uhigh and (high - low) < (uhigh - ulow) / 3
    half, other = [1] * 500 + [0] * 500, [0] * 500 + [1] * 500   # right on opposite halves: anti-correlated
    d, low, high = paired_accuracy_gap(half, other)
    _, ulow, uhigh = unpaired_accuracy_gap(0.5, n, 0.5, n)
    assert d == 0 and (high - low) > (uhigh - ulow) * 1.2
    assert paired_accuracy_gap(plain, close) == paired_accuracy_gap(plain, close)   # seeded: a page renders alike


def test_utility_loss_is_paired_from_per_example_results_and_labelled_unpaired_without():
    plain = rec("plain", "idlg", accuracy=0.8, test_samples=1000)
    mine = rec("mask", "idlg", accuracy=0.78, test_samples=1000)
    unpaired = utility_loss(mine, plain)
    assert unpaired["method"].startswith("unpaired") and not unpaired["paired"]
    plain["details"]["per_example"] = {"correct": [1] * 800 + [0] * 200}
    mine["details"]["per_example"] = {"correct": [0] * 20 + [1] * 780 + [0] * 200}
    paired = utility_loss(mine, plain)
    assert paired["paired"] and paired["loss"] == pytest.approx(0.02) and paired["text"].startswith("+0.020 [+0.0")
    assert paired["interval"][1] - paired["interval"][0] < unpaired["interval"][1] - unpaired["interval"][0]
    mine["details"]["per_example"]["correct"] = [1] * 1000                # disagrees with the stored accuracy
    assert "disagree with the stored accuracy" in utility_loss(mine, plain)["method"]


def test_the_perplexity_ratio_is_paired_over_test_sequences():
    rng = random.Random(0)
    tokens = [rng.randint(10, 30) for _ in range(200)]
    plain = [t * 4.0 + rng.gauss(0, 3) for t in tokens]
    other = [p + t * 0.05 + rng.gauss(0, 0.5) for p, t in zip(plain, tokens)]
    ratio, low, high = paired_perplexity_ratio(plain, other, tokens)
    assert ratio == pytest.approx(math.exp((sum(other) - sum(plain)) / sum(tokens)))
    assert low < ratio < high and low > 1.0                               # a consistent rise is resolved
    a = rec("plain", "mia-ref", perplexity=math.exp(sum(plain) / sum(tokens)))
    b = rec("mask", "mia-ref", perplexity=math.exp(sum(other) / sum(tokens)))
    a["details"]["per_example"] = {"nll": plain, "tokens": tokens}
    b["details"]["per_example"] = {"nll": other, "tokens": tokens}
    loss = utility_loss(b, a)
    assert loss["paired"] and loss["loss"] == pytest.approx(ratio) and loss["relative"] == pytest.approx(ratio - 1)


def test_across_suites_utility_only_where_measured_base_is_no_defense_and_uncalibrated_rows_keep_costs():
    info = {"undefended": ["plain"], "untrained": ["base"], "chance": {"at-chance": 0.5, "learns": 0.1}}
    chance = [rec("plain", "dager", scenario="at-chance", rouge1=1.0, accuracy=0.5, test_samples=16,
                  chance_accuracy=0.5),
              rec("secagg", "dager", scenario="at-chance", rouge1=1.0, accuracy=0.5, test_samples=16,
                  chance_accuracy=0.5),
              rec("noise", "dager", scenario="at-chance", rouge1=0.0, accuracy=0.688, test_samples=16,
                  chance_accuracy=0.5),
              rec("base", "mia-loss", scenario="at-chance", mia_auroc=0.5, accuracy=0.5)]
    uncal = [rec("plain", "ilrg", scenario="learns", label_acc=0.1, accuracy=0.9, test_samples=500),
             rec("dp-mask", "ilrg", scenario="learns", label_acc=0.0, accuracy=0.8, test_samples=500,
                 he_encrypt_s=0.7)]
    board = overview([{"name": "t", "records": chance + uncal, "infos": {"t": info}}])
    rows = {r["name"]: r for r in board["rows"]}
    assert "base" not in rows
    assert rows["secagg"]["utility"] is None                           # the scenario does not measure utility
    label = [c["family"] for c in board["columns"]].index("label")
    assert rows["dp-mask"]["cells"][label]["verdict"].text == "no verdict"   # ilrg fails on plain: no verdict ...
    assert rows["dp-mask"]["utility"]["drop"] == pytest.approx(0.1)      # ... but its utility and HE cost stand
    assert rows["dp-mask"]["he"]["seconds"] == 0.7
