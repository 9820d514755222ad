"""A cell's fingerprint covers what can change its numbers and nothing else (bench/run/version.py): the harness,
and its own defense, attack, dataset and model with what they import. Edits are made in a copy of the tree."""
import json
import shutil
import subprocess
import sys

import pytest

from bench.run import closure, version
from bench.run.spec import load_suite
from bench.run.version import ROOT, cell_components, cell_fingerprint, harness_modules, stale_components


@pytest.fixture(scope="module")
def core_cells():
    return load_suite("core").cells


@pytest.fixture
def tree(tmp_path):
    for package in ("bench", "defenses", "attacks", "metrics", "leaderboards"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "results"))
    return tmp_path


def _components(cells, root):
    """Computed afresh: the hashes are cached per process, which never sees its own tree change."""
    for cached in (version.component_hash, version.harness_hash, version.harness_modules, closure._imports):
        cached.cache_clear()
    return {c.label: cell_components(c, plugins={}, root=str(root)) for c in cells}


def _edit(path):
    path.write_text(path.read_text() + "\n# edited\n")


def _stale(before, after):
    return {label for label in before if before[label] != after[label]}


def test_the_copy_gives_the_same_components(core_cells, tree):
    assert _components(core_cells, tree) == _components(core_cells, ROOT)


def test_editing_one_attack_stales_only_that_attacks_cells(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "attacks" / "labels" / "ilrg.py")
    after = _components(core_cells, tree)
    stale = _stale(before, after)
    assert stale and stale == {c.label for c in core_cells if c.attack.name == "ilrg"}
    assert {k for label in stale for k in stale_components(before[label], after[label])} == {"attack"}


def test_editing_one_defense_stales_only_its_rows(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "defenses" / "selectiveshield.py")
    stale = _stale(before, _components(core_cells, tree))
    assert stale and stale == {c.label for c in core_cells if c.defense.name == "selectiveshield"}


def test_a_defense_that_imports_another_is_staled_by_it(core_cells, tree):
    """SenseCrypt's baselines import MaskCrypt's union (defenses/sensecrypt/baselines.py)."""
    before = _components(core_cells, tree)
    _edit(tree / "defenses" / "maskcrypt.py")
    stale = _stale(before, _components(core_cells, tree))
    assert stale and stale == {c.label for c in core_cells if c.defense.name in ("maskcrypt", "sensecrypt")}


def test_a_module_a_defense_imports_is_part_of_it(core_cells, tree):
    """The DP defenses import the accountant (bench/federation/accounting.py): editing it stales their rows."""
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "federation" / "accounting.py")
    stale = _stale(before, _components(core_cells, tree))
    accounted = ("dp-fedavg", "dp-fedavg-local", "dp-sgd", "selectiveshield", "sensecrypt")   # defenses/dp.py,
    # dpsgd.py, selectiveshield.py, and SenseCrypt, whose package accounts its DP variant's noise
    # (defenses/sensecrypt/clustering.py)
    assert stale and stale == {c.label for c in core_cells if c.defense.name in accounted}


def test_editing_a_dataset_module_stales_only_its_datasets(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "data" / "text.py")
    stale = _stale(before, _components(core_cells, tree))
    text = {"sst2-sentences-cls", "sst2-sentences-cls-smollm2", "rt-polarity-smollm2", "sst2-cls-smollm2"}
    assert stale and stale == {c.label for c in core_cells if c.scenario.dataset in text}


@pytest.mark.parametrize("harness_file", [("bench", "federation", "engine.py"), ("metrics", "images.py"),
                                          ("bench", "protocol", "view.py")])
def test_editing_the_harness_stales_every_cell(core_cells, tree, harness_file):
    before = _components(core_cells, tree)
    _edit(tree.joinpath(*harness_file))
    after = _components(core_cells, tree)
    assert _stale(before, after) == set(before)
    assert all(stale_components(before[k], after[k]) == ["harness"] for k in before)


@pytest.mark.parametrize("renders_only", [("leaderboards", "grid.py"), ("bench", "run", "spec.py"),
                                          ("bench", "cli.py")])
def test_what_only_renders_or_identifies_a_cell_stales_nothing(core_cells, tree, renders_only):
    before = _components(core_cells, tree)
    _edit(tree.joinpath(*renders_only))
    assert _components(core_cells, tree) == before


def test_the_harness_holds_the_engine_and_every_metric_but_no_plugin_module():
    modules = harness_modules()
    assert {"bench.federation.engine", "bench.run.cells", "metrics.images", "metrics.text"} <= modules
    assert not any(m.split(".")[0] in ("defenses", "attacks", "leaderboards") for m in modules)
    assert "bench.data.vision" not in modules and "bench.models.text" not in modules   # a dataset's, a model's


def test_the_same_tree_gives_the_same_fingerprints_in_two_processes(core_cells):
    script = ("import json; from bench.run.spec import load_suite; from bench.run.version import cell_fingerprint; "
              "print(json.dumps({c.label: cell_fingerprint(c) for c in load_suite('core').cells}))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      env={"PYTHONHASHSEED": str(seed), "PATH": ""}, cwd=ROOT).stdout)
            for seed in (1, 2)]
    assert runs[0] == runs[1] == {c.label: cell_fingerprint(c) for c in core_cells}


def test_a_page_names_the_component_that_made_a_cell_stale(tmp_path, monkeypatch):
    from bench.run.runner import run_suite
    from bench.run.store import Store
    from leaderboards.render import code_state
    from tests.conftest import tiny_suite

    suite = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False}), "random-guess"])
    assert run_suite(suite, tmp_path).ok == 2
    store = Store(tmp_path / "leakbench.sqlite")
    records = store.records()
    store.close()
    assert list(version.staleness(records).values()) == [[], []]
    assert code_state(records, version.staleness(records))["stale_cells"] == 0
    real = version.component_hash
    monkeypatch.setattr(version, "component_hash",
                        lambda modules, root=str(ROOT): "edited" if "attacks.labels.baselines" in modules
                        else real(modules, root))
    stale = version.staleness(records)
    assert sorted(stale.values()) == [[], ["attack"]]
    state = code_state(records, stale)
    assert state["stale_cells"] == 1 and state["stale"] == [{"component": "attack random-guess",
                                                           "cells": ["tiny/plaintext/random-guess"]}]
    old = [{**r, "environment": {**{k: v for k, v in r["environment"].items() if k != "components"},
                                 "fingerprint": "0123456789abcdef"}} for r in records]   # one code hash, as before
    assert all(v == [version.OLDER] for v in version.staleness(old).values())
