"""The front page's reading rules on hand-built records: the stated row order respects dominance, a diverged row
reads "diverged at round r", utility loss carries a paired interval where per-example results allow one, the
summary splits round 0 from the trained model, the frontier marks its Pareto set, and the across-suites table
reads utility only where a scenario measures it."""
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_leaderboard import rec

from bench.protocol.records import config_id, seal
from leaderboards.frontier import frontier, ticks
from leaderboards.grid import grid
from leaderboards.ordering import better, dominates, rank
from leaderboards.overview import overview
from leaderboards.panels import layout
from leaderboards.pareto import Point, front
from leaderboards.summary import summarize
from bench.evaluation.utility_loss import (paired_accuracy_gap, paired_perplexity_ratio, unpaired_accuracy_gap,
                                       utility_loss)

INFO = {"undefended": ["plain"], "untrained": ["base"], "chance": {"s": 0.1, "early": 0.1, "late": 0.1}}
FAMILIES = ("image", "text", "label", "membership")


def at(r, **scenario):
    """The record attacked as the scenario config says (attack_round, rounds), its cell id rehashed, resealed."""
    r["config"]["scenario"].update(scenario)
    r["cell_id"] = config_id(r["config"])
    return seal(r)


CELLS = [(f, st) for f in FAMILIES for st in ("round 0", "trained")]


def _row(name, bands, loss, no_utility=False, judged=4, complete=True):
    """A row as the ranking rule reads it: its leaking cells with their bands (1 partly, 2 recovered)."""
    ci = None if loss is None else (loss - 0.02, loss + 0.02)
    return {"name": name, "leaks": frozenset(bands), "bands": dict(bands), "loss": loss, "ci": ci,
            "no_utility": no_utility, "judged": judged, "complete": complete, "coverage": [3 if complete else 2, 3]}


rows_strategy = st.lists(st.builds(_row, st.text("abcdefgh", min_size=1, max_size=3),
                                   st.dictionaries(st.sampled_from(CELLS), st.sampled_from((1, 2)), max_size=4),
                                   st.one_of(st.none(), st.sampled_from((0.0, 0.01, 0.05, 0.3))), st.booleans(),
                                   st.integers(0, 3), st.booleans()),
                         min_size=1, max_size=9, unique_by=lambda r: r["name"])


@settings(max_examples=300, deadline=None)
@given(rows_strategy)
def test_ranks_follow_the_stated_rule_and_an_incomplete_row_is_never_ranked(rows):
    out = rank([dict(r) for r in rows])
    assert sorted(r["name"] for r in out) == sorted(r["name"] for r in rows)
    ranked = [r for r in out if r["rank"] is not None]
    assert all(r["complete"] for r in ranked) and all(r["rank"] is None for r in out if not r["complete"])
    assert out[:len(ranked)] == ranked                                   # unranked rows come after every ranked one
    assert [r["rank"] for r in ranked] == sorted(r["rank"] for r in ranked)
    group = [(bool(r["no_utility"]), not r["judged"]) for r in ranked]
    assert group == sorted(group)                                        # useful rows first
    by = {r["name"]: r for r in ranked}
    for a in ranked:
        for b in ranked:
            same_group = (bool(a["no_utility"]), not a["judged"]) == (bool(b["no_utility"]), not b["judged"])
            if same_group and better(a, b):
                assert a["rank"] < b["rank"], (a, b)
            if same_group and a["bands"] == b["bands"] and a["loss"] == b["loss"]:
                assert a["rank"] == b["rank"], (a, b)                     # equal rows share a rank
            if dominates(a, b):
                assert by[a["name"]]["rank"] < by[b["name"]]["rank"] or not same_group


def test_two_verdicts_in_one_band_tie_and_utility_breaks_a_tie_only_beyond_its_interval():
    """The main job's case: plaintext at 82.6 dB and FedML-HE at 86.9 dB, both "image recovered", share a rank;
    so do two rows whose utility intervals overlap; a row whose loss lies beyond the others' intervals ranks below."""
    image0 = ("image", "round 0")
    rows = [_row("plaintext", {image0: 2}, 0.0), _row("fedml-he", {image0: 2}, 0.001),
            _row("dictpfl", {image0: 2}, 0.3), _row("mask", {image0: 1}, 0.3), _row("secagg", {}, 0.0)]
    ranks = {r["name"]: r["rank"] for r in rank(rows)}
    assert ranks == {"secagg": 1, "mask": 2, "fedml-he": 3, "plaintext": 3, "dictpfl": 5}
    assert [r["name"] for r in rank(rows)][2:4] == ["fedml-he", "plaintext"]   # equal ranks listed by name


