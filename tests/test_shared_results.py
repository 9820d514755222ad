"""A results folder someone else computed, read as a reviewer reads it: copies of a tiny core folder (plaintext,
central DP-FedAvg and FedHE-Full against iDLG-extended, which recovers the labels, and one-step iDLG, which
recovers no image even without a defense), each altered the way a lab could alter what it sends. Each test is one
case of the reading rule (bench/protocol/records.py) and of what `site` checks before it writes."""
from __future__ import annotations

import copy
import json
import math
import re
from urllib.parse import urlsplit

import pytest
import torch

from bench.cli import main
from bench.protocol.records import DIGEST, RecordError, config_id, seal
from bench.run.store import Store
from tests.conftest import DP, copy_export as _copy, find_record as _find, tiny_suite



def _strip_and_edit(records: list[dict]) -> None:
    """Case 1: the digest removed and the headline label metrics set to 0.7123; the fingerprint still claims the
    running code."""
    rec = _find(records, f"{DP}/idlg-extended")
    del rec["environment"][DIGEST]
    rec["metrics"].update(lnacc=0.7123, label_acc=0.7123)


def test_1_a_record_stripped_of_its_digest_and_edited_is_greyed_and_kept_off_the_front_page(tiny_core, tmp_path):
    _copy(tiny_core, tmp_path / "core", _strip_and_edit)
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    front = (tmp_path / "index.html").read_text()
    assert "0.712" not in front
    page = (tmp_path / "core" / "index.html").read_text()
    assert "1 cell(s) unverified" in page
    table, greyed = page.split('<details class="unverified"', 1)
    assert "0.712" not in table and "0.712" in greyed.split("</details>", 1)[0]
    # the stored file keeps the record as it was: the page shows it, greyed, and judges nothing with it
    assert any(r["metrics"].get("lnacc") == 0.7123 for r in json.loads((tmp_path / "core" / "results.json").read_text()))


def test_1_compare_marks_an_unverified_record(tiny_core, tmp_path, capsys):
    _copy(tiny_core, tmp_path / "theirs", _strip_and_edit)
    assert main(["compare", str(tiny_core / "core"), str(tmp_path / "theirs")]) == 0
    assert "digits-tiny/dp-fedavg/idlg-extended [unverified]  lnacc: 1.0 -> 0.7123" in capsys.readouterr().out


def _old_schema(rec: dict) -> dict:
    """The record as the code before audit trials wrote it: no canary fields, its own cell id, sealed then."""
    old = copy.deepcopy(rec)
    for key in ("canary", "canary_norm"):
        del old["config"]["scenario"][key]
    old["cell_id"] = config_id(old["config"])
    return seal(old)


@pytest.mark.parametrize("tamper", ["edited after sealing", "digest removed and edited"])
def test_2_the_schema_upgrade_reseals_only_a_record_whose_digest_matches(tiny_core, tmp_path, capsys, tamper):
    genuine = _find(json.loads((tiny_core / "core" / "results.json").read_text()), f"{DP}/idlg-extended")
    old = _old_schema(genuine)
    if tamper != "edited after sealing":
        del old["environment"][DIGEST]
    old["metrics"]["lnacc"] = 0.25
    store = Store(tmp_path / "out" / "leakbench.sqlite")
    store.put(old)
    store.set_membership("core", [old["cell_id"]])
    store.close()
    code = main(["run", str(tiny_core / "core.toml"), "--out", str(tmp_path / "out"), "--only", f"{DP}/idlg-extended"])
    store = Store(tmp_path / "out" / "leakbench.sqlite")
    kept = {r["cell_id"]: r for r in store.records("core")}
    store.close()
    if tamper == "edited after sealing":     # refused, never laundered into a valid digest
        assert code == 2
        err = capsys.readouterr().err
        assert "does not match its digest" in err and "not upgraded" in err and len(err.strip().splitlines()) == 1
        assert list(kept) == [old["cell_id"]] and kept[old["cell_id"]]["metrics"]["lnacc"] == 0.25
    else:                                    # kept unsealed, so unverified and stale: the run recomputed it
        assert code == 0
        fresh = kept[genuine["cell_id"]]
        assert fresh["metrics"]["lnacc"] == 1.0 and fresh["environment"][DIGEST]


