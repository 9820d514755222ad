"""`leakbench verify`: the cells that decide a page recomputed from their stored configs and compared at each metric's
tolerance, keeping verdict bands and ranks; the forgeries a checksum lets through caught; pages that say which cells
were re-checked. End to end on the tiny core suite (tests/conftest.py), and on the committed core records where a
forgery is read, never recomputed."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.evaluation.calibration import record_verdict
from bench.evaluation.deciding import deciding_cells
from bench.evaluation.schema import attack_label, defense_label, family, schema_of
from bench.evaluation.verification import counts, load_report, mark, own_reports
from bench.protocol.records import DIGEST, fingerprint_of, seal, sealed
from bench.run.tolerance import Tolerance, differences
from bench.run.verify import _rank
from leaderboards.tables import ranks
from tests.conftest import DP, copy_export, find_record

CORE = Path(__file__).resolve().parents[1] / "leaderboards" / "results" / "core"


def _forge(label: str, **metrics):
    """A forgery only a recomputation catches: metrics edited and the digest recomputed."""
    def edit(records):
        rec = find_record(records, label)
        rec["metrics"].update(metrics)
        seal(rec)
    return edit


@pytest.fixture(scope="module")
def committed():
    """Core's committed records and page info, read (never recomputed): the forgeries of issue 72 are made on them."""
    return json.loads((CORE / "results.json").read_text()), json.loads((CORE / "pages.json").read_text())


def _committed(records, scenario, defense, attack):
    return next(r for r in records if r["scenario"] == scenario and r["defense"] == defense and r["attack"] == attack)


def test_a_psnr_forged_inside_its_own_interval_does_not_reproduce(committed):
    """A forgery that lowers leakage: SPEAR's PSNR on FedHE-Top2 (35.4 dB, interval [10.0, 83.0]) set to 12.0; and
    one that turns the record's verdict."""
    genuine = _committed(committed[0], "mnist-mlp-trained-b8", "fedhe-top2", "spear")
    low, high = genuine["details"]["psnr_ci95"]
    forged = seal(copy.deepcopy(genuine) | {"metrics": genuine["metrics"] | {"psnr": 12.0}})
    assert sealed(forged) and low < 12.0 < high   # a checksum and the stored interval both let it through
    found = {d.what: d for d in differences(forged, genuine, Tolerance())}   # recomputed as committed
    assert found["psnr"].tolerance == "±0.5 dB" and found["psnr"].stored == 12.0
    assert (found["band of psnr"].stored, found["band of psnr"].recomputed) == ("resisted", "partial")
    assert differences(genuine, copy.deepcopy(genuine), Tolerance()) == []
    # one whose record verdict turns: Fashion-MNIST FedML-HE's SPEAR PSNR (13.4 dB in [8.3, 19.5]) set to 19.4
    genuine = _committed(committed[0], "fmnist-mlp-utility", "fedml-he", "spear")
    low, high = genuine["details"]["psnr_ci95"]
    forged = seal(copy.deepcopy(genuine) | {"metrics": genuine["metrics"] | {"psnr": 19.4}})
    assert sealed(forged) and low < 19.4 < high
    found = {d.what: d for d in differences(forged, genuine, Tolerance())}
    assert (found["band of psnr"].stored, found["band of psnr"].recomputed) == ("partial", "resisted")
    assert "partly recovered" in found["verdict"].stored and found["verdict"].recomputed == "image not recovered"


def test_a_resealed_edit_of_a_deciding_cell_is_chosen_and_differs(committed):
    records, pages = committed
    genuine = _committed(records, "cifar10-lenet-images-b1", "maskcrypt", "inverting-gradients")
    assert round(genuine["metrics"]["psnr"], 2) == 18.74
    forged = [copy.deepcopy(r) for r in records]
    edited = next(r for r in forged if r["cell_id"] == genuine["cell_id"])
    edited["metrics"]["psnr"] -= 10.0
    seal(edited)
    assert mark(edited, None)["state"] == "sealed"          # a page reads it as computed, not as re-checked
    assert genuine["cell_id"] in deciding_cells(forged, pages)
    found = {d.what for d in differences(edited, genuine, Tolerance())}
    assert {"psnr", "band of psnr"} <= found   # partly recovered -> not recovered, by PSNR


