"""The suite page as the main job shows it: ranks follow the verdicts and never a value inside a verdict band, the
plots' point numbers are the table's ranks, the Pareto line joins only non-dominated points (blocked ones
included), a privacy-only scenario shows no utility, counts read as integers; and `make test` ends by saying how
many tests skipped for want of a data root, with the line that provides it."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.evaluation.formats import is_number, number
from bench.evaluation.verdicts import BANDS
from bench.registry import ATTACKS, METRICS
from leaderboards.render import suite_page
from leaderboards.tables import scenario_table
from tests.conftest import consistent

ROOT = Path(__file__).resolve().parents[1]


def rec(defense, attack, status="ok", reason="", scenario="s", **metrics):
    return consistent({"suite": "t", "scenario": scenario, "defense": defense, "defense_params": {}, "attack": attack,
                       "attack_params": {}, "status": status, "reason": reason, "metrics": metrics,
                       "details": {"per_target": {}, "family": ATTACKS.get(attack).family,
                                   "undefended": defense == "plaintext",
                                   "metric_schema": {m: METRICS.get(m).snapshot() for m in metrics}}})


# -- the checks, applied to hand-built tables, a real run and the main job's page -----------------------------------
def check_ties(table) -> None:
    """Rows of one tier whose every attack family reads the same band share a rank; a lower rank never goes to a
    row that leaks in more families, or in the same ones at a worse band."""
    rows = [r for r in table["rows"] if r["rank"] != ""]
    for a in rows:
        for b in rows:
            if bool(a["no_utility"]) != bool(b["no_utility"]):
                continue
            if a["levels"] == b["levels"]:
                assert a["rank"] == b["rank"], (a["defense"], b["defense"], a["levels"])
            leaks_a = {f for f, v in a["levels"].items() if v in ("partial", "leak")}
            leaks_b = {f for f, v in b["levels"].items() if v in ("partial", "leak")}
            if leaks_a < leaks_b:
                assert a["rank"] < b["rank"], (a["defense"], b["defense"])
    ranks = [(bool(r["no_utility"]), r["rank"] == "", r["rank"] or 0) for r in table["rows"]]
    assert ranks == sorted(ranks)   # the rows are listed in rank order


def check_plots(table, plots) -> None:
    """Point numbers are the ranks; the Pareto line's points are exactly the non-dominated ones."""
    ranks = {r["defense"]: r["rank"] for r in table["rows"]}
    for plot in plots:
        for entry in plot.get("key", []):
            assert int(re.match(r"\d+", entry["n"]).group()) == ranks[entry["name"]], (plot["title"], entry)
            assert re.fullmatch(r"\d+[a-z]?", entry["n"])
        if "front" in plot:
            x_key = "accuracy" if plot["title"].endswith("utility") else "upload_bytes"
            placed = [e["name"] for e in plot["key"]]
            assert set(plot["front"]) == non_dominated(table, x_key, placed), plot["title"]


def non_dominated(table, x_key: str, names: list[str]) -> set[str]:
    """The oracle: the placed rows that no other placed row beats on both axes beyond the worst case's stored 95%
    interval (a blocked row beats every measured privacy value); written out here, apart from leaderboards/."""
    key = table["groups"][0].columns[0]
    lower_y, lower_x = key.lower_is_better is not False, x_key != "accuracy"
    pts = {}
    for row in table["rows"]:
        if row["defense"] not in names:
            continue
        cell = row["cells"][0]
        x = next(r["metrics"][x_key] for r in row["records"] if is_number(r["metrics"].get(x_key)))
        if cell["cls"] == "blocked":
            y = (float("-inf"),) * 2 if lower_y else (float("inf"),) * 2
        else:
            ci = cell["record"]["details"].get(f"{key.key}_ci95") or [cell["sort"]] * 2
            y = (min(ci[0], cell["sort"]), max(ci[1], cell["sort"]))
        pts[row["defense"]] = ((x, x), y)

    def better(q, p, lower):   # q's interval wholly on the better side of p's
        return q[1] < p[0] if lower else q[0] > p[1]

    def dominates(q, p):
        wins = better(q[0], p[0], lower_x) or better(q[1], p[1], lower_y)
        return wins and not (better(p[0], q[0], lower_x) or better(p[1], q[1], lower_y))

    return {n for n, p in pts.items() if not any(dominates(q, p) for m, q in pts.items() if m != n)}