def test_dominance_outranks_a_smaller_share_in_the_grid():
    """x leaks images only (3 of 5 cells), y images and labels (2 of 5): a share order would put y first."""
    image = ("idlg", "dlg", "inverting-gradients")
    records = [rec("plain", a, psnr=35.0, accuracy=0.9) for a in image]
    records += [rec("plain", a, label_acc=1.0, accuracy=0.9) for a in ("ilrg", "idlg-extended")]
    records += [rec("x", a, psnr=35.0, accuracy=0.9) for a in image]
    records += [rec("x", a, label_acc=0.0, accuracy=0.9) for a in ("ilrg", "idlg-extended")]
    records += [rec("y", "idlg", psnr=35.0, accuracy=0.9), rec("y", "dlg", psnr=5.0, accuracy=0.9),
                rec("y", "inverting-gradients", psnr=5.0, accuracy=0.9),
                rec("y", "ilrg", label_acc=1.0, accuracy=0.9), rec("y", "idlg-extended", label_acc=0.0, accuracy=0.9)]
    rows = {r["name"]: r for r in grid("core", records, INFO)["rows"]}
    assert rows["x"]["leaks"] == {("image", "round 0")} and rows["y"]["leaks"] == {("image", "round 0"),
                                                                                   ("label", "round 0")}
    assert [(r["name"], r["rank"]) for r in grid("core", records, INFO)["rows"]] == [("x", 1), ("plain", 2), ("y", 2)]


def test_a_diverged_row_shows_its_round_never_a_number(tmp_path):
    from leaderboards.render import render
    from leaderboards.site import build_site

    records = [rec("plain", "mia-loss", scenario="lm", suite="core", mia_auroc=0.8, perplexity=138.0),
               rec("base", "mia-loss", scenario="lm", suite="core", mia_auroc=0.5, perplexity=297.0),
               rec("noise", "mia-loss", "diverged", "training diverged at round 3: client-1's loss is not finite",
                   scenario="lm", suite="core", perplexity=392219674.95, diverged_round=3.0),
               rec("he", "mia-loss", scenario="lm", suite="core", mia_auroc=0.5, perplexity=140.0)]
    info = {**INFO, "chance": {}}
    core = grid("core", records, info)
    noise = next(r for r in core["rows"] if r["name"] == "noise")
    assert noise["cells"][0]["verdict"].text == "diverged at round 3"
    assert noise["utility"][0]["text"] == "diverged at round 3" and noise["utility"][0]["loss"] is None
    assert [r["name"] for r in core["rows"]][-1] == "noise"            # no utility: last
    board = overview([{"name": "core", "records": records, "infos": {"core": info}}])
    row = next(r for r in board["rows"] if r["name"] == "noise")
    assert row["utility"]["diverged"] == "diverged at round 3" and row["utility"]["value"] is None
    render(records, {"core": info}, tmp_path / "core")
    html = build_site(tmp_path, generated="2026-01-01").read_text()
    assert "diverged at round 3" in html and "392219" not in html and "3.92e+08" not in html




def test_the_summary_splits_round_0_from_the_trained_model_and_drops_a_column_that_judges_no_row():
    records = [at(rec("plain", "idlg", scenario="early", psnr=35.0, accuracy=0.9), attack_round=0, rounds=4),
               at(rec("mask", "idlg", scenario="early", psnr=34.0, accuracy=0.9), attack_round=0, rounds=4),
               at(rec("plain", "idlg", scenario="late", psnr=31.0, accuracy=0.9), attack_round=2, rounds=4),
               at(rec("mask", "idlg", scenario="late", psnr=9.0, accuracy=0.9), attack_round=2, rounds=4),
               at(rec("plain", "ilrg", scenario="mid", label_acc=0.1, accuracy=0.9), attack_round=1, rounds=4),
               at(rec("mask", "ilrg", scenario="mid", label_acc=0.0, accuracy=0.9), attack_round=1, rounds=4)]
    track = {"name": "t", "setting": "a test", "scenarios": ["early", "late", "mid"], "utility": "early",
             "privacy_only": False, "central": None, "notes": {}}
    summary = summarize("core", records, {**INFO, "tracks": [track]})
    (table,) = summary["tracks"]
    assert [(c["family"], c["stage"]) for c in table["view"]["columns"]] == [("image", "round 0"),
                                                                            ("image", "trained")]
    assert table["not_drawn"] == [{"family": "label", "stage": "round 0", "why": table["not_drawn"][0]["why"]}]
    assert "no verdict" in table["not_drawn"][0]["why"]           # iLRG fails on plaintext: no row is judged
    mask = next(r for r in table["rows"] if r["defense"] == "mask")
    assert mask["families"] == {"image": {"round0": "leaks", "trained": "resists"}}
    assert mask["view"]["cells"][0]["href"] == "core/index.html#t--early"   # each links to its record's table
    assert mask["coverage"] == [3, 3] and mask["rank"] == 1   # leaks at round 0 only; plaintext on both models
    assert next(r for r in table["rows"] if r["defense"] == "plain")["rank"] == 2


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