def test_a_forged_cell_that_is_not_its_rows_worst_is_chosen_all_the_same(committed):
    """The old sample drew 8 cells plus each row's worst, chosen from stored values: a forgery that lowers a cell
    below its row's worst never became one. The structure chooses every calibrated cell, whatever it stores."""
    records, pages = committed
    schema = schema_of(records)
    row = [r for r in records if r["scenario"] == "cifar10-lenet-images-b1" and r["defense"] == "maskcrypt"
           and family(r) == "image" and r["status"] == "ok"]
    worst = max(row, key=lambda r: r["metrics"]["psnr"])
    other = next(r for r in row if r is not worst and record_verdict(r, schema).level)
    forged = [copy.deepcopy(r) for r in records]
    edited = next(r for r in forged if r["cell_id"] == other["cell_id"])
    edited["metrics"]["psnr"] = other["metrics"]["psnr"] - 3.0   # lowers the leakage it shows
    seal(edited)
    assert edited["metrics"]["psnr"] < worst["metrics"]["psnr"]   # never the row's worst case
    assert other["cell_id"] in deciding_cells(forged, pages)
    chosen = deciding_cells(records, pages)
    assert set(chosen) == set(deciding_cells(forged, pages))      # the choice does not read the values


def test_the_structure_chooses_calibration_verdict_utility_and_he_cells_and_not_the_rest(tiny_core):
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    chosen = deciding_cells(records, json.loads((tiny_core / "core" / "pages.json").read_text()))
    why = {f"{defense_label(r)}/{attack_label(r)}": chosen.get(r["cell_id"], "") for r in records}
    assert why["plaintext/idlg(steps=1)"].startswith("calibration")     # the undefended row calibrates each attack
    assert why["dp-fedavg(noise_multiplier=0.5)/idlg-extended"].startswith("verdict and rank")
    assert why["fedhe-full/idlg(steps=1)"].startswith("HE cost")
    assert why["dp-fedavg(noise_multiplier=0.5)/idlg(steps=1)"] == ""   # uncalibrated: it judges nothing


def _pair(name, stored, recomputed, schema=None, metrics=None, scenario=None, details=None):
    entry = {"unit": "", "kind": "privacy", "lower_is_better": True} | (schema or {})

    def rec(value, ci=None):
        return {"cell_id": "0" * 16, "status": "ok", "reason": "", "metrics": {name: value} | (metrics or {}),
                "config": {"scenario": scenario or {}},
                "details": {"family": "image", "metric_schema": {name: entry}} | (details or {})
                | ({f"{name}_ci95": ci} if ci else {})}
    return rec(*stored), rec(*recomputed)


ACC = {"unit": "", "kind": "utility", "lower_is_better": False}
MEMBERS = {"n_members": 200, "n_nonmembers": 200}


