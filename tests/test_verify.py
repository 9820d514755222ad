"""`leakbench verify`: a folder's cells recomputed from their stored configs and compared metric by metric, end to
end on the tiny core suite (tests/conftest.py), and `site --verify` publishing only what reproduces."""
from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.protocol.records import DIGEST, fingerprint_of, seal
from bench.run.verify import Tolerance, choose, differences, rebuild
from tests.conftest import DP, copy_export, find_record


def _forge(label: str, **metrics):
    """A forgery only a recomputation catches: metrics edited and the digest recomputed."""
    def edit(records):
        rec = find_record(records, label)
        rec["metrics"].update(metrics)
        seal(rec)
    return edit


def test_a_genuine_row_reproduces_and_a_resealed_forgery_differs(tiny_core, tmp_path, capsys):
    folder = copy_export(tiny_core, tmp_path / "sent", _forge(f"{DP}/idlg-extended", lnacc=0.5))
    assert main(["verify", str(folder), "--only", f"{DP}/*", "--sample", "all"]) == 1
    out = capsys.readouterr().out
    assert f"differs     {DP}/idlg-extended: lnacc stored 0.5, recomputed 1.0" in out
    assert f"reproduced  {DP}/idlg(steps=1)" in out
    assert "2 of 6 cell(s) selected" in out and "1 reproduced, 1 differ, 0 stale" in out
    assert main(["verify", str(copy_export(tiny_core, tmp_path / "genuine")), "--sample", "all"]) == 0
    assert "6 reproduced, 0 differ, 0 stale" in capsys.readouterr().out
    # recomputed with the torch threads each record says computed it: the order of its float reductions
    assert all(isinstance(r["environment"]["threads"], int) for r in json.loads((folder / "results.json").read_text()))


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
    assert "0 reproduced, 0 differ, 1 stale" in out     # the sampled cell is its row's headline cell
    assert main(["verify", str(folder), "--only", f"{DP}/idlg-extended", "--force"]) == 0
    assert "1 reproduced, 0 differ, 0 stale" in capsys.readouterr().out


def test_the_sample_is_seeded_and_brings_each_rows_headline_cell(tiny_core):
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    cells = {r["cell_id"]: rebuild(r) for r in records}
    assert all(c is not None and c.cell_id == cid for cid, c in cells.items())
    chosen, drawn = choose(records, cells, 1, None, seed=3)
    again, _ = choose(records, cells, 1, None, seed=3)
    assert drawn == 1 and [r["cell_id"] for r in chosen] == [r["cell_id"] for r in again]
    rows = {(r["scenario"], r["defense"]) for r in chosen}
    assert len(rows) == 1 and 1 <= len(chosen) <= 2
    ok = [r for r in chosen if r["status"] == "ok"]
    assert not ok or any(r["attack"] == "idlg-extended" for r in ok)   # the row's verdict rests on its labels


def _pair(name, stored, recomputed, **schema):
    entry = {"unit": "", "kind": "privacy", "lower_is_better": True} | schema
    def rec(value, ci=None):
        return {"status": "ok", "reason": "", "metrics": {name: value},
                "details": {"family": "image", "metric_schema": {name: entry}} | ({f"{name}_ci95": ci} if ci else {})}
    return rec(*stored), rec(*recomputed)


@pytest.mark.parametrize("name, stored, recomputed, schema, agree", [
    ("psnr", (20.0,), (20.01,), {}, True), ("psnr", (20.0,), (20.1,), {}, False),   # 1e-3 relative
    ("upload_bytes", (1000.0,), (1000.5,), {"unit": "B"}, False),                    # a count: exact
    ("wall_s", (1.0,), (9.0,), {"timing": True}, True),                              # never compared
    ("mia_auroc", (0.70, [0.60, 0.80]), (0.72, [0.62, 0.82]), {}, True),             # inside the recomputed interval
    ("mia_auroc", (0.95, [0.60, 0.80]), (0.72, [0.62, 0.82]), {}, False),            # the stored value outside it
    ("note", ("unavailable: x",), ("unavailable: x",), {}, True),
])
def test_each_metric_is_compared_at_its_tolerance(name, stored, recomputed, schema, agree):
    a, b = _pair(name, stored, recomputed, **schema)
    assert (differences(a, b, Tolerance()) == []) is agree


def test_tolerances_parse_and_a_bad_one_is_refused(tiny_core, capsys):
    tol = Tolerance.parse(["1e-2", "psnr=0.5"])
    assert tol.relative == 0.01 and tol.per_metric == {"psnr": 0.5}
    assert main(["verify", str(tiny_core / "core"), "--tolerance", "psnr=lots"]) == 2
    assert "--tolerance 'psnr=lots'" in capsys.readouterr().err


def test_site_verify_publishes_what_reproduces_and_refuses_a_forgery(tiny_core, tmp_path, capsys):
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    chosen, _ = choose(records, {r["cell_id"]: rebuild(r) for r in records}, 1, None, seed=0)
    stripped = chosen[0]["cell_id"]

    def strip(recs):   # a genuine record without its digest: unverified until verify reproduces it
        del next(r for r in recs if r["cell_id"] == stripped)["environment"][DIGEST]
    copy_export(tiny_core, tmp_path / "site" / "core", strip)
    assert main(["site", str(tmp_path / "site"), "--date", "2026-01-01", "--verify", "1"]) == 0
    page = (tmp_path / "site" / "core" / "index.html").read_text()
    assert f"verified: {len(chosen)} of 6 cells recomputed" in page and 'class="unverified' not in page
    def inflate(recs):   # the sampled record's upload size edited and resealed
        rec = next(r for r in recs if r["cell_id"] == stripped)
        rec["metrics"]["upload_bytes"] += 1
        seal(rec)
    forged = copy_export(tiny_core, tmp_path / "forged" / "core", inflate)
    before = {p: p.read_bytes() for p in forged.rglob("*")}
    assert main(["site", str(tmp_path / "forged"), "--verify", "1"]) == 1
    assert "nothing was published" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in forged.rglob("*")} == before and not (tmp_path / "forged" / "index.html").exists()