def check_page(suite: str, records, info, out: Path) -> dict:
    page = suite_page(suite, records, info, out)
    for table in page["tables"]:
        if table["rows"]:
            check_ties(table)
            check_plots(table, table["plots"])
    return page


# -- ties inside a band ---------------------------------------------------------------------------------------------
PSNR, LABEL = BANDS["psnr"], BANDS["label_acc"]


def _within(band_of: str, spec, rng: random.Random, hi: float) -> float:
    """A value inside one band of a higher-is-worse metric: leak, partial or resisted."""
    lo, top = {"leak": (spec.leak, hi), "partial": (spec.partial, spec.leak), "resisted": (0.0, spec.partial)}[band_of]
    return rng.uniform(lo, top - 1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_values_moved_inside_their_bands_leave_every_rank_as_it_was(seed):
    """The metamorphic oracle of the tie rule: moving each worst case anywhere inside its band changes no rank. A
    ranking by the first strongest column (what the page did before: plaintext 5th at 82.6 dB above FedML-HE 6th
    at 86.9 dB, both "image recovered") fails it."""
    rng = random.Random(seed)
    levels = [("leak", "leak")] + [(rng.choice(["leak", "partial", "resisted"]),
                                    rng.choice(["leak", "partial", "resisted"])) for _ in range(7)]
    names = ["plaintext"] + [f"d{i}" for i in range(1, 8)]

    def table(r: random.Random):
        records = []
        for name, (image, label) in zip(names, levels):
            records.append(rec(name, "idlg", psnr=_within(image, PSNR, r, 90.0), accuracy=0.9))
            records.append(rec(name, "ilrg", label_acc=_within(label, LABEL, r, 1.0), accuracy=0.9))
        return scenario_table(records)

    first, second = table(random.Random(seed + 100)), table(random.Random(seed + 200))
    assert {r["defense"]: r["rank"] for r in first["rows"]} == {r["defense"]: r["rank"] for r in second["rows"]}
    check_ties(first)
    check_ties(second)


def test_two_recovered_images_tie_and_a_blocked_row_ranks_first():
    records = [rec("plaintext", "idlg", psnr=82.6, accuracy=0.89), rec("fedml-he", "idlg", psnr=86.9, accuracy=0.88),
               rec("maskcrypt", "idlg", psnr=21.0, accuracy=0.88),
               rec("fedhe-full", "idlg", "blocked", "blocked by design: empty view", accuracy=0.89)]
    table = scenario_table(records)
    assert [(r["defense"], r["rank"]) for r in table["rows"]] == [
        ("fedhe-full", 1), ("maskcrypt", 2), ("plaintext", 3), ("fedml-he", 3)]
    assert "never by a value inside a verdict band" in table["rank_rule"]


def test_a_row_whose_attack_failed_takes_no_rank():
    records = [rec("plaintext", "idlg", psnr=40.0), rec("plaintext", "ilrg", label_acc=1.0),
               rec("broken", "idlg", "failed", "RuntimeError: boom"), rec("broken", "ilrg", label_acc=0.1)]
    table = scenario_table(records)
    assert [(r["defense"], r["rank"]) for r in table["rows"]] == [("plaintext", 1), ("broken", "")]


# -- plots and the Pareto line ---------------------------------------------------------------------------------------
def test_a_blocked_row_at_the_best_accuracy_takes_the_points_it_beats_off_the_front(tmp_path):
    """The main job's digits-lenet-b1 before: the line joined plaintext and FedML-HE although FedHE-Full, blocked,
    had a better accuracy than both."""
    records = [rec("plaintext", "idlg", psnr=82.6, accuracy=0.87, upload_bytes=250_000.0),
               rec("fedml-he", "idlg", psnr=86.9, accuracy=0.86, upload_bytes=400_000.0),
               rec("dp", "idlg", psnr=15.0, accuracy=0.80, upload_bytes=250_000.0),
               rec("fedhe-full", "idlg", "blocked", "blocked by design: empty view", accuracy=0.89,
                   upload_bytes=9_000_000.0)]
    page = check_page("t", records, {}, tmp_path)
    plots = {p["title"]: p for p in page["tables"][0]["plots"]}
    assert plots["privacy vs utility"]["front"] == ["fedhe-full"]
    # against upload bytes the blocked row is the dearest: the cheap ones stay on the front
    assert set(plots["privacy vs cost"]["front"]) == {"fedhe-full", "dp"}
    assert [(k["n"], k["name"]) for k in plots["privacy vs utility"]["key"]] == [
        ("1", "fedhe-full"), ("2", "dp"), ("3a", "plaintext"), ("3b", "fedml-he")]
    html = (tmp_path / "plots" / "t--s--privacy-vs-utility.png")
    assert html.exists()


def test_the_oracle_catches_a_front_through_a_dominated_point(tmp_path):
    records = [rec("plaintext", "idlg", psnr=82.6, accuracy=0.87, upload_bytes=1.0),
               rec("fedhe-full", "idlg", "blocked", "blocked by design: empty view", accuracy=0.89, upload_bytes=2.0)]
    page = check_page("t", records, {}, tmp_path)
    table = page["tables"][0]
    wrong = [dict(p, front=["plaintext", "fedhe-full"]) for p in table["plots"] if p["title"].endswith("utility")]
    with pytest.raises(AssertionError):
        check_plots(table, wrong)
    renumbered = [dict(p, key=[dict(k, n="2") for k in p["key"]]) for p in table["plots"]]
    with pytest.raises(AssertionError):
        check_plots(table, renumbered)


def test_a_real_run_ranks_and_plots_as_stated(tiny_core, tmp_path):
    """TINY_CORE (plaintext, central DP-FedAvg, FedHE-Full against iDLG-extended and one-step iDLG): the labels are
    recovered on plaintext and DP-FedAvg alike, so they tie; FedHE-Full is blocked and first."""
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    info = json.loads((tiny_core / "core" / "pages.json").read_text())["core"]
    page = check_page("core", records, info, tmp_path)
    rows = page["tables"][0]["rows"]
    assert rows[0]["defense"] == "fedhe-full" and rows[0]["rank"] == 1
    assert [r["rank"] for r in rows[1:]] == [2, 2]
    assert re.search(r"generated \d{4}-\d\d-\d\d", (tiny_core / "core" / "index.html").read_text())   # run's date


def test_the_demo_site_heads_its_front_page_with_the_suite_it_names(tmp_path, capsys):
    from bench.cli import main
    from leaderboards.render import render

    records = [rec("plaintext", "idlg", psnr=40.0, accuracy=0.9, upload_bytes=1.0),
               rec("fedhe-full", "idlg", "blocked", "blocked by design: empty view", accuracy=0.9, upload_bytes=2.0)]
    render(records, {"t": {}}, tmp_path / "t")
    assert main(["site", str(tmp_path), "--standard", "nope"]) == 2
    assert "--standard 'nope': no folder" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()
    assert main(["site", str(tmp_path)]) == 0 and 'id="summary"' not in (tmp_path / "index.html").read_text()
    assert main(["site", str(tmp_path), "--standard", "t"]) == 0
    front = (tmp_path / "index.html").read_text()
    assert 'id="summary"' in front and 'href="t/index.html#t--s"' in front
    assert "generated " in (tmp_path / "t" / "index.html").read_text()


# -- privacy-only scenarios and integers -----------------------------------------------------------------------------
def test_a_privacy_only_scenario_shows_no_utility(tmp_path):
    records = [rec("plaintext", "idlg", psnr=40.0, accuracy=0.51, upload_bytes=10.0),
               rec("sensecrypt", "idlg", psnr=12.0, accuracy=0.10, upload_bytes=99.0)]
    info = {"privacy_only": {"s": "an 8-unit MLP sized for per-entry Paillier; it does not learn digits"},
            "chance": {"s": 0.1}}
    page = check_page("t", records, info, tmp_path)
    table = page["tables"][0]
    assert table["privacy_only"].startswith("an 8-unit MLP")
    assert not any(g.name == "utility" for g in table["groups"]) and not table["no_utility"]
    assert [p["title"] for p in table["plots"]] == ["privacy vs cost"]
    shown = scenario_table(records, {"chance": {"s": 0.1}})   # undeclared: utility shown, chance flagged
    assert any(g.name == "utility" for g in shown["groups"]) and "sensecrypt" in shown["no_utility"]


def test_the_suite_file_declares_privacy_only_with_a_reason():
    from bench.run.spec import SpecError, parse_suite

    def suite(**extra):
        return parse_suite({"name": "x", "scenarios": [{"name": "s", "dataset": "digits", "model": "mlp", **extra}],
                            "defenses": [{"name": "plaintext"}], "attacks": [{"name": "idlg"}]})

    assert suite(privacy_only="sized for a cost").page_info()["privacy_only"] == {"s": "sized for a cost"}
    assert suite().cells[0].cell_id == suite(privacy_only="sized for a cost").cells[0].cell_id   # no part of the id
    with pytest.raises(SpecError, match="privacy_only"):
        suite(privacy_only=True)


def test_a_count_stored_as_an_integer_reads_as_one():
    assert number(2, "", "{:.3f}") == "2" and number(2.0, "", "{:.3f}") == "2.000"
    assert number(12345, "", "{:,.0f}") == "12,345" and number(True, "", "{:.3f}") == "1.000"


# -- the main job's own page (make trust, after make demo) -----------------------------------------------------------
@pytest.mark.heavy
def test_the_main_jobs_page_ranks_and_plots_as_stated(tmp_path):
    """LEAKBENCH_FIRST_RUN_DEFAULT: the output folder of a finished run of the default suite (`make trust
    FIRST_RUN=out/ci-demo` after `make demo`). Every scenario has an undefended row, and its plaintext trains to
    0.85 or the suite declares it privacy and cost only."""
    folder = os.environ.get("LEAKBENCH_FIRST_RUN_DEFAULT")
    if not folder:
        pytest.skip("needs a finished run of the default suite: make trust FIRST_RUN=out (after make demo)")
    from bench.cli import builtin_page_info

    records = json.loads((Path(folder) / "results.json").read_text())
    info = builtin_page_info("default")
    page = check_page("default", records, info, tmp_path)
    for table in page["tables"]:
        assert any(r["details"].get("undefended") for row in table["rows"] for r in row["records"]), table["scenario"]
        plain = [r["metrics"].get("accuracy") for row in table["rows"] for r in row["records"]
                 if r["details"].get("undefended")]
        assert table["privacy_only"] or min(plain) >= 0.85, (table["scenario"], plain)
        assert not all(c["cls"] == "uncal" for row in table["rows"] for c in row["cells"] if c["strongest"])


# -- make test's last words ------------------------------------------------------------------------------------------
def test_a_run_without_the_data_root_says_how_many_tests_wanted_it_and_how_to_give_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LEAKBENCH_DATA", "LEAKBENCH_SKIP_TALLY")}
    env["PYTHONPATH"] = str(ROOT)
    tally = tmp_path / "skips.json"
    test = "tests/test_data_models.py"
    out = []
    for _ in range(2):   # as `make test` runs pytest twice: the second run says the sum
        done = subprocess.run([sys.executable, "-m", "pytest", test, "-k", "mnist", "-p", "no:cacheprovider"],
                              cwd=ROOT, env=env | {"LEAKBENCH_SKIP_TALLY": str(tally)}, capture_output=True, text=True,
                              timeout=600)
        out.append(done.stdout)
    counts = [int(m.group(1)) for m in (re.search(r"(\d+) tests? skipped for want of a data root", o) for o in out)]
    assert counts[0] >= 1 and counts[1] == 2 * counts[0], out
    assert "LEAKBENCH_DATA=/path/to/data make test" in out[1] and f"({counts[0]} of them in this run)" in out[1]
    assert json.loads(tally.read_text()) == {"a data root": counts[1], "a browser": 0}