@pytest.mark.parametrize("name, stored, recomputed, kw, agree", [
    ("accuracy", (0.162,), (0.164,), {"schema": ACC, "metrics": {"test_samples": 500}}, True),     # 1 of 500
    ("accuracy", (0.160,), (0.170,), {"schema": ACC, "metrics": {"test_samples": 500}}, True),     # 5 of 500
    ("accuracy", (0.160,), (0.172,), {"schema": ACC, "metrics": {"test_samples": 500}}, False),    # 6 of 500
    ("accuracy", (0.90,), (0.92,), {"schema": ACC, "metrics": {"test_samples": 10000}}, False),    # 200 of 10,000
    ("psnr", (20.0,), (20.4,), {}, True), ("psnr", (20.0,), (20.6,), {}, False),
    ("psnr", (29.8,), (30.1,), {}, False),               # within 0.5 dB, but "partly" becomes "recovered"
    ("label_acc", (0.5,), (0.5 + 1 / 96,), {"scenario": {"batch_size": 32, "attack_repeats": 3}}, True),
    ("label_acc", (0.5,), (0.5 + 2 / 96,), {"scenario": {"batch_size": 32, "attack_repeats": 3}}, False),
    ("label_acc", (0.91,), (0.90,), {"scenario": {"batch_size": 32, "attack_repeats": 1}}, True),
    ("label_acc", (0.90,), (0.89,), {"scenario": {"batch_size": 32, "attack_repeats": 1}}, False),  # leaves "recovered"
    ("label_f1", (0.8,), (0.81,), {}, False),                                                       # exact
    ("mia_auroc", (0.70, [0.60, 0.80]), (0.709, [0.609, 0.809]), {"details": MEMBERS}, True),      # 400 pair swaps
    ("mia_auroc", (0.70, [0.60, 0.80]), (0.72, [0.62, 0.82]), {"details": MEMBERS}, False),        # inside the interval
    ("mia_auroc", (0.70, [0.60, 0.80]), (0.70, [0.65, 0.80]), {"details": MEMBERS}, False),        # the interval moved
    ("mia_tpr_at_1fpr", (0.10,), (0.105,), {"details": MEMBERS}, True),                           # one of 200 members
    ("upload_bytes", (1000.0,), (1000.5,), {"schema": {"unit": "B"}}, False),                       # a count: exact
    ("ciphertext_bytes", (28208355.0,), (28207919.0,), {"schema": {"unit": "B"}}, True),   # SEAL's compression
    ("ciphertext_bytes", (28208355.0,), (28300000.0,), {"schema": {"unit": "B"}}, False),  # 0.3 %: not compression
    ("upload_bytes", (86888163.0,), (86887727.0,), {"schema": {"unit": "B"}, "metrics": {"ciphertext_bytes": 2.8e7}},
     True),                                                                  # what carries ciphertexts moves with them
    ("wall_s", (1.0,), (9.0,), {"schema": {"timing": True}}, True),                                 # never compared
    ("kde_mi", (0.5,), (0.5004,), {}, True), ("kde_mi", (0.5,), (0.502,), {}, False),              # relative 1e-3
    ("perplexity", (134.436,), (134.935,), {}, True),     # loss 4.9011 -> 4.9048: within 1e-3 of the loss
    ("perplexity", (134.436,), (135.2,), {}, False),      # loss moved 1.2e-3 of itself
    ("note", ("unavailable: x",), ("unavailable: x",), {}, True),
])
def test_each_metric_is_compared_at_its_tolerance_and_keeps_its_band(name, stored, recomputed, kw, agree):
    a, b = _pair(name, stored, recomputed, **kw)
    assert (differences(a, b, Tolerance()) == []) is agree


def test_a_structural_detail_that_moves_a_cell_on_the_page_must_be_the_same():
    a, b = _pair("psnr", (20.0,), (20.0,))
    b["details"]["undefended"] = True
    assert [d.what for d in differences(a, b, Tolerance())] == ["undefended"]


def test_tolerances_parse_and_a_bad_one_is_refused(tiny_core, capsys):
    tol = Tolerance.parse(["1e-2", "psnr=1.5"])
    assert tol.relative == 0.01 and tol.per_metric == {"psnr": 1.5}
    a, b = _pair("psnr", (20.0,), (21.0,))
    assert differences(a, b, tol) == [] and differences(a, b, Tolerance()) != []
    assert main(["verify", str(tiny_core / "core"), "--tolerance", "psnr=lots"]) == 2
    assert "--tolerance 'psnr=lots'" in capsys.readouterr().err


def test_a_recomputed_cell_that_moves_a_rank_does_not_reproduce(tiny_core):
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    plain = find_record(records, "digits-tiny/plaintext/idlg(steps=1)")
    plain["metrics"]["psnr"] = 20.0   # iDLG breaks the undefended row: its cells rank the rows by PSNR
    info = json.loads((tiny_core / "core" / "pages.json").read_text())["core"]
    stored = find_record(records, f"{DP}/idlg(steps=1)")
    assert ranks(records, info)[defense_label(stored)] == 2
    within = copy.deepcopy(stored)
    within["metrics"]["psnr"] = stored["metrics"]["psnr"] + 0.4   # inside its band: rows in one band tie
    assert _rank(stored, within, records, lambda recs: ranks(recs, info)) == []
    fresh = copy.deepcopy(stored)
    fresh["metrics"].update(psnr=35.0, batch_recovered=1.0)   # recovered (every draw whole), where the
    #                                                               undefended row reads partly recovered
    moved = _rank(stored, fresh, records, lambda recs: ranks(recs, info))
    assert f"rank of {defense_label(stored)} in digits-tiny" in {d.what for d in moved}
    assert _rank(stored, copy.deepcopy(stored), records, lambda recs: ranks(recs, info)) == []


