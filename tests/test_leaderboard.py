"""The leaderboard summarizer on tiny hand-built records: strongest attack, ranking, merged blocked cells,
mean +- std; the site re-rendered from stored results; exports, compare, paper-vs-ours."""
import json

from bench.cli import main
from leaderboards.export import compare, load_frame
from leaderboards.render import render
from leaderboards.plots import pareto
from leaderboards.tables import scenario_table


def rec(defense, attack, status="ok", reason="", scenario="s", suite="t", **metrics):
    per_target = {k: v for k, v in metrics.items() if isinstance(v, list)}
    metrics = {k: (sum(v) / len(v) if isinstance(v, list) else v) for k, v in metrics.items()}
    return {"cell_id": f"{scenario}-{defense}-{attack}", "suite": suite, "scenario": scenario, "defense": defense,
            "defense_params": {}, "attack": attack, "attack_params": {}, "status": status, "reason": reason,
            "metrics": metrics, "details": {"per_target": per_target}}


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
    # ranked by the first strongest column: blocked first, failed last
    assert [r["defense"] for r in table["rows"]][-1] == "broken"
    assert [r["rank"] for r in table["rows"]][:2] == [1, 1] and table["rows"][2]["defense"] == "plain"
    # a blocked attack is one merged cell with its reason; run-level accuracy once per defense
    idlg = next(g for g in table["groups"] if g.name == "idlg")
    merged = [c for c in he if c.get("span", 1) > 1]
    assert merged and merged[0]["span"] == len(idlg.columns) and "empty view" in merged[0]["text"]
    assert [c.key for c in table["groups"][-1].columns] == ["accuracy"]


def test_mean_and_std_over_repeats_and_status_column_for_all_failed():
    table = scenario_table([rec("plain", "ilrg", lnacc=[0.5, 1.0]), rec("plain", "odd", "failed", "X: y")])
    cells = _cells(table, "plain")
    assert any(c["text"] == "0.750 ± 0.250" for c in cells)
    odd = next(g for g in table["groups"] if g.name == "odd")
    assert [c.key for c in odd.columns] == ["status"] and any(c["text"] == "X: y" for c in cells)


def test_pareto_frontier():
    assert pareto([(1, 5), (2, 3), (3, 4), (4, 1)], x_lower=True, y_lower=True) == [(1, 5), (2, 3), (4, 1)]


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


def test_exports_load_frame_and_compare(tmp_path, capsys):
    base = [rec("plain", "idlg", psnr=30.0), rec("he", "idlg", psnr=5.0)]
    base[0]["defense_params"] = {"ratio": 0.1}
    render(base, {}, tmp_path / "a")
    changed = json.loads(json.dumps(base))
    changed[0]["metrics"]["psnr"] = 31.5
    render(changed, {}, tmp_path / "b")
    frame = load_frame(tmp_path / "a")
    assert list(frame["defense.ratio"].dropna()) == [0.1] and list(frame["psnr"]) == [30.0, 5.0]
    assert compare(tmp_path / "a", tmp_path / "b") == [
        {"cell": "s/plain/idlg", "metric": "psnr", "a": 30.0, "b": 31.5, "delta": 1.5}]
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "psnr: 30.0 -> 31.5 (+1.5)" in capsys.readouterr().out


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
