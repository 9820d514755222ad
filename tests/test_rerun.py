"""Stale results: a rerun after a code change recomputes; --force, --only, --dry-run; failures are shown."""
import json

import pytest

import bench.run.version
from bench.cli import main
from bench.protocol.attack import Attack
from bench.protocol.records import fingerprint_of
from bench.registry import ATTACKS
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from bench.run.store import Store
from tests.conftest import tiny_suite


def _fingerprints(out):
    store = Store(out / "leakbench.sqlite")
    try:
        return {r["attack"]: r["environment"]["fingerprint"] for r in store.records()}
    finally:
        store.close()


def test_rerun_after_a_code_change_recomputes(tmp_path, monkeypatch):
    suite = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False})])
    assert run_suite(suite, tmp_path).ok == 1
    store = Store(tmp_path / "leakbench.sqlite")
    (env,) = [r["environment"] for r in store.records()]
    store.close()
    assert env["fingerprint"] == fingerprint_of(env["components"])   # what it used, the config's included
    assert bench.run.version.cell_components(suite.cells[0]).items() <= env["components"].items()
    assert run_suite(suite, tmp_path).skipped == 1
    before = _fingerprints(tmp_path)["idlg"]
    monkeypatch.setattr(bench.run.version, "harness_hash", lambda root=None: "0000changedcode")
    again = run_suite(suite, tmp_path)
    assert (again.ok, again.skipped, again.stale) == (1, 0, 1)
    assert _fingerprints(tmp_path)["idlg"] not in (before, None)


def test_force_only_and_dry_run(tmp_path, capsys):
    suite = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False}), "random-guess"])
    plan = run_suite(suite, tmp_path, dry_run=True)
    assert [state for _, state in plan.plan] == ["new", "new"]
    assert not (tmp_path / "leakbench.sqlite").exists() or not Store(tmp_path / "leakbench.sqlite").records()
    only = run_suite(suite, tmp_path, only="*/random-guess")
    assert (only.ok, only.skipped) == (1, 0)
    plan = run_suite(suite, tmp_path, dry_run=True)
    # the group (plaintext) has a missing cell, so its done cell reruns with it: one federated run per group
    assert dict(plan.plan) == {"tiny/plaintext/idlg(reconstruct=False)": "new", "tiny/plaintext/random-guess": "group"}
    forced = run_suite(suite, tmp_path, force=True, only="random-guess")
    assert (forced.ok, forced.skipped) == (1, 0)


def test_only_glob_matches_names_without_parameters(tmp_path, capsys):
    suite = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False}), "random-guess"])
    plan = run_suite(suite, tmp_path, dry_run=True, only="*/idlg")
    assert [label for label, _ in plan.plan] == ["tiny/plaintext/idlg(reconstruct=False)"]
    with pytest.raises(ValueError, match=r"selects none of the 2 cells.*did you mean 'tiny/plaintext/idlg"):
        run_suite(suite, tmp_path, dry_run=True, only="*/idlg(reconstruct=True)")   # selects nothing: refused