def test_by_default_the_deciding_cells_are_recomputed_and_a_resealed_edit_differs(tiny_core, tmp_path, capsys):
    folder = copy_export(tiny_core, tmp_path / "sent" / "core", _forge(f"{DP}/idlg-extended", lnacc=0.5))
    assert main(["verify", str(folder), "--only", f"{DP}/*", "--report", str(tmp_path / "forged.json")]) == 1
    out = capsys.readouterr().out
    assert "1 of 6 cell(s) in 1 row(s) will be recomputed (1 deciding what its pages show, 0 drawn at random)" in out
    assert "about " in out.splitlines()[0] and "torch thread(s)" in out.splitlines()[0]   # stated before it starts
    assert f"differs     {DP}/idlg-extended: lnacc stored 0.5, recomputed 1.0 (±1 label" in out
    assert "band of lnacc stored 'no opinion', recomputed 'leak'" in out
    assert "1 of 6 cell(s) checked (1 deciding what its pages show, 0 drawn with seed 0): 0 reproduced, 1 differ" in out
    # the report of a folder in which a cell differs is published nowhere
    copy_export(tiny_core, tmp_path / "site" / "core", _forge(f"{DP}/idlg-extended", lnacc=0.5))
    before = {p: p.read_bytes() for p in (tmp_path / "site").rglob("*") if p.is_file()}
    assert main(["site", str(tmp_path / "site"), "--report", str(tmp_path / "forged.json")]) == 1
    assert "1 of 1 recomputed cell(s) differ from what it stores; nothing was published" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (tmp_path / "site").rglob("*") if p.is_file()} == before


def test_a_cell_of_other_code_is_stale_until_forced(tiny_core, tmp_path, capsys):
    def older(records):   # computed by another version of the harness: its hash and the fingerprint over it
        for rec in records:
            rec["environment"]["components"]["harness"] = "0123456789abcdef"
            rec["environment"]["fingerprint"] = fingerprint_of(rec["environment"]["components"])
            seal(rec)
    folder = copy_export(tiny_core, tmp_path / "old", older)
    theirs = find_record(json.loads((folder / "results.json").read_text()), f"{DP}/idlg-extended")["environment"][
        "fingerprint"]
    assert main(["verify", str(folder), "--only", f"{DP}/idlg-extended"]) == 0
    out = capsys.readouterr().out
    assert "stale       " in out and f"recompute with --force or check out the commit of {theirs}" in out
    assert "harness differ" in out
    assert "0 reproduced, 0 differ, 1 stale" in out
    assert main(["verify", str(folder), "--only", f"{DP}/idlg-extended", "--force"]) == 0
    assert "1 reproduced, 0 differ, 0 stale" in capsys.readouterr().out


