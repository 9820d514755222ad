"""The leaderboard summarizer on tiny hand-built records: strongest attack, ranking, merged blocked cells,
mean +- std, verdict bands, recovered text paired as the metrics pair it, units, the front page across suites;
the site re-rendered from stored results; exports, compare, paper-vs-ours."""
import json

from bench.cli import main
from bench.registry import ATTACKS, METRICS
from bench.evaluation.exports import compare, load_frame
from bench.evaluation.formats import human_bytes, human_seconds, number
from leaderboards.overview import overview
from leaderboards.paper import paper_rows
from leaderboards.render import render
from leaderboards.tables import scenario_table
from leaderboards.texts import recovered_texts
from bench.evaluation.verdicts import band
from bench.protocol.records import seal
from tests.conftest import consistent


UNDEFENDED = ("plain", "plaintext")   # the rows these tests mean as undefended (what a record of them stores)


def rec(defense, attack, status="ok", reason="", scenario="s", suite="t", **metrics):
    per_target = {k: v for k, v in metrics.items() if isinstance(v, list)}
    metrics = {k: (sum(v) / len(v) if isinstance(v, list) else v) for k, v in metrics.items()}
    return consistent({"suite": suite, "scenario": scenario, "defense": defense,
                       "defense_params": {}, "attack": attack, "attack_params": {}, "status": status, "reason": reason,
                       "metrics": metrics, "details": {"per_target": per_target, "family": ATTACKS.get(attack).family
                                                       if attack in ATTACKS else "",
                                                       "undefended": defense in UNDEFENDED,
                                                       "metric_schema": {m: METRICS.get(m).snapshot() for m in metrics}}})


def _cells(table, defense):
    return next(r for r in table["rows"] if r["defense"] == defense)["cells"]


def test_strongest_is_the_worst_case_and_blocked_protects_only_without_a_same_family_attack():
    records = [
        rec("plain", "idlg", psnr=30.0, label_acc=1.0, accuracy=0.9),
        rec("plain", "ilrg", lnacc=0.9, label_acc=0.5, accuracy=0.9),
        rec("plain", "random-guess", label_acc=0.1, accuracy=0.9),
        rec("he", "idlg", "blocked", "blocked by design: empty view", accuracy=0.8),
        rec("he", "ilrg", "blocked", "blocked by design: empty view", accuracy=0.8),
        rec("half", "idlg", "blocked", "blocked by design: head hidden", accuracy=0.85),
        rec("half", "ilrg", lnacc=0.4, label_acc=0.3, accuracy=0.85),
        rec("broken", "idlg", "failed", "RuntimeError: boom", accuracy=0.7),
        rec("broken", "ilrg", "blocked", "blocked by design: empty view", accuracy=0.7),
    ]
    table = scenario_table(records)
    strongest = table["groups"][0]
    assert strongest.name == "strongest"
    keys = [c.key for c in strongest.columns]
    assert keys[0] == "psnr" and "lnacc" in keys and "label_acc" in keys and "accuracy" not in keys
    col = {k: i for i, k in enumerate(keys)}
    plain = _cells(table, "plain")
    assert plain[col["label_acc"]]["text"] == "1.000" and plain[col["label_acc"]]["by"] == "idlg"  # max, not ref
    he, half, broken = _cells(table, "he"), _cells(table, "half"), _cells(table, "broken")
    assert he[col["psnr"]]["text"] == "blocked" and he[col["label_acc"]]["text"] == "blocked"
    # label_acc is reported by the image and the label family: ilrg ran on "half", so it is not protected
    assert half[col["psnr"]]["text"] == "blocked" and half[col["label_acc"]]["text"] == "0.300"
    assert broken[col["psnr"]]["text"] == "failed" and broken[col["label_acc"]]["text"] == "failed"
    # ranked by the verdicts: blocked everywhere first, then labels partly recovered, then image and labels
    # recovered; a row whose attack failed takes no rank and comes last
    assert [(r["defense"], r["rank"]) for r in table["rows"]] == [("he", 1), ("half", 2), ("plain", 3), ("broken", "")]
    # a blocked attack is one merged cell with its reason; run-level accuracy once per defense
    idlg = next(g for g in table["groups"] if g.name == "idlg")
    merged = [c for c in he if c.get("span", 1) > 1]
    assert merged and merged[0]["span"] == len(idlg.columns) and "empty view" in merged[0]["title"]
    assert merged[0]["text"] == "blocked by design" and {"n": merged[0]["note"], "text": "empty view"} in table["notes"]
    assert [c.key for c in table["groups"][-1].columns] == ["accuracy"]