def test_cli_dry_run_runs_nothing(tmp_path, capsys):
    assert main(["run", "smoke", "--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "run (new)" in out and "digits-lenet-smoke/plaintext/idlg(steps=10)" in out and "nothing was run" in out
    assert not (tmp_path / "index.html").exists() and not (tmp_path / "leakbench.sqlite").exists()


class _Broken(Attack):
    """always raises: a failing cell"""
    family = "label"

    def run(self, view, knowledge, seed):
        raise RuntimeError("deliberately broken for the test")


@pytest.fixture
def broken_attack():
    ATTACKS.add("broken", _Broken)
    yield "broken"
    ATTACKS._entries.pop("broken", None)


def test_failures_are_on_the_page_and_printed(tmp_path, capsys, broken_attack):
    suite_file = tmp_path / "s.toml"
    suite_file.write_text('name = "withfail"\n[[scenarios]]\nname = "tiny"\ndataset = "digits"\nmodel = "mlp"\n'
                          'num_clients = 2\nclients_per_round = 2\nrounds = 1\nmax_train = 120\nmax_test = 60\n'
                          '[[defenses]]\nname = "plaintext"\n[[attacks]]\nname = "broken"\n')
    assert main(["run", str(suite_file), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "failed: tiny/plaintext/broken: RuntimeError: deliberately broken for the test" in err
    page = (tmp_path / "o" / "index.html").read_text()
    assert page.count("RuntimeError: deliberately broken for the test") >= 2  # in its table cell and the list
    rec = json.loads((tmp_path / "o" / "results.json").read_text())[0]
    assert rec["status"] == "failed"


def test_code_fingerprint_covers_every_result_package(tmp_path):
    """It hashes the files of bench/, defenses/, attacks/ and metrics/, and an edit to any of them changes it."""
    import hashlib
    import shutil

    from bench.run.version import RESULT_PACKAGES, ROOT, code_fingerprint
    assert code_fingerprint() != hashlib.sha256().hexdigest()[:16]   # not the hash of no file at all
    for package in RESULT_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    previous = code_fingerprint(str(tmp_path))
    assert previous == code_fingerprint()
    for package in RESULT_PACKAGES:
        (tmp_path / package / "__init__.py").write_text((tmp_path / package / "__init__.py").read_text() + "\n")
        code_fingerprint.cache_clear()
        changed = code_fingerprint(str(tmp_path))
        assert changed != previous, package
        previous = changed


def _export(out):
    from leaderboards.render import write_outputs

    store = Store(out / "leakbench.sqlite")
    write_outputs(store, out)
    store.close()
    (out / "leakbench.sqlite").unlink()   # what a clone of a committed leaderboard holds: the export alone


def test_a_committed_export_resumes_where_it_stands(tmp_path):
    """A directory with results.json but no store is seeded from it: only the missing cell runs, and the
    exported cell stays on the page with its numbers and fingerprint."""
    first = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False})])
    assert run_suite(first, tmp_path).ok == 1
    _export(tmp_path)
    before = {r["cell_id"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    grown = tiny_suite(["plaintext", "fedhe-full"], [("idlg", {"reconstruct": False})])
    plan = run_suite(grown, tmp_path, dry_run=True)
    assert (plan.seeded, sorted(state for _, state in plan.plan)) == (1, ["done", "new"])
    assert not (tmp_path / "leakbench.sqlite").exists()          # a dry run writes nothing
    summary = run_suite(grown, tmp_path)
    assert (summary.seeded, summary.skipped, summary.ok + summary.blocked) == (1, 1, 1)
    store = Store(tmp_path / "leakbench.sqlite")
    try:
        records = {r["cell_id"]: r for r in store.records("tiny")}
    finally:
        store.close()
    assert len(records) == 2
    (cid, old), = before.items()
    assert records[cid]["metrics"] == old["metrics"]
    assert records[cid]["environment"]["fingerprint"] == old["environment"]["fingerprint"]


def test_reuse_copies_cells_computed_by_this_code(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    suite = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False}), "random-guess"])
    assert run_suite(suite, a).ok == 2
    other = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False})], name="other")
    plan = run_suite(other, b, reuse=[a], dry_run=True)
    assert dict(plan.plan) == {"tiny/plaintext/idlg(reconstruct=False)": "done"} and plan.reused == 1
    summary = run_suite(other, b, reuse=[a])
    assert (summary.reused, summary.skipped, summary.ok) == (1, 1, 0)
    monkeypatch.setattr(bench.run.version, "harness_hash", lambda root=None: "0000changedcode")
    c = tmp_path / "c"
    summary = run_suite(other, c, reuse=[a])   # computed by other code: recomputed, not copied
    assert (summary.reused, summary.ok) == (0, 1)