TOY = {  # name: (utility loss, its interval, PSNR, its interval); lower is better in both, None: blocked by design
    "a": (0.000, (-0.013, 0.014), 30.0, (29.0, 31.0)),
    "b": (0.0005, (-0.013, 0.014), 29.5, (29.0, 30.0)),   # inside a's intervals on both axes: a tie
    "c": (0.2, (0.18, 0.22), 35.0, (34.0, 36.0)),          # a beats it beyond both intervals
    "d": (0.3, (0.28, 0.32), 12.0, (11.0, 13.0)),          # leaks less than a beyond the intervals
    "e": (0.02, (0.0, 0.04), 31.0, (30.0, 32.0)),          # a's point beats it, a's intervals do not
    "f": (0.3, (0.29, 0.31), 40.0, (39.0, 41.0)),          # d beats it on leakage and ties it on loss
    "g": (0.5, (0.45, 0.55), None, None),                  # blocked: below every leak, but it costs the most
}


def test_the_frontier_pareto_set_with_intervals_on_a_toy_table():
    points = [Point(x, -math.inf if y is None else y, xc, yc) for x, xc, y, yc in TOY.values()]
    on = dict(zip(TOY, front(points)))
    assert {n for n, f in on.items() if f} == {"a", "b", "d", "e", "g"}
    plain = dict(zip(TOY, front([Point(x, -math.inf if y is None else y) for x, _, y, _ in TOY.values()])))
    assert not plain["e"]                     # without intervals a dominates e: the evidence does not
    drawn = [{"x": x, "x_ci": xc, "value": y, "value_ci": yc, "blocked": y is None, "he": None, "placed": True,
              "n": i} for i, (x, xc, y, yc) in enumerate(TOY.values(), 1)]
    panel = layout(drawn, True, "loss", "PSNR")
    assert [p["front"] for p in drawn] == list(on.values())   # the panel draws the same set, blocked point included
    assert panel["width"] >= 640 and panel["font"] >= 12 and panel["step"]
    assert ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0] and ticks(12.5, 13.4)[0] >= 12.5


def test_panel_labels_never_overlap_each_other_or_a_marker():
    """Twelve points, four on one spot and the rest crowded: every label box stays clear of every marker and label."""
    from leaderboards.panels import _box, _marker_box, _overlaps
    drawn = [{"x": 0.0 + 0.001 * (i % 3), "x_ci": None, "value": 30.0 + (i % 4) * 0.3, "value_ci": None,
              "blocked": i == 11, "he": float(i), "placed": True, "n": i + 1} for i in range(12)]
    drawn += [{"x": 0.0, "x_ci": None, "value": 30.0, "value_ci": None, "blocked": False, "he": None, "placed": True,
               "n": 13 + i} for i in range(3)]
    panel = layout(drawn, True, "loss", "PSNR")
    boxes = [_box(g["lx"], g["ly"], g["text"]) for g in panel["labels"]]
    assert sorted(n for g in panel["labels"] for n in g["points"]) == list(range(1, 16))
    for i, box in enumerate(boxes):
        assert not any(_overlaps(box, other) for other in boxes[i + 1:])
        assert not any(_overlaps(box, _marker_box(p)) for p in drawn)