def test_2_adopt_leaves_an_edited_stored_record_as_it_was(tiny_core, tmp_path):
    from bench.run.spec import load_suite
    from bench.run.upgrade import adopt

    genuine = _find(json.loads((tiny_core / "core" / "results.json").read_text()), f"{DP}/idlg-extended")
    old = _old_schema(genuine)
    old["metrics"]["lnacc"] = 0.25
    store = Store(tmp_path / "leakbench.sqlite")
    store.put(old)
    store.set_membership("core", [old["cell_id"]])
    with pytest.raises(RecordError, match="does not match its digest"):
        adopt(store, "core", load_suite(str(tiny_core / "core.toml")).cells)
    assert store.state(genuine["cell_id"]) == "new"
    store.close()


HOSTILE = ["JavaScript:alert(document.domain)%2F%2F", "data:text,x", "q\"u'o<te>", "x..%2F..%2Fy", "javascript:%2F%2Fa"]


class _Links:
    """Every href and src of a page as a browser would read it."""

    def __init__(self, html: str):
        from html.parser import HTMLParser

        self.urls: list[str] = []

        class Parser(HTMLParser):
            def handle_starttag(parser, tag, attrs):
                self.urls += [v or "" for k, v in attrs if k in ("href", "src")]
        Parser(convert_charrefs=True).feed(html)


def _live(url: str) -> bool:
    """A link a browser would follow anywhere but over http(s) or to a relative path of the site."""
    text = re.sub(r"[\x00-\x20]", "", url)
    if text.startswith("#") or text.startswith("data:image/png;base64,"):
        return False
    scheme = urlsplit(text).scheme.lower()
    return scheme not in ("", "http", "https") or text.startswith("//") or "\\" in text


def test_3_no_folder_name_becomes_a_live_link_or_takes_the_core_grid(tiny_core, tmp_path):
    _copy(tiny_core, tmp_path / "core")
    for name in HOSTILE:
        _copy(tiny_core, tmp_path / name)
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    pages = [tmp_path / "index.html"] + [tmp_path / n / "index.html" for n in ["core", *HOSTILE]]
    for page in pages:
        live = [u for u in _Links(page.read_text()).urls if _live(u)]
        assert not live, f"{page}: {live[:3]}"
    front = (tmp_path / "index.html").read_text()
    grid = front[front.index('id="core"'):front.index('id="board"')]
    assert 'href="core/index.html#core--digits-tiny"' in grid       # the core grid is the folder named core
    assert 'href="JavaScript%3Aalert%28document.domain%29%252F%252F/index.html"' in front   # listed, encoded


def _cells(page: str, defense: str) -> str:
    """The table row of one defense on a suite page (its cells' text)."""
    row = page[page.index(f'<span class="nm">{defense}</span>'):]
    return row[:row.index("</tr>")]


def test_4_calibration_comes_from_the_records_and_fails_closed(tiny_core, tmp_path):
    """Core's records under another suite name without pages.json calibrate as on the core page; records that do
    not say which row is undefended give no verdict at all."""
    _copy(tiny_core, tmp_path / "core")
    _copy(tiny_core, tmp_path / "copy", suite="copy", pages=False)

    def older(records):   # records from before they stored the row's role, sealed as their code sealed them
        for rec in records:
            rec["details"].pop("undefended", None)
            seal(rec)
    _copy(tiny_core, tmp_path / "older", older, suite="older", pages=False)
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    core, copied, old = ((tmp_path / n / "index.html").read_text() for n in ("core", "copy", "older"))
    assert core.count(">no verdict<") == copied.count(">no verdict<") > 0
    assert "image not recovered" not in _cells(copied, "dp-fedavg")      # one-step iDLG fails on plaintext
    assert "labels recovered" in _cells(copied, "dp-fedavg")            # iDLG-extended breaks it: judged
    assert "labels recovered" not in _cells(old, "dp-fedavg") and ">no verdict<" in _cells(old, "dp-fedavg")
    assert "do not say which row is undefended" in old


def test_4_the_upgrade_fills_in_the_undefended_row_of_a_builtin_defense():
    from bench.run.upgrade import fill
    for name, params, role in (("plaintext", {}, True), ("fedhe-full", {}, False), ("flex-lora", {"sigma": 0.0}, True),
                               ("flex-lora", {"sigma": 0.01}, False)):
        assert fill({"defense": name, "defense_params": params, "details": {}})["details"]["undefended"] is role


