"""A suite that extends another (bench/run/inherit.py): it inherits the base's grid, adds its own rows, and with
the base's exported records at hand computes only what it adds."""
import json

import pytest

from bench.cli import main
from bench.federation.scenario import SpecError
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from bench.run.store import Store

BASE = '''name = "base-eval"
description = "a small standard evaluation"
[[scenarios]]
name = "tiny"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 120
max_test = 60
attacks = ["random-guess"]
[[scenarios]]
name = "tiny2"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 100
max_test = 60
[[defenses]]
name = "plaintext"
[[defenses]]
name = "fedhe-full"
[[attacks]]
name = "random-guess"
[[attacks]]
name = "idlg"
params = { reconstruct = false }
scenarios = ["tiny2"]
'''

EXTENDED = '''name = "base-plus-pruning"
extends = "base.toml"
[[defenses]]
name = "gradient-pruning"
params = { p = 0.5 }
'''


@pytest.fixture
def suites(tmp_path):
    (tmp_path / "base.toml").write_text(BASE)
    (tmp_path / "mine.toml").write_text(EXTENDED)
    return tmp_path


def test_the_extension_inherits_the_grid_and_adds_its_row(suites):
    base, mine = load_suite(suites / "base.toml"), load_suite(suites / "mine.toml")
    assert {c.cell_id for c in base.cells} < {c.cell_id for c in mine.cells}
    added = [c for c in mine.cells if c.cell_id not in {b.cell_id for b in base.cells}]
    assert {c.defense.label for c in added} == {"gradient-pruning(p=0.5)"}
    # the new row joins a scenario whose attacks list narrows (tiny) and one that does not (tiny2)
    assert sorted((c.scenario.name, c.attack.name) for c in added) == [("tiny", "random-guess"), ("tiny2", "idlg"),
                                                                       ("tiny2", "random-guess")]
    info = mine.page_info()
    assert info["extends"] == "base-eval" and info["added"] == ["gradient-pruning(p=0.5)"]
    assert "extends" not in base.page_info()


def test_an_extension_computes_only_its_cells_against_the_base_export(suites, tmp_path, capsys):
    from leaderboards.render import write_outputs

    committed = tmp_path / "committed"
    assert run_suite(load_suite(suites / "base.toml"), committed).failed == 0
    store = Store(committed / "leakbench.sqlite")
    write_outputs(store, committed)
    store.close()
    (committed / "leakbench.sqlite").unlink()   # what a checkout holds: the export alone
    mine = load_suite(suites / "mine.toml")
    plan = run_suite(mine, tmp_path / "out", reuse=[committed], dry_run=True)
    new = {label for label, state in plan.plan if state != "done"}
    assert new == {c.label for c in mine.cells if c.defense.name == "gradient-pruning"}
    summary = run_suite(mine, tmp_path / "out", reuse=[committed])
    assert summary.reused == 6 and summary.ok + summary.blocked == 3
    records = json.loads((committed / "results.json").read_text())
    store = Store(tmp_path / "out" / "leakbench.sqlite")
    try:
        copied = {r["cell_id"]: r for r in store.records() if r["defense"] != "gradient-pruning"}
        write_outputs(store, tmp_path / "out")
    finally:
        store.close()
    assert {r["cell_id"]: r["metrics"] for r in records} == {k: r["metrics"] for k, r in copied.items()}
    page = (tmp_path / "out" / "index.html").read_text()   # the added row is marked on its page, no other
    marked = [row for row in page.split("<tr>") if 'class="added"' in row]
    assert marked and all('<span class="nm">gradient-pruning</span>' in row for row in marked)


@pytest.mark.parametrize("text, fault", [
    ('name = "x"\nextends = "no-such-suite"\n', "neither a built-in suite"),
    ('name = "base-eval"\nextends = "base.toml"\n[[defenses]]\nname = "secagg"\n', "a name of its own"),
    ('name = "x"\nextends = "base.toml"\n[[scenarios]]\nname = "tiny"\ndataset = "digits"\nmodel = "mlp"\n',
     "already the base suite"),
    ('name = "x"\nextends = "base.toml"\n[[defenses]]\nname = "plaintext"\n', "adds no cell"),
    ('name = "x"\nextends = 3\n', "must name a suite"),
])
def test_a_bad_extension_is_refused_in_one_line(suites, text, fault):
    (suites / "bad.toml").write_text(text)
    with pytest.raises(SpecError, match=fault) as err:
        load_suite(suites / "bad.toml")
    assert "\n" not in str(err.value)


def test_extending_an_extension_is_refused(suites):
    (suites / "third.toml").write_text('name = "third"\nextends = "mine.toml"\n[[defenses]]\nname = "secagg"\n')
    with pytest.raises(SpecError, match="itself extends"):
        load_suite(suites / "third.toml")


def test_the_cli_dry_run_says_what_the_extension_runs(suites, tmp_path, capsys):
    assert main(["run", str(suites / "mine.toml"), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "base-plus-pruning: 9 cell(s)" in out and "gradient-pruning(p=0.5)" in out


def test_a_new_setting_joins_a_narrowed_scenario_without_the_bases_row_of_that_name(suites):
    """tiny3 narrows its defenses to plaintext, so the base's gradient-pruning(p=0.3) does not run there; the
    extension's gradient-pruning(p=0.5) joins tiny3 alone, not the base's row of the same name."""
    base = BASE.replace('[[defenses]]\nname = "plaintext"', '''[[scenarios]]
name = "tiny3"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 80
max_test = 60
defenses = ["plaintext"]
[[defenses]]
name = "plaintext"
[[defenses]]
name = "gradient-pruning"
params = { p = 0.3 }''', 1)
    (suites / "base.toml").write_text(base)
    base_suite, mine = load_suite(suites / "base.toml"), load_suite(suites / "mine.toml")
    assert {c.defense.label for c in base_suite.cells if c.scenario.name == "tiny3"} == {"plaintext"}
    assert {c.defense.label for c in mine.cells if c.scenario.name == "tiny3"} == {"plaintext", "gradient-pruning(p=0.5)"}