def test_a_reuse_directory_without_results_is_refused_before_anything_is_written(tmp_path, capsys):
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), "--reuse", str(tmp_path / "none")]) == 2
    assert "--reuse" in capsys.readouterr().err
    assert not (tmp_path / "o" / "leakbench.sqlite").exists()
    for force in (False, True):   # --force copies nothing, but a wrong directory is still named
        with pytest.raises(ValueError, match="neither leakbench.sqlite nor results.json"):
            run_suite(load_suite("smoke"), tmp_path / "p", reuse=[tmp_path / "none"], force=force)
    assert not (tmp_path / "p" / "leakbench.sqlite").exists()


@pytest.mark.parametrize("text, fault", [("{not json", "not valid JSON"), ('{"a": 1}', "not a list of records"),
                                         ('[{"cell_id": "x"}]', "record 0 lacks suite")])
def test_a_broken_export_is_refused_before_anything_is_written(tmp_path, capsys, text, fault):
    (tmp_path / "results.json").write_text(text)
    assert main(["run", "smoke", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fault in err and "results.json" in err
    assert not (tmp_path / "leakbench.sqlite").exists()


def test_records_the_suite_no_longer_holds_are_named_not_dropped_silently(tmp_path):
    """A suite whose scenario changed leaves its old cells out of the pages, says how many, and keeps them stored."""
    suite = tiny_suite(["plaintext"], ["random-guess"])
    assert run_suite(suite, tmp_path).ok == 1
    changed = tiny_suite(["plaintext"], ["random-guess"], lr=0.05)
    assert changed.name == suite.name and changed.cells[0].cell_id != suite.cells[0].cell_id
    assert run_suite(changed, tmp_path, dry_run=True).retired == 1
    summary = run_suite(changed, tmp_path)
    assert (summary.ok, summary.retired) == (1, 1)
    store = Store(tmp_path / "leakbench.sqlite")
    try:
        assert store.members(suite.name) == [changed.cells[0].cell_id]
        assert store.finished(suite.cells[0].cell_id)   # kept in the store
    finally:
        store.close()


def test_records_of_an_older_scenario_schema_are_kept_as_todays_cells(tmp_path):
    """An export written before the canary fields existed (and with mia_size 0 for "no membership inference")
    resumes as the same cells, marked with the id they were computed under; a record whose work differs is not
    adopted, and a membership attack's mia_size 0 is never rewritten."""
    from bench.protocol.records import config_id, seal
    from bench.run.upgrade import UPGRADED, upgrade
    from bench.evaluation.exports import write_exports

    suite = tiny_suite(["plaintext"], ["random-guess"])
    run_suite(suite, tmp_path / "new")
    store = Store(tmp_path / "new" / "leakbench.sqlite")
    try:
        rec, info = store.records(suite.name)[0], store.suite_info(suite.name)
    finally:
        store.close()
    old = json.loads(json.dumps(rec))
    for name in ("canary", "canary_norm", "canaries"):
        del old["config"]["scenario"][name]
    old["config"]["scenario"]["mia_size"] = 0
    old["cell_id"] = config_id(old["config"])
    other = json.loads(json.dumps(old))
    other["config"]["scenario"]["lr"] = 0.5   # different work: never adopted
    other["cell_id"] = config_id(other["config"])
    (tmp_path / "old").mkdir()
    write_exports([seal(old), seal(other)], {suite.name: info}, tmp_path / "old")

    summary = run_suite(suite, tmp_path / "old", dry_run=True)
    assert (summary.upgraded, summary.retired, summary.skipped) == (1, 1, 1)   # same code: done, not rerun
    summary = run_suite(suite, tmp_path / "old")
    assert (summary.upgraded, summary.retired, summary.ok) == (1, 1, 0)
    store = Store(tmp_path / "old" / "leakbench.sqlite")
    try:
        (kept,) = store.records(suite.name)
    finally:
        store.close()
    assert kept["cell_id"] == suite.cells[0].cell_id and kept["details"][UPGRADED] == old["cell_id"]
    assert kept["metrics"] == rec["metrics"]
    mia = {"scenario": {"name": "s", "mia_size": 0}, "attack": {"name": "mia-loss"}}
    assert upgrade(mia)["scenario"]["mia_size"] == 0 and "canary" in upgrade(mia)["scenario"]
