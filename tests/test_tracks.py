"""Tracks: declared in a suite, checked at load in one line, applicability as a declared rule shown n/a, and the
front page's per-track summary: utility read only from the row's own track, incomplete rows never ranked, and the
page and summary.json saying the same thing."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from test_front_page import at
from test_leaderboard import rec

from bench.cli import main
from bench.federation.scenario import SpecError
from bench.run.spec import parse_suite
from leaderboards.summary import as_json, summarize

SCENARIO = {"dataset": "digits", "model": "mlp", "rounds": 1, "num_clients": 2, "clients_per_round": 2}


def suite(tracks, defenses=("plaintext", "fedhe-full")):
    return {"name": "tracked", "scenarios": [{**SCENARIO, "name": n} for n in ("a", "b", "c")],
            "defenses": [{"name": d} for d in defenses], "attacks": [{"name": "ilrg"}], "tracks": tracks}


GOOD = [{"name": "first", "setting": "two clients on digits", "scenarios": ["a", "b"], "utility": "a",
         "central": {"value": [0.9, 0.95], "source": "trained centrally, a test's words"},
         "notes": {"fedhe-full": "one line about it"}},
        {"name": "classic", "setting": "round 0 only", "scenarios": ["c"], "privacy_only": True}]


def test_tracks_load_with_the_suite_and_reach_the_page_info():
    loaded = parse_suite(suite(GOOD))
    assert [t["name"] for t in loaded.tracks] == ["first", "classic"]
    first, classic = loaded.page_info()["tracks"]
    assert first["utility"] == "a" and first["central"] == {"value": [0.9, 0.95], "source": GOOD[0]["central"]["source"]}
    assert classic == {"name": "classic", "setting": "round 0 only", "scenarios": ["c"], "utility": None,
                       "privacy_only": True, "central": None, "notes": {}}
    assert parse_suite(suite([GOOD[1]])).tracks[0]["scenarios"] == ["c"]   # a scenario in no track is allowed


def _with(i, **change):
    tracks = json.loads(json.dumps(GOOD))
    tracks[i].update(change)
    return [{k: v for k, v in t.items() if v is not None} for t in tracks]


@pytest.mark.parametrize("tracks, words", [
    (_with(0, scenarios=["a", "bb"]), "'scenarios' names 'bb', which is no scenario of the suite; did you mean 'b'?"),
    (_with(1, scenarios=["b", "c"]), "scenario 'b' is already in track 'first'"),
    (_with(0, utility="c"), "its utility scenario 'c' is not among its scenarios"),
    (_with(0, utility=None), "needs 'utility'"),
    (_with(1, utility="c"), "a privacy-only track measures no utility; drop 'utility'"),
    (_with(0, settting="x"), "unknown key 'settting'; did you mean 'setting'?"),
    (_with(0, setting="two\nlines"), "'setting' must be one line"),
    (_with(0, central={"value": [0.95, 0.9], "source": "s"}), "low <= high"),
    (_with(0, central={"value": 0.9}), "'central' must be a table"),
    (_with(0, notes={"fedhe-ful": "x"}), "notes name 'fedhe-ful', which is no defense of the suite; did you mean"),
    (_with(1, name="first"), "two tracks are named 'first'"),
    (_with(0, privacy_only="yes"), "'privacy_only' must be true or false"),
])
def test_a_bad_track_is_refused_at_load_in_one_line(tracks, words):
    with pytest.raises(SpecError) as err:
        parse_suite(suite(tracks))
    assert words in str(err.value) and "\n" not in str(err.value) and "tracks[" in str(err.value)


def test_a_bad_track_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "bad.toml").write_text('name = "bad"\n[[scenarios]]\nname = "a"\ndataset = "digits"\nmodel = "mlp"\n'
                                       '[[defenses]]\nname = "plaintext"\n[[attacks]]\nname = "ilrg"\n'
                                       '[[tracks]]\nname = "t"\nsetting = "s"\nscenarios = ["a", "z"]\nutility = "a"\n')
    assert main(["run", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'scenarios' names 'z'" in err and "\n" not in err and not (tmp_path / "out").exists()


def test_user_level_dp_is_na_below_its_declared_cohort_and_applies_above_it():
    from bench.run.preflight import preflight

    scenarios = [{**SCENARIO, "name": "few"}, {**SCENARIO, "name": "many", "num_clients": 6, "clients_per_round": 6,
                                                "max_train": 120}]
    ruled = {"name": "dp-fedavg", "params": {"noise_multiplier": 1.0, "min_cohort": 5}}
    checked = preflight(parse_suite({"name": "dp", "scenarios": scenarios, "attacks": [{"name": "ilrg"}],
                                     "defenses": [{"name": "plaintext"}, ruled]}), None)
    na = checked.page_info()["not_applicable"]
    assert list(na) == ["few"]
    (reason,) = na["few"].values()
    assert "cohort of at least 5 clients a round" in reason and "McMahan et al. 2018" in reason and "samples 2" in reason
    assert {(c.scenario.name, c.defense.name) for c in checked.cells} == {
        ("few", "plaintext"), ("many", "plaintext"), ("many", "dp-fedavg")}
    plain = preflight(parse_suite({"name": "dp", "scenarios": scenarios[:1], "attacks": [{"name": "ilrg"}],
                                   "defenses": [{"name": "dp-fedavg", "params": {"noise_multiplier": 1.0}}]}), None)
    assert not plain.not_applicable   # without min_cohort (every suite but core) the rule is off
    with pytest.raises(SpecError, match="min_cohort must be a whole number"):
        parse_suite({"name": "dp", "scenarios": scenarios[:1], "attacks": [{"name": "ilrg"}],
                     "defenses": [{"name": "dp-fedavg", "params": {"noise_multiplier": 1.0, "min_cohort": 0}}]})

    narrowed = preflight(parse_suite({"name": "dp", "scenarios": scenarios, "attacks": [{"name": "ilrg"}],
                                      "defenses": [{"name": "plaintext"}, ruled]}), None, only="many/*")
    assert list(narrowed.page_info()["not_applicable"]) == ["few"] and not narrowed.unchecked   # judged, not run
    assert {c.scenario.name for c in narrowed.cells} == {"few", "many"}

# Two tracks on hand-built records. Defense "x" trains in both utility scenarios, to different accuracies; "y" has
# no record in track two's utility scenario, and "z" lacks one cell of track one.
INFO = {"untrained": [], "chance": {"u1": 0.1, "p1": 0.1, "u2": 0.1},
        "not_applicable": {"u2": {"lora": "no LoRA adapters"}, "u1": {"lora": "no LoRA adapters"},
                           "p1": {"lora": "no LoRA adapters"}},
        "tracks": [{"name": "one", "setting": "s", "scenarios": ["u1", "p1"], "utility": "u1", "privacy_only": False,
                    "central": {"value": 0.95, "source": "a test"}, "notes": {"y": "a note on y"}},
                   {"name": "two", "setting": "s", "scenarios": ["u2"], "utility": "u2", "privacy_only": False,
                    "central": None, "notes": {}}]}


def records():
    out = []
    for s, acc in (("u1", {"plain": 0.9, "x": 0.89, "y": 0.6, "z": 0.88}), ("u2", {"plain": 0.8, "x": 0.5})):
        for d, a in acc.items():
            r = rec(d, "ilrg", scenario=s, suite="core", label_acc=1.0 if d in ("plain", "z") else 0.0, accuracy=a,
                    test_samples=1000, he_encrypt_s=0.2 if d == "x" else 0.0, upload_bytes=1e6)
            out.append(at(r, attack_round=0, rounds=4))
    for d, psnr in (("plain", 40.0), ("x", 40.0), ("y", 10.0)):   # z never ran in p1: one cell short
        out.append(at(rec(d, "idlg", scenario="p1", suite="core", psnr=psnr, accuracy=0.9), attack_round=3, rounds=4))
    return out


def test_a_rows_na_reasons_across_scenarios_read_once():
    from leaderboards.summary import merged
    rule = "user-level DP needs a cohort of at least 100 clients a round; this scenario samples "
    assert merged([rule + "4", rule + "1", rule + "4"]) == rule + "4 / 1"
    assert merged(["needs LoRA adapters", "needs LoRA adapters"]) == "needs LoRA adapters"
    assert merged(["no adapters", "no cohort"]) == "no adapters; no cohort"


def test_the_summary_never_reads_utility_outside_the_rows_track_and_never_ranks_an_incomplete_row():
    summary = summarize("core", records(), INFO)
    one, two = summary["tracks"]
    for track in (one, two):
        for row in track["rows"]:
            assert row["utility"] is None or row["utility"]["scenario"] == track["utility_scenario"]
    rows1 = {r["defense"]: r for r in one["rows"]}
    rows2 = {r["defense"]: r for r in two["rows"]}
    assert rows1["x"]["utility"]["value"] == 0.89 and rows2["x"]["utility"]["value"] == 0.5
    assert rows2["y"]["utility"] is None and rows2["y"]["rank"] is None and rows2["y"]["coverage"] == [0, 1]
    assert rows1["z"]["coverage"] == [1, 2] and rows1["z"]["rank"] is None   # leaks nothing computed, yet unranked
    assert [r["defense"] for r in one["rows"]][-2:] == ["z", "lora"]          # under the ranked rows, n/a last
    assert rows1["lora"]["na"] == "no LoRA adapters" and rows1["lora"]["rank"] is None
    assert rows1["y"]["rank"] == 1 and rows1["y"]["note"] == "a note on y"      # leaks nothing: first, utility aside
    assert rows1["x"]["he"] == {"cpu_s_per_round": 0.2, "bytes_per_round": 1e6, "extrapolated": False}
    assert rows1["x"]["families"] == {"label": {"round0": "resists"}, "image": {"trained": "leaks"}}
    assert one["plaintext"] == {"metric": "accuracy", "value": 0.9, "central": {"value": 0.95, "source": "a test"}}


def test_a_planned_scenario_no_row_has_run_counts_against_every_row():
    """Track one plans p2 (page info `planned`), where nothing has run yet: no row of it is complete or ranked."""
    info = {**INFO, "tracks": [{**INFO["tracks"][0], "scenarios": ["u1", "p1", "p2"]}, INFO["tracks"][1]],
            "planned": {"u1": ["ilrg"], "p1": ["idlg"], "p2": ["idlg"]}}
    one = summarize("core", records(), info)["tracks"][0]
    rows = {r["defense"]: r for r in one["rows"] if not r["na"]}
    assert rows["plain"]["coverage"] == [2, 3] and rows["x"]["coverage"] == [2, 3]
    assert all(r["rank"] is None for r in rows.values())
    links = {link["name"]: link["href"] for link in one["view"]["scenario_links"]}
    assert links["p2"] is None and links["u1"] and links["p1"]   # no section on the suite page yet: no link to it
    full = summarize("core", records(), {**INFO, "planned": {"u1": ["ilrg"], "p1": ["idlg"]}})["tracks"][0]
    assert {r["defense"]: r["coverage"] for r in full["rows"]}["plain"] == [2, 2]


def test_a_paillier_row_shows_its_extrapolated_cost_marked_as_such():
    recs = records()
    for r in recs:
        if r["defense"] == "x":
            r["metrics"] = {k: v for k, v in r["metrics"].items() if k != "he_encrypt_s"} | {
                "he_encrypt_extrapolated_s": 800.0, "he_decrypt_extrapolated_s": 400.0, "upload_bytes_extrapolated": 2e7}
    (row,) = [r for r in summarize("core", recs, INFO)["tracks"][0]["rows"] if r["defense"] == "x"]
    assert row["he"] == {"cpu_s_per_round": 1200.0, "bytes_per_round": 2e7, "extrapolated": True}


class Fields(HTMLParser):
    """Each track table's rows as the page shows them: the text of every element marked data-field."""

    def __init__(self):
        super().__init__()
        self.tracks, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "data-track" in a:
            self.tracks.append({"name": a["data-track"], "rows": [], "head": {}})
        if tag == "tr" and "data-row" in a:
            self.tracks[-1]["rows"].append([])
        if "data-field" in a:
            self.stack.append([a["data-field"], a.get("data-family"), a.get("data-stage"), "", tag])
        elif self.stack and tag not in ("br", "img"):
            self.stack[-1].append(None)

    def handle_endtag(self, tag):
        if not self.stack:
            return
        if self.stack[-1][-1] is None:
            self.stack[-1].pop()
            return
        field, fam, stage, text, _ = self.stack.pop()
        text = " ".join(text.split())
        if field in ("plaintext", "central"):
            self.tracks[-1]["head"][field] = text
        else:
            self.tracks[-1]["rows"][-1].append((field, fam, stage, text))

    def handle_data(self, data):
        if self.stack:
            self.stack[-1][3] += data


def numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"[-+]?\d+(?:\.\d+)?", text.replace(",", ""))]


def page_agrees_with_json(html: str, summary: dict) -> None:
    """Every row of every track table says what summary.json says: names, ranks, coverage, verdict words, the
    utility value and interval, HE cost, epsilon and n/a."""
    parsed = Fields()
    parsed.feed(html)
    assert [t["name"] for t in parsed.tracks] == [t["name"] for t in summary["tracks"]]
    for page, track in zip(parsed.tracks, summary["tracks"]):
        assert len(page["rows"]) == len(track["rows"])
        if track["plaintext"]["value"] is not None:
            assert numbers(page["head"]["plaintext"])[0] == pytest.approx(track["plaintext"]["value"], abs=5e-4)
        for cells, row in zip(page["rows"], track["rows"]):
            shown = {f: t for f, fam, st, t in cells if f not in ("family",)}
            assert shown["defense"] == row["defense"] and shown.get("params", "") == row["params"]
            assert shown["rank"] == (str(row["rank"]) if row["rank"] is not None else "–")
            assert shown["coverage"] == f"{row['coverage'][0]} / {row['coverage'][1]}"
            families = {}
            for f, fam, st, t in cells:
                if f == "family":
                    families.setdefault(fam, {})["round0" if st == "round 0" else "trained"] = t
            if row["na"]:
                assert shown["na"] == f"n/a: {row['na']}" and not families
            else:
                assert families == row["families"]
            if "utility" in shown:
                u = row["utility"]
                if u is None or u["loss"] is None:
                    assert not (u and u["value"] is not None and u["loss"] is not None)
                elif u["loss"] == 0 and u["ci"] is None:
                    assert numbers(shown["utility"])[0] == pytest.approx(u["value"], abs=5e-4)
                else:
                    got = numbers(shown["utility"])
                    assert got[0] == pytest.approx(u["loss"], abs=5e-4)
                    if u["ci"]:
                        assert got[1:3] == pytest.approx(u["ci"], abs=5e-4)
            if "he" in shown:
                assert ("extrapolated" in shown["he"]) == bool(row["he"] and row["he"]["extrapolated"])
                assert (shown["he"] == "–") == (row["he"] is None)
            if "epsilon" in shown:
                assert (numbers(shown["epsilon"])[0] == pytest.approx(row["epsilon"], abs=5e-3)
                        if row["epsilon"] is not None else shown["epsilon"] == "–")