def frontier_records(suite="frontier"):
    """A sweep: one noise defense at four settings beside the undefended row and an encrypted one, in an image
    scenario; one setting diverged."""
    out = []
    rows = [("plain", {}, 0.90, 35.0, 0.0), ("noise", {"sigma": 0.001}, 0.89, 25.0, 0.0),
            ("noise", {"sigma": 0.01}, 0.85, 28.0, 0.0), ("noise", {"sigma": 0.1}, 0.70, 12.0, 0.0),
            ("he", {}, 0.87, None, 2.5), ("noise", {"sigma": 1.0}, None, None, 0.0)]
    for name, params, acc, psnr, he in rows:
        metrics = {"accuracy": acc, "test_samples": 1000, "he_encrypt_s": he}
        if acc is None:
            r = rec(name, "idlg", "diverged", "training diverged at round 2: loss not finite", suite=suite,
                    scenario="images", accuracy=0.1, diverged_round=2.0)
        elif psnr is None:
            r = rec(name, "idlg", "blocked", "blocked by design: empty view", suite=suite, scenario="images", **metrics)
        else:
            r = rec(name, "idlg", suite=suite, scenario="images", psnr=psnr, **metrics)
        r["defense_params"] = r["config"]["defense"]["params"] = params
        out.append(at(r, rounds=10, attack_round=0))
    return out


def test_the_frontier_places_each_setting_and_marks_its_pareto_set():
    info = {"undefended": ["plain"], "untrained": [], "chance": {"images": 0.1}}
    panels = frontier("frontier", frontier_records(), info)["panels"]
    assert [(p["scenario"], p["family"], p["key"]) for p in panels] == [("images", "image", "psnr")]
    points = {p["name"]: p for p in panels[0]["points"]}
    front = {n for n, p in points.items() if p.get("front")}
    # with intervals: the lightest noise's loss is not told apart from plaintext's and it leaks less (25 dB against
    # 35), and the blocked row's loss is not told apart from the lightest noise's: only the blocked row is left
    assert front == {"he"}
    noise = points["noise(sigma=0.001)"]["loss"]["interval"]
    assert noise[0] < 0 < noise[1] and points["he"]["loss"]["interval"][0] < noise[1]
    assert points["he"]["blocked"] and points["he"]["cy"] > max(p["cy"] for p in points.values() if p.get("cy")
                                                                 and not p["blocked"])   # on the floor
    assert points["he"]["r"] > points["plain"]["r"]                   # HE time as marker size
    assert not points["noise(sigma=1.0)"]["placed"] and points["noise(sigma=1.0)"]["why"] == "diverged at round 2"
    assert points["noise(sigma=0.1)"]["href"] == "frontier/index.html#frontier--images"


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
    assert [(h["model"], h["seconds"]) for h in rows["dp-mask"]["he"]] == [("?", 0.7)]   # per model: none named


def test_a_grid_cell_says_why_it_failed_or_was_blocked_and_a_column_names_its_rounds():
    """Kills grid.py's mutants that pass the other tests (docs/mutation.md): a failed cell reads "failed" with its
    error, a blocked cell's tooltip is the reason without the "blocked by design: " prefix, a column names the
    round it attacked, and a membership value rests on its members and non-members."""
    records = [at(rec("plain", "idlg", scenario="s", psnr=35.0, accuracy=0.9), attack_round=1, rounds=4),
               at(rec("broken", "idlg", "failed", "RuntimeError: boom", scenario="s", accuracy=0.9),
                  attack_round=1, rounds=4),
               at(rec("he", "idlg", "blocked", "blocked by design: every entry is encrypted", scenario="s",
                      accuracy=0.9), attack_round=1, rounds=4),
               rec("plain", "mia-loss", scenario="m", mia_auroc=0.8, accuracy=0.9),
               rec("he", "mia-loss", scenario="m", mia_auroc=0.6, accuracy=0.9)]
    for r in records[3:]:
        r["details"].update(n_members=100, n_nonmembers=200)
    core = grid("core", records, INFO)
    col = next(i for i, c in enumerate(core["columns"]) if c["attack"] == "idlg")
    assert core["columns"][col]["rounds"] == "round 1 of 4"
    cells = {r["name"]: r["cells"] for r in core["rows"]}
    broken, he = cells["broken"][col], cells["he"][col]
    assert (broken["kind"], broken["verdict"].text, broken["verdict"].why) == ("failed", "failed", "RuntimeError: boom")
    assert (he["kind"], he["verdict"].why) == ("blocked", "every entry is encrypted")
    mia = next(i for i, c in enumerate(core["columns"]) if c["attack"] == "mia-loss")
    assert cells["he"][mia]["support"] == "100 members, 200 non-members"