def test_mean_and_std_over_repeats_and_status_column_for_all_failed():
    table = scenario_table([rec("plain", "ilrg", lnacc=[0.5, 1.0]), rec("plain", "odd", "failed", "X: y")])
    cells = _cells(table, "plain")
    assert any(c["text"] == "0.750 ± 0.250" for c in cells)
    odd = next(g for g in table["groups"] if g.name == "odd")
    assert [c.key for c in odd.columns] == ["status"] and any(c.get("title") == "X: y" for c in cells)


def test_site_rerenders_from_results_and_links_every_suite(tmp_path):
    for suite in ("alpha", "beta"):
        records = [rec("plain", "idlg", psnr=30.0, upload_bytes=10.0, accuracy=0.9, suite=suite),
                   rec("he", "idlg", "blocked", "blocked by design: empty view", upload_bytes=99.0, accuracy=0.9,
                       suite=suite)]
        render(records, {suite: {"notes": "Some *markdown* here.", "paper": [
            {"metric": "psnr", "reported": 40.0, "source": "Table 1", "defense": "plain"}]}}, tmp_path / suite)
    (tmp_path / "alpha" / "index.html").write_text("old page")
    assert main(["site", str(tmp_path)]) == 0
    landing = (tmp_path / "index.html").read_text()
    assert 'href="alpha/index.html"' in landing and 'href="beta/index.html"' in landing
    page = (tmp_path / "alpha" / "index.html").read_text()
    assert "<title>LeakBench · alpha</title>" in page and "<em>markdown</em>" in page
    assert "Paper vs ours" in page and "0.75" in page          # 30 / 40
    assert (tmp_path / "alpha" / "plots" / "alpha--s--privacy-vs-cost.png").exists()
    assert 'href="../index.html"' in page and 'href="results.json"' in page and 'href="results.csv"' in page
    assert 'href="#alpha--s"' in page and 'id="alpha--s"' in page       # table of contents


def test_exports_load_frame_and_compare(tmp_path, capsys):
    base = [rec("plain", "idlg", psnr=30.0), rec("he", "idlg", psnr=5.0)]
    base[0] = consistent(base[0] | {"defense_params": {"ratio": 0.1}})
    render(base, {}, tmp_path / "a")
    changed = json.loads(json.dumps(base))
    changed[0]["metrics"]["psnr"] = 31.5
    render([seal(changed[0]), changed[1]], {}, tmp_path / "b")
    frame = load_frame(tmp_path / "a")
    assert list(frame["defense.ratio"].dropna()) == [0.1] and list(frame["psnr"]) == [30.0, 5.0]
    assert compare(tmp_path / "a", tmp_path / "b") == [
        {"cell": "s/plain/idlg", "metric": "psnr", "a": 30.0, "b": 31.5, "delta": 1.5}]
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "psnr: 30.0 -> 31.5 (+1.5)" in capsys.readouterr().out


def test_recovered_text_is_paired_as_the_metric_pairs_it():
    refs = ["the cat sat on the mat", "a dog barked twice", "rain fell all night"]
    swapped = {"recovered": [refs[2], refs[0], refs[1]], "reference": refs}
    for block in (swapped, {**swapped, "matched": list(refs)}):    # paired here (Hungarian) or as the record says
        shown = recovered_texts([block])
        assert shown["summary"] == "3/3 exact" and [r["status"] for r in shown["batches"][0]] == ["exact"] * 3
        assert [r["reference"] for r in shown["batches"][0]] == refs          # the full reference, never cut
    nothing = recovered_texts([{"recovered": ["", ""], "matched": ["", ""], "reference": refs[:2]}])
    assert nothing["summary"] == "0/2 exact, 2 nothing recovered"
    assert [r["status"] for r in nothing["batches"][0]] == ["none", "none"]      # never shown as a match
    partial = recovered_texts([{"recovered": ["the cat sat"], "reference": [refs[0]]}])
    assert partial["batches"][0][0]["status"] == "partial" and 0 < partial["batches"][0][0]["overlap"] < 1