def test_the_front_page_and_summary_json_agree(tmp_path):
    from leaderboards.render import render
    from leaderboards.site import build_site

    recs = records()
    render(recs, {"core": INFO}, tmp_path / "core")
    html = build_site(tmp_path, generated="2026-01-01").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(as_json(summarize("core", recs, INFO))))
    page_agrees_with_json(html, summary)
    assert "a note on y" in html and "trained centrally: <span data-field=\"central\">0.950 (a test)" in html
    summary["tracks"][0]["rows"][0]["rank"] = 7   # the check can fail
    with pytest.raises(AssertionError):
        page_agrees_with_json(html, summary)


def test_the_tiny_core_renders_its_track(tiny_core, tmp_path):
    """The fixture suite's [[tracks]] (tests/conftest.py's TINY_CORE), computed and rendered as `leakbench site`
    does: its track's table and summary.json agree, and its DP row carries the track's note."""
    import shutil

    from leaderboards.site import build_site

    shutil.copytree(tiny_core / "core", tmp_path / "core")
    html = build_site(tmp_path, lambda s: None, generated="2026-01-01").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    (track,) = summary["tracks"]
    assert track["name"] == "digits" and track["plaintext"]["metric"] == "accuracy"
    rows = {r["defense"]: r for r in track["rows"]}
    assert set(rows) == {"plaintext", "dp-fedavg", "fedhe-full"}
    assert rows["dp-fedavg"]["note"] and rows["dp-fedavg"]["epsilon"] > 0
    assert all(r["utility"]["scenario"] == "digits-tiny" for r in track["rows"])
    page_agrees_with_json(html, summary)


def test_a_stored_pages_json_with_a_bad_track_is_refused_before_anything_is_written(tmp_path):
    from bench.evaluation.exports import load_pages
    from leaderboards.render import render

    recs = records()
    render(recs, {"core": INFO}, tmp_path / "core")
    pages = json.loads((tmp_path / "core" / "pages.json").read_text())
    assert pages["core"]["tracks"] == INFO["tracks"]
    pages["core"]["tracks"][1]["scenarios"] = ["u1"]
    (tmp_path / "core" / "pages.json").write_text(json.dumps(pages))
    with pytest.raises(ValueError, match="scenario 'u1' is already in track 'one'") as err:
        load_pages(tmp_path / "core", recs)
    assert "\n" not in str(err.value)