def _flipped(records: list[dict]) -> None:
    """Case 5: a digest-less record, placed first, whose schema snapshot reads psnr, ssim and lpips the other way
    round."""
    blocked = _find(records, "digits-tiny/fedhe-full/idlg(steps=1)")
    records.remove(blocked)
    del blocked["environment"][DIGEST]
    from bench.registry import METRICS
    for name in ("psnr", "ssim", "lpips"):
        entry = METRICS.get(name).snapshot()
        blocked["details"]["metric_schema"][name] = {**entry, "lower_is_better": not entry["lower_is_better"]}
    records.insert(0, blocked)


def test_5_no_record_turns_a_metric_round_for_the_others(tiny_core, tmp_path):
    _copy(tiny_core, tmp_path / "core", _flipped)
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    page = (tmp_path / "core" / "index.html").read_text()
    assert "image recovered" not in _cells(page, "dp-fedavg") and ">no verdict<" in _cells(page, "dp-fedavg")


def test_5_a_metric_no_installed_code_defines_must_read_one_way_in_every_record(tiny_core, tmp_path, capsys):
    from bench.evaluation.schema import schema_of

    def custom(records):
        for i, rec in enumerate(records[:2]):
            rec["metrics"]["custom_leak"] = 0.5
            rec["details"]["metric_schema"]["custom_leak"] = {"unit": "", "kind": "privacy",
                                                              "lower_is_better": i == 0}
            seal(rec)
    folder = _copy(tiny_core, tmp_path / "core", custom)
    with pytest.raises(ValueError, match="'custom_leak' reads two ways") as err:
        schema_of(json.loads((folder / "results.json").read_text()))
    assert "\n" not in str(err.value)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 2
    assert "reads two ways" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def _std(target) -> float:
    values = torch.cat([v[~torch.isnan(v)].reshape(-1) for v in target.view.values.values()])
    return float(values.std())


@pytest.mark.parametrize("attack_round", [0, 1])
def test_6_the_malicious_exchange_runs_the_honest_rounds_cohort(attack_round):
    """Local DP's noise on the attacked upload is z*C/sqrt(m) for the round's m = 4 clients under the modified
    model as under the honest one, in any attacked round (the ledger stands at that round)."""
    from bench.run.cells import federate
    from bench.run.preflight import preflight

    suite = tiny_suite([("dp-fedavg-local", {"noise_multiplier": 1.0, "clip": 1e-3})], [("imprint", {"bins": 16})],
                       num_clients=4, clients_per_round=4, rounds=attack_round + 1, attack_round=attack_round,
                       attack_batch_size=4, max_train=160)
    cells = list(preflight(suite, None).cells)
    run = federate(cells[0], None, group=cells)
    modified = run.modified[cells[0].attack.label]
    assert not isinstance(modified, Exception), modified
    expected = 1.0 * 1e-3 / math.sqrt(4)
    assert _std(run.targets[0]) == pytest.approx(expected, rel=0.05)
    assert _std(modified[0]) == pytest.approx(expected, rel=0.05)


BAD_FIGURES = [("[NaN]", "a figure must be a table"), ('["a"]', "a figure must be a table"),
               ("[1]", "a figure must be a table"), ('[{"x": "lnacc", "y": [1]}]', "y must be text"),
               ('[{"x": "rounds_to_leak", "y": "lnacc"}]', "names nothing this suite records"),
               ('{"x": "lnacc"}', "figures is dict, not a list")]


@pytest.mark.parametrize("figures, phrase", BAD_FIGURES, ids=[b[0] for b in BAD_FIGURES])
def test_7_site_checks_every_pages_json_figure_before_it_writes_anything(tiny_core, tmp_path, capsys, figures, phrase):
    _copy(tiny_core, tmp_path / "a-good", pages=False)       # a folder without pages.json: nothing may be added
    bad = _copy(tiny_core, tmp_path / "b-bad", suite="bad", pages=False)
    (bad / "pages.json").write_text('{"bad": {"description": "a copy", "figures": ' + figures + "}}")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "b-bad" in err and phrase in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