def test_a_swapped_exact_batch_renders_every_row_exact(tmp_path):
    refs = ["it 's a scattershot affair .", "thanks to haynes ' absolute control ."]
    r = rec("plain", "dager", rouge1=1.0, exact_match=1.0)
    r["details"]["texts"] = [{"recovered": refs[::-1], "matched": refs, "reference": refs}]
    page = render([seal(r)], {}, tmp_path).read_text()
    assert page.count('<tr class="exact">') == 2 and 'class="partial"' not in page and "2/2 exact" in page
    assert "<details class=\"recon\"><summary>" in page     # collapsed by default, with its one-line summary


def test_verdict_bands_read_absolute_values():
    assert band("psnr", 70.66, True).level == "leak" and band("ssim", 1.0, True).text == "image recovered"
    assert band("psnr", 20.0, True).level == "partial" and band("psnr", 9.0, True).level == "resisted"
    assert band("lpips", 0.05, False).level == "leak"                         # lower LPIPS is the attacker's side
    assert band("mia_auroc", 0.62, True, {"mia_auroc_ci95": [0.45, 0.80]}).level == "resisted"   # CI has 0.5
    assert band("mia_auroc", 0.2, True).level == "leak"                       # read mirrored
    assert band("mia_tpr_at_1fpr", 0.125, True, {"n_nonmembers": 24}) is None  # TPR at 0% FPR: no opinion
    assert band("lnacc", 0.8, True) is None and band("lnacc", 1.0, True).level == "leak"
    assert band("kde_mi", 3.0, True) is None
    assert band("token_f1", 1.0, True).text == "text partly recovered"        # a set without order: never more
    assert band("token_f1", 0.3, True).level == "resisted"
    # rank 1 of a table can still be "image recovered": the verdict is absolute
    table = scenario_table([rec("paillier", "idlg", psnr=70.66, ssim=1.0), rec("plain", "idlg", psnr=90.0, ssim=1.0)])
    first = table["rows"][0]
    assert first["defense"] == "paillier" and first["rank"] == 1 and first["verdict"].level == "leak"


def test_units_intervals_and_unavailable_columns_said_once():
    assert human_bytes(7_554_120) == "7.55 MB" and human_bytes(114_954) == "115 kB" and human_bytes(512) == "512 B"
    assert human_seconds(0.0108) == "10.8 ms" and human_seconds(0.0) == "0 s" and human_seconds(26.06) == "26.1 s"
    why = "unavailable: needs >= 1000 non-members, has 256"
    records = []
    for d in ("plain", "dp"):
        r = rec(d, "mia-loss", mia_auroc=[0.6, 0.7], **{"mia_tpr_at_0.1fpr": why}, upload_bytes=2e6, accuracy=0.8)
        r["details"]["mia_auroc_ci95"] = [0.61, 0.69]
        records.append(r)
    table = scenario_table(records)
    keys = [c.key for g in table["groups"] for c in g.columns]
    assert "mia_tpr_at_0.1fpr" not in keys and table["dropped"] == [{"text": f"mia_tpr_at_0.1fpr: {why}",
                                                                     "attacks": ["mia-loss"]}]
    cells = _cells(table, "plain")
    auroc = next(c for c in cells if c.get("sub"))
    assert auroc["text"] == "0.650 ± 0.050" and auroc["sub"] == "[0.610, 0.690]"   # std and bootstrap interval
    assert any(c["text"] == "2.00 MB" for c in cells)
    directions = {c.key: c.direction for g in table["groups"] for c in g.columns}
    assert directions["mia_auroc"] == "asc" and directions["accuracy"] == "desc"   # the first click: best first


