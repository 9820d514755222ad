"""Numbers in suite notes come from the records by reference (leaderboards/notes.py)."""
import json
import tomllib
from pathlib import Path

import pytest

from bench.run.spec import load_suite
from leaderboards.notes import NoteError, resolve
from tests.conftest import consistent


def _rec(scenario, defense, attack, metrics, status="ok", defense_params=None, details=None):
    schema = {"label_acc": {"unit": "", "fmt": "{:.3f}", "lower_is_better": False, "kind": "privacy",
                            "description": "label accuracy"},
              "psnr": {"unit": "dB", "fmt": "{:.1f}", "lower_is_better": False, "kind": "privacy",
                       "description": "PSNR"}}
    return consistent({"suite": "s", "scenario": scenario, "defense": defense, "defense_params": defense_params or {},
                       "attack": attack, "attack_params": {}, "status": status, "reason": "", "metrics": metrics,
                       "details": {"metric_schema": schema, **(details or {})}})


RECORDS = [_rec("a", "plaintext", "ilrg", {"label_acc": 1.0}),
           _rec("a", "maskcrypt", "ilrg", {"label_acc": 0.0625}, defense_params={"rho": 0.1}),
           _rec("a", "maskcrypt", "ilrg", {"label_acc": 0.5}, defense_params={"rho": 0.2}),
           _rec("b", "plaintext", "idlg", {"psnr": 38.71}, details={"psnr_ci95": [37.2, 40.0]}),
           _rec("b", "dp-fedavg", "idlg", {"psnr": None, "diverged_round": 3.0}, status="diverged")]


def test_a_reference_reads_the_value_as_the_table_writes_it():
    text = "iLRG reads {= a/plaintext/ilrg label_acc =} on plaintext and {=b/plaintext/idlg psnr=} " \
           "{= b/plaintext/idlg psnr ci =}; MaskCrypt {= a/maskcrypt(rho=0.1)/ilrg label_acc =}; " \
           "DP-FedAvg {= b/dp-fedavg/idlg status =}; {= b/*/idlg status =} is ambiguous"
    with pytest.raises(NoteError, match="names 2 cells"):
        resolve(text, RECORDS, "s")
    text = text.replace("; {= b/*/idlg status =} is ambiguous", "")
    assert resolve(text, RECORDS, "s") == ("iLRG reads 1.000 on plaintext and 38.71 [37.20, 40.00]; MaskCrypt "
                                           "0.062; DP-FedAvg diverged at round 3")   # psnr's format: the registry's


@pytest.mark.parametrize("ref, fault", [
    ("{= a/maskcrypt/ilrg label_acc =}", "names 2 cells"),
    ("{= a/plaintext/ilrg psnr =}", "reports no 'psnr'"),
    ("{= a/plaintext/ilrg label_acc ci =}", "no 95% interval"),
    ("{= a/plaintext/ilrg =}", "must read"),
])
def test_a_bad_reference_fails_the_render_in_one_line(ref, fault):
    with pytest.raises(NoteError, match=fault) as err:
        resolve(f"see {ref}.", RECORDS, "s")
    assert "\n" not in str(err.value) and "suite 's'" in str(err.value)


def test_a_reference_is_not_a_way_into_the_page():
    """A value is text; the notes then go through the sanitizer as before (leaderboards/safe.py)."""
    from leaderboards.safe import notes_html
    rec = _rec("a", "plaintext", "ilrg", {"label_acc": "<script>alert(1)</script>"})
    html = str(notes_html(resolve("x {= a/plaintext/ilrg label_acc =}", [rec], "s")))
    assert "<script>" not in html


def test_a_value_of_an_unverified_record_says_so():
    """The reading rule (bench/protocol/records.py): a page marks what it quotes from a record it cannot trust."""
    text = "{= a/plaintext/ilrg label_acc =} and {= b/plaintext/idlg psnr =}"
    assert resolve(text, RECORDS, "s", trusted=lambda r: r["scenario"] == "b") == "1.000 (unverified) and 38.71"


def test_a_cell_not_computed_yet_reads_so_and_a_reference_to_no_cell_is_refused_at_load():
    """A run narrowed by --only renders its page before the referenced cell exists; a reference that names no
    cell of the suite at all is a mistake of the suite file, refused when it loads (exit 2, one line)."""
    from bench.federation.scenario import SpecError
    from bench.run.spec import parse_suite

    assert resolve("secagg {= a/secagg/ilrg label_acc =}.", RECORDS, "s") == "secagg (not computed)."
    suite = {"name": "t", "scenarios": [{"name": "a", "dataset": "digits", "model": "mlp", "num_clients": 1,
                                         "clients_per_round": 1, "rounds": 1, "max_train": 20, "max_test": 10}],
             "defenses": [{"name": "plaintext"}], "attacks": [{"name": "ilrg"}]}
    parse_suite(suite | {"notes": "{= a/plaintext/ilrg label_acc =}"})
    for ref, fault in (("{= a/secagg/ilrg label_acc =}", "names 0 cells of the suite"),
                       ("{= a/*/* label_acc =}", None), ("{= */plaintext/ilrg =}", "must read")):
        if fault is None:
            parse_suite(suite | {"notes": ref})   # a glob that matches the one cell
            continue
        with pytest.raises(SpecError, match=fault) as err:
            parse_suite(suite | {"notes": ref})
        assert "\n" not in str(err.value)


def test_every_committed_suite_loads_and_its_notes_resolve_on_its_records():
    """A reference that names no cell, or a metric its record lacks, fails here, not first at `leakbench site`."""
    root = Path(__file__).resolve().parent.parent / "leaderboards"
    checked = 0
    for path in sorted((root / "suites").glob("*.toml")):
        results = root / "results" / path.stem / "results.json"
        notes = tomllib.loads(path.read_text()).get("notes", "")
        if "{=" not in notes or not results.is_file():
            continue
        load_suite(str(path))
        resolve(notes, json.loads(results.read_text()), path.stem)
        checked += 1
    assert checked >= 3