def test_only_narrows_and_a_pattern_that_selects_nothing_is_one_line(tiny_core, capsys):
    assert main(["verify", str(tiny_core / "core"), "--only", "zzz-nothing"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "--only 'zzz-nothing' selects none" in captured.err
    assert main(["verify", str(tiny_core / "core"), "--dry-run", "--sample", "all"]) == 0
    out = capsys.readouterr().out
    assert "6 of 6 cell(s) in 3 row(s) will be recomputed (5 deciding what its pages show, 1 drawn at random)" in out
    assert f"recompute  {DP}/idlg(steps=1): drawn at random" in out


def test_a_verification_report_is_shown_where_it_is_published(tiny_core, tmp_path, capsys):
    folder = copy_export(tiny_core, tmp_path / "checked" / "core")
    report = tmp_path / "report.json"
    assert main(["verify", str(folder), "--sample", "all", "--report", str(report)]) == 0
    assert "6 reproduced, 0 differ, 0 stale" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["folder"] == "core" and len(data["outcomes"]) == 6 and data["machine"] and data["date"]
    assert {o["tolerances"]["accuracy"] for o in data["outcomes"]} == {"±5 of 100 test samples"}
    site = tmp_path / "site"
    copy_export(tiny_core, site / "core")   # published from another folder than the one verified
    assert main(["site", str(site), "--date", "2026-01-01", "--report", str(report)]) == 0
    page, front = (site / "core" / "index.html").read_text(), (site / "index.html").read_text()
    where = data["outcomes"][0]["machine"]   # this machine with the torch threads that recomputed the cell
    assert where.startswith(data["machine"]) and where.endswith("torch thread(s)")
    assert f"6 of 6 cells reproduced by <code>leakbench verify</code> on {where}, {data['date']}" in page
    assert 'data-check="reproduced"' in page and 'data-check="sealed"' not in page
    assert 'id="verification"' in page and "drawn at random" in page and "±5 of 100 test samples" in page
    assert f"6 of 6 cells reproduced on {where}" in front
    # the same folder without a report: every cell as computed (sealed), named a checksum, nothing re-checked
    assert main(["site", str(site), "--date", "2026-01-01"]) == 0
    page = (site / "core" / "index.html").read_text()
    assert "Not re-checked:" in page and "not a forgery" in page and 'data-check="reproduced"' not in page
    records = json.loads((site / "core" / "results.json").read_text())
    assert counts(records, None)["digits-tiny"] == {"cells": 6, "reproduced": 0, "sealed": 6, "unverified": 0}


def test_verify_resumes_its_report_piece_by_piece_and_a_folder_shows_its_own(tiny_core, tmp_path, capsys):
    """A folder too large for one sitting: each piece's reproduced outcomes are kept (with the machine and date
    that recomputed them), a rerun recomputes only what is left and what differed, and DIR/verification.json is
    shown without --report; a record recomputed since leaves its old outcome out, said in one line."""
    folder = copy_export(tiny_core, tmp_path / "site" / "core")
    report = folder / "verification.json"
    assert main(["verify", str(folder), "--sample", "all", "--only", "*/plaintext/*", "--report", str(report)]) == 0
    first = json.loads(report.read_text())["outcomes"]
    assert 0 < len(first) < 6 and all(o["state"] == "reproduced" for o in first)
    assert len(first) >= 2
    first[0]["date"] = "2026-01-01"   # as if that piece ran on an earlier day
    first[-1] |= {"state": "differs", "differences": [["psnr", 20.0, 12.0, "±0.5 dB"]]}   # before a fix
    report.write_text(json.dumps(json.loads(report.read_text()) | {"outcomes": first}))
    capsys.readouterr()
    assert main(["verify", str(folder), "--sample", "all", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    kept = first[:-1]
    assert f"resuming {report}: {len(kept)} cell(s) already reproduced are kept, 1 that differed are checked again" \
        in out
    assert f"{6 - len(kept)} of 6 cell(s)" in out and "(6 cells with the" in out
    whole = json.loads(report.read_text())["outcomes"]
    assert len(whole) == 6 and whole[:len(kept)] == kept and {o["cell_id"] for o in whole} == \
        {r["cell_id"] for r in json.loads((folder / "results.json").read_text())}
    assert main(["site", str(folder.parent), "--date", "2026-01-01"]) == 0
    page, front = (folder / "index.html").read_text(), (folder.parent / "index.html").read_text()
    assert f"6 of 6 cells reproduced by <code>leakbench verify</code> on {whole[-1]['machine']}, 2026-01-01 to " in page
    from leaderboards.site import checks, track_checks   # a track adds up its scenarios' counts
    tally = track_checks(checks(json.loads((folder / "results.json").read_text()), own_reports(
        [(folder, json.loads((folder / "results.json").read_text()))], print)[folder]), ["digits-tiny", "elsewhere"])
    assert (tally["cells"], tally["reproduced"], tally["sealed"]) == (6, 6, 0) and "2026-01-01 to " in tally["where"]
    records = json.loads((folder / "results.json").read_text())
    records[0]["metrics"]["accuracy"] = 0.5   # recomputed since (and resealed, as a run writes it)
    seal(records[0])
    (folder / "results.json").write_text(json.dumps(records))
    capsys.readouterr()
    assert main(["site", str(folder.parent), "--date", "2026-01-01"]) == 0
    assert "1 outcome(s) of records since recomputed left out" in capsys.readouterr().out
    assert "5 of 6 cells reproduced" in (folder / "index.html").read_text()
    report.write_text("{not json")   # a report that cannot be resumed is refused in one line, nothing recomputed
    capsys.readouterr()
    assert main(["verify", str(folder), "--report", str(report)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "is not valid JSON" in captured.err


@pytest.mark.parametrize("edit, phrase", [
    (lambda d: d["outcomes"][0].update(digest="0" * 16), "is no record of the folder"),
    (lambda d: d.update(folder="elsewhere"), "the report's folder 'elsewhere' is none of core"),
    (lambda d: d["outcomes"][0].update(state="fine"), "is none of reproduced, differs, stale"),
    (lambda d: d.update(date="yesterday"), "is not YYYY-MM-DD"),
    (lambda d: d.update(format="x"), "its format is not"),
    (None, "is not valid JSON"),
])
def test_a_bad_report_is_refused_in_one_line(tiny_core, tmp_path, capsys, edit, phrase):
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    from bench.protocol.records import digest
    data = {"format": "leakbench-verification/1", "folder": "core", "machine": "m", "date": "2026-01-01", "cells": 6,
            "outcomes": [{"cell_id": records[0]["cell_id"], "label": "x", "digest": digest(records[0]),
                          "state": "reproduced", "chosen": "c", "why": "", "tolerances": {}, "differences": [],
                          "seconds": 1.0}]}
    assert load_report(_write(tmp_path / "ok.json", data), {"core": records}).reproduced == {digest(records[0]): "m, 2026-01-01"}
    copy_export(tiny_core, tmp_path / "site" / "core")
    bad = tmp_path / "bad.json"
    if edit is None:
        bad.write_text("{not json")
    else:
        edit(data)
        _write(bad, data)
    assert main(["site", str(tmp_path / "site"), "--report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and phrase in err and not (tmp_path / "site" / "index.html").exists()


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_site_verify_publishes_what_reproduces_and_refuses_a_forgery(tiny_core, tmp_path, capsys):
    def dp_row(recs):   # one row, no utility: each of its cells flags it; a digest stripped, so only verify admits it
        recs[:] = [r for r in recs if r["defense"] == "dp-fedavg"]
        del find_record(recs, f"{DP}/idlg-extended")["environment"][DIGEST]
    copy_export(tiny_core, tmp_path / "site" / "core", dp_row)
    assert main(["site", str(tmp_path / "site"), "--date", "2026-01-01", "--verify", "0"]) == 0
    page = (tmp_path / "site" / "core" / "index.html").read_text()
    assert "2 of 2 cells reproduced by <code>leakbench verify</code>" in page and 'class="unverified' not in page

    def inflate(recs):   # the deciding cell's upload size edited and resealed
        dp_row(recs)
        rec = find_record(recs, f"{DP}/idlg-extended")
        rec["metrics"]["upload_bytes"] += 1
        seal(rec)
    forged = copy_export(tiny_core, tmp_path / "forged" / "core", inflate)
    before = {p: p.read_bytes() for p in forged.rglob("*")}
    assert main(["site", str(tmp_path / "forged"), "--verify", "0"]) == 1
    assert "nothing was published" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in forged.rglob("*")} == before and not (tmp_path / "forged" / "index.html").exists()


def test_rows_recomputed_in_parallel_at_another_thread_count_reproduce(tiny_core, capsys):
    """Two rows at a time, each in a spawned process, at 1 torch thread where the records say 2: the tiny core's
    cells reproduce within their tolerances (a second machine's setting), and the plan says so."""
    stored = {r["environment"]["threads"] for r in json.loads((tiny_core / "core" / "results.json").read_text())}
    assert stored == {2}
    assert main(["verify", str(tiny_core / "core"), "--sample", "all", "--workers", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 row(s) at a time" in out
    assert "0 differ, 0 stale" in out and " 0 reproduced" not in out
    assert main(["verify", str(tiny_core / "core"), "--workers", "0"]) == 2
    assert "--workers 0: expected a number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("name, stored, recomputed, kw, agree", [
    ("kde_mi_protected", (0.0926,), (0.1045,), {}, True),   # 13 %: what fresh CKKS noise moved SHE-LoRA's by
    ("kde_mi", (0.0691,), (0.0950,), {}, False),            # 37 %
    ("accuracy", (0.160,), (0.172,), {"schema": ACC, "metrics": {"test_samples": 500}}, True),    # 6 of 500 < 2 SE
    ("accuracy", (0.160,), (0.200,), {"schema": ACC, "metrics": {"test_samples": 500}}, False),   # 20 > 16.4
    ("mia_tpr_at_5fpr", (0.0625,), (0.078125,), {"details": {"n_members": 128, "n_nonmembers": 128}}, True),  # 8 -> 10
    ("mia_tpr_at_5fpr", (0.0625,), (0.125,), {"details": {"n_members": 128, "n_nonmembers": 128}}, False),   # 8 -> 16
    ("psnr", (20.0,), (20.6,), {}, False),                  # PSNR keeps its rule
    ("lm_loss", (4.9011,), (4.9073,), {"schema": ACC}, True),     # 0.13 %, within 5e-3
    ("lm_loss", (4.9011,), (4.94,), {"schema": ACC}, False),      # 0.8 %
    ("perplexity", (134.436,), (135.267,), {"schema": ACC}, True),  # 0.6 %, within e^(5e-3 x 4.9) - 1 = 2.5 %
    ("perplexity", (134.436,), (139.0,), {"schema": ACC}, False),
])
def test_a_randomized_run_widens_only_leakage_estimates_without_a_rule_of_their_own(name, stored, recomputed, kw,
                                                                                    agree):
    a, b = _pair(name, stored, recomputed, **kw)
    tol = Tolerance().of_randomized_run("kde_mi 0.0696 and 0.0675")
    assert (differences(a, b, tol) == []) is agree
    assert differences(a, b, Tolerance()) != []   # each one differs where the run is not randomized


def _noisy(monkeypatch, factor: float):
    """recompute_row whose runs differ from each other as fresh CKKS noise makes them: KDE MI times (1 + factor)
    in odd runs, (1 - factor) in even ones, factor 0 deterministic; returns the list of runs."""
    import bench.run.verify as verify_module
    from bench.run.recompute import recompute_row as real

    runs = []

    def noisy(*job):
        fresh, used, seconds = real(*job)
        runs.append(1)
        for rec in fresh:
            if isinstance(rec["metrics"].get("kde_mi"), float):
                rec["metrics"]["kde_mi"] *= 1 + factor if len(runs) % 2 else 1 - factor
        return fresh, used, seconds
    monkeypatch.setattr(verify_module, "recompute_row", noisy)
    return runs


def test_a_row_that_differs_runs_again_and_only_two_runs_apart_make_it_randomized(tiny_core, tmp_path, capsys,
                                                                                  monkeypatch):
    """A cell that differs after one recomputation is recomputed once more: two runs that agree leave it differing
    (a forgery, a bug, another machine); two that differ from each other, by randomness no seed fixes, compare
    its estimates of leakage with both at RANDOM_LEAKAGE, and say so in the report."""
    label = f"{DP}/idlg-extended"
    folder = copy_export(tiny_core, tmp_path / "a" / "core")
    stored = find_record(json.loads((folder / "results.json").read_text()), label)["metrics"]["kde_mi"]
    assert isinstance(stored, float) and stored > 0
    runs = _noisy(monkeypatch, 0.02)
    report = tmp_path / "noisy.json"
    assert main(["verify", str(folder), "--only", label, "--report", str(report)]) == 0
    (outcome,) = json.loads(report.read_text())["outcomes"]
    assert len(runs) == 2 and outcome["state"] == "reproduced"
    assert outcome["why"].startswith("a randomized run, two recomputations apart: kde_mi ")
    assert outcome["tolerances"]["kde_mi"].startswith("relative 0.25 (an estimate of leakage in a randomized run")
    forged = copy_export(tiny_core, tmp_path / "b" / "core", _forge(label, kde_mi=stored * 1.5))
    runs.clear()
    assert main(["verify", str(forged), "--only", label, "--report", str(tmp_path / "forged.json")]) == 1
    assert len(runs) == 2 and "kde_mi stored" in capsys.readouterr().out   # 50 % is no CKKS noise
    runs = _noisy(monkeypatch, 0.0)
    assert main(["verify", str(forged), "--only", label, "--report", str(tmp_path / "same.json")]) == 1
    (outcome,) = json.loads((tmp_path / "same.json").read_text())["outcomes"]
    assert len(runs) == 2 and "randomized" not in outcome["why"] and outcome["tolerances"]["kde_mi"] == "relative 0.001"


def test_in_parallel_a_row_that_differs_is_recomputed_in_a_worker_again_and_still_differs(tiny_core, tmp_path, capsys):
    """Two rows at a time: the forged row goes back to the pool for its second run, the other reproduces at once."""
    label = f"{DP}/idlg-extended"
    forged = copy_export(tiny_core, tmp_path / "f" / "core", _forge(label, lnacc=0.5))
    assert main(["verify", str(forged), "--sample", "all", "--only", "digits-tiny/[dp]*", "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert f"differs     {label}: lnacc stored 0.5, recomputed 1.0" in out and "randomized" not in out
    assert "2 row(s) at a time" in out and ", 1 differ, 0 stale" in out