def test_front_page_has_a_column_per_family_and_links_each_worst_case():
    vision = [rec("plain", "idlg", psnr=70.0, accuracy=0.9, suite="v", scenario="a"),
              rec("he", "idlg", "blocked", "blocked by design: empty view", accuracy=0.85, suite="v", scenario="a"),
              rec("plain", "ilrg", lnacc=1.0, accuracy=0.9, suite="v", scenario="a")]
    for r in vision[:2]:
        r["metrics"]["he_encrypt_s"] = 0.5 if r["defense"] == "he" else 0.0
    text = [rec("plain", "dager", rouge1=1.0, exact_match=1.0, suite="t", scenario="b")]
    board = overview([{"name": "v", "records": vision}, {"name": "t", "records": text}])
    assert [c["family"] for c in board["columns"]] == ["image", "text", "label"]
    assert [c["key"] for c in board["columns"]] == ["psnr", "rouge1", "lnacc"]
    rows = {r["name"]: r for r in board["rows"]}
    image = rows["plain"]["cells"][0]
    assert image["verdict"].text == "image recovered" and image["href"] == "v/index.html#v--a" and image["by"] == "idlg"
    assert rows["he"]["cells"][0]["verdict"].level == "blocked" and rows["he"]["cells"][1]["text"] == "not run"
    assert rows["he"]["utility"]["drop"] > 0.049 and [h["seconds"] for h in rows["he"]["he"]] == [0.5]
    assert rows["plain"]["he"] == []   # no HE time spent: no HE cost


def test_a_defenses_settings_against_each_other_are_no_utility_cost():
    """A scenario that sweeps one defense's settings (a budget at a learning rate that wrecks the model) says
    nothing about that defense's utility cost; beside another defense it does."""
    sweep = [rec("sel", "ilrg", lnacc=1.0, perplexity=4.5e4, suite="s", scenario="a"),
             rec("sel", "ilrg", lnacc=0.5, perplexity=3.6e20, suite="s", scenario="a")]
    for budget, r in zip((0.0, 0.2), sweep):   # budget 0 leaves the update unprotected: the undefended row
        r["defense_params"], r["cell_id"] = {"budget": budget}, f"sel-{budget}"
        r["details"]["undefended"] = budget == 0.0
    board = overview([{"name": "s", "records": sweep}])
    assert board["rows"][0]["utility"] is None
    beside = sweep + [rec("plain", "ilrg", lnacc=1.0, perplexity=300.0, suite="s", scenario="a")]
    rows = {r["name"]: r for r in overview([{"name": "s", "records": beside}])["rows"]}
    assert rows["sel"]["utility"]["value"] == 3.6e20


def test_paper_rows_take_ranges_and_ratios_in_one_precision():
    records = [rec("fast", "r", upload_bytes=100.0), rec("full", "r", upload_bytes=6570.0), rec("fast", "x", psnr=30.0)]
    rows = paper_rows([{"metric": "upload_bytes", "reported": [402, 748], "defense": "fast",
                        "baseline": {"defense": "full"}},
                       {"metric": "psnr", "reported": 40, "defense": "fast"}], records)
    assert rows[0]["reported"] == "402.0–748.0×" and rows[0]["ours"] == "65.7×" and abs(rows[0]["ratio"] - 65.7 / 402) < 1e-9
    assert rows[1]["reported"] == "40.00" and rows[1]["ours"] == "30.00" and rows[1]["ratio"] == 0.75


def test_a_list_in_a_paper_where_gives_one_row_per_value():
    records = [rec("d", "x", psnr=10.0) | {"attack_params": {"path": "a"}},
               rec("d", "x", psnr=20.0) | {"attack_params": {"path": "b"}}]
    rows = paper_rows([{"metric": "psnr", "reported": 20, "defense": "d", "where": {"path": ["a", "b"]}}], records)
    assert [(r["where"], r["ours"], r["ratio"]) for r in rows] == [("defense=d, path=a", "10.00", 0.5),
                                                                   ("defense=d, path=b", "20.00", 1.0)]


def test_compute_summary_counts_each_run_once_and_names_the_machine():
    from leaderboards.render import compute_summary
    env = {"platform": "Linux-x", "cpus": 2, "device": "cpu"}
    a = rec("d", "ilrg", wall_s=3600.0, attack_s=10.0) | {"environment": env | {"run_id": "r1"},
                                                         "config": {"scenario": {"attack_repeats": 3}}}
    b = rec("d", "idlg", wall_s=3600.0, attack_s=20.0) | {"environment": env | {"run_id": "r1"},
                                                         "config": {"scenario": {"attack_repeats": 3}}}
    summary = compute_summary([a, b])
    assert summary["runs"] == 1 and summary["cells"] == 2
    assert abs(summary["hours"] - (3600 + 90) / 3600) < 1e-9
    assert summary["machines"] == ["Linux-x, 2 CPUs, cpu"]


def test_a_record_a_page_cannot_show_stays_in_the_results(tmp_path, capsys):
    old = rec("plain", "idlg", psnr=30.0)
    del old["details"]["metric_schema"]
    render([old, rec("he", "idlg", psnr=10.0)], {}, tmp_path)
    assert "predates metric schema snapshots" in capsys.readouterr().err
    stored = json.loads((tmp_path / "results.json").read_text())
    assert sorted(r["defense"] for r in stored) == ["he", "plain"]


def test_a_blown_up_value_reads_with_an_exponent():
    assert number(360964506429440196608.0, "", "{:.1f}") == "3.61e+20"
    assert number(-2.5e12, "", "{:.3f}") == "-2.5e+12"
    assert number(44669.8, "", "{:.1f}") == "44669.8" and number(3.5e9, "B") == "3.50 GB"


def test_a_band_says_what_decided_it_and_an_interval_from_chance_is_near_chance():
    """Kills mutants of bench/evaluation/verdicts.py that survived the earlier tests (docs/mutation.md): each verdict
    names the metric and value that decided it (a page's tooltip), and a 95% interval whose lower end is chance
    itself contains chance."""
    from bench.evaluation.verdicts import band
    assert band("psnr", 35.0, True).why == "psnr 35" and band("psnr", 20.0, True).why == "psnr 20"
    assert band("psnr", 20.0, True).level == "partial"
    near = band("mia_auroc", 0.62, True, {"mia_auroc_ci95": [0.5, 0.74]})
    assert near.level == "resisted" and near.why == "mia_auroc 0.620: its 95% interval contains 0.5"
    assert band("mia_auroc", 0.62, True, {"mia_auroc_ci95": [0.51, 0.74]}).level == "partial"


def test_site_keeps_the_runs_chance_accuracy_of_scenarios_whose_data_is_absent(tmp_path):
    """Where a suite's TOML knows the chance accuracy of some scenarios only (the others' data is not here), the
    re-rendered page keeps what the run stored for the others instead of dropping it."""
    from leaderboards.site import page_info
    render([rec("plain", "idlg", psnr=30.0, accuracy=0.9, suite="alpha")],
           {"alpha": {"chance": {"s": 0.1, "absent-here": 0.5}}}, tmp_path / "alpha")
    info = page_info("alpha", tmp_path / "alpha", lambda suite: {"chance": {"s": 0.25}, "notes": "n"})
    assert info["chance"] == {"s": 0.25, "absent-here": 0.5} and info["notes"] == "n"


def test_recovered_needs_the_batch_whole_in_nine_draws_of_ten():
    """A mean PSNR far above 30 dB from 7 exact batches of 10 breaks the setting on some draws only: partly."""
    seven = band("psnr", 75.9, True, {}, {"batch_recovered": 0.7})
    assert seven.level == "partial" and "batch_recovered 0.7" in seven.why
    assert band("psnr", 75.9, True, {}, {"batch_recovered": 0.9}).level == "leak"
    assert band("ssim", 0.95, True, {}, {"batch_recovered": 0.5}).level == "partial"
    assert band("psnr", 75.9, True).level == "leak"                 # no count of draws: the value alone
    assert band("psnr", 12.0, True, {}, {"batch_recovered": 0.0}).level == "resisted"
