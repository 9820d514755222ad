"""A cell's fingerprint covers what can change its numbers and nothing else (bench/run/version.py): the harness, each
registry entry it resolves (defaults included) with the definitions that entry reaches, the plugins, libraries and
data files it used. Edits are made in a copy of the tree, inside one definition."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from bench.protocol.records import fingerprint_of
from bench.run import version
from bench.run.spec import load_suite
from bench.run.version import ROOT, cell_components, harness_modules, stale_components

DP_ROWS = ("dp-fedavg", "dp-fedavg-local", "dp-sgd")   # their `inner` defaults to plaintext


@pytest.fixture(scope="module")
def core_cells():
    return load_suite("core").cells


@pytest.fixture
def tree(tmp_path):
    for package in ("bench", "defenses", "attacks", "metrics", "leaderboards"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "results"))
    yield tmp_path
    version.clear_caches()


def _components(cells, root):
    """Computed afresh: the hashes are cached per process, which never sees its own tree change."""
    version.clear_caches()
    return {c.label: cell_components(c, plugins={}, root=str(root)) for c in cells}


def _edit(path, name):
    """A comment inside the top-level definition `name` (a def or class): its source changes, nothing else."""
    text = path.read_text()
    match = re.search(rf"^(def|class) {re.escape(name)}\b.*$", text, flags=re.M)
    assert match, (path, name)
    path.write_text(text[:match.end()] + "\n    # edited" + text[match.end():])


def _append(path):
    path.write_text(path.read_text() + "\n# edited\n")


def _stale(before, after):
    return {label for label in before if before[label] != after[label]}


def _labels(cells, keep):
    return {c.label for c in cells if keep(c)}


def test_the_copy_gives_the_same_components(core_cells, tree):
    assert _components(core_cells, tree) == _components(core_cells, ROOT)


def test_editing_one_attack_stales_only_that_attacks_cells(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "attacks" / "labels" / "ilrg.py", "ILRG")
    after = _components(core_cells, tree)
    stale = _stale(before, after)
    assert stale and stale == _labels(core_cells, lambda c: c.attack.name == "ilrg")
    assert {k for label in stale for k in stale_components(before[label], after[label])} == {"attack ilrg"}


def test_editing_one_defense_stales_only_its_rows(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "defenses" / "selectiveshield.py", "SelectiveShield")
    stale = _stale(before, _components(core_cells, tree))
    assert stale and stale == _labels(core_cells, lambda c: c.defense.name == "selectiveshield")


def test_plaintexts_encoding_stales_every_cell_that_runs_it_dp_rows_included(core_cells, tree):
    """DP-FedAvg, its local variant and DP-SGD encode through their `inner` defense, plaintext by default
    (defenses/dp.py calls self.inner.encode): no core row names it, each resolves it."""
    path = tree / "defenses" / "plaintext.py"
    text = path.read_text()
    anchor = re.search(r"^class Plaintext\b.*$", text, flags=re.M)
    path.write_text(text[:anchor.end()] + "\n    def encode(self, fed, client, update, weight):\n"
                    "        return super().encode(fed, client, {n: t / 2 for n, t in update.items()}, weight)\n"
                    + text[anchor.end():])
    before = _components(core_cells, ROOT)
    stale = _stale(before, _components(core_cells, tree))
    dp = _labels(core_cells, lambda c: c.defense.name in DP_ROWS and c.defense.params.get("inner") is None)
    assert len(dp) >= 90   # 42 + 42 + 6 rows' cells
    assert stale == _labels(core_cells, lambda c: c.defense.name == "plaintext") | dp


def test_a_maskcrypt_edit_stales_no_sensecrypt_cell(core_cells, tree):
    """SenseCrypt's package imports MaskCrypt (defenses/sensecrypt/baselines.py, for maskcrypt-paillier), but
    SenseCrypt itself calls none of its code."""
    before = _components(core_cells, tree)
    _edit(tree / "defenses" / "maskcrypt.py", "MaskCrypt")
    stale = _stale(before, _components(core_cells, tree))
    assert stale and stale == _labels(core_cells, lambda c: c.defense.name == "maskcrypt")


def test_a_function_a_defense_calls_in_another_module_is_part_of_it(core_cells, tree):
    """The DP defenses account with RdpLedger (bench/federation/accounting.py) and SelectiveShield too; SenseCrypt's
    DP variant releases once and calls only `report` (defenses/sensecrypt/clustering.py), so the ledger is not its."""
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "federation" / "accounting.py", "RdpLedger")
    stale = _stale(before, _components(core_cells, tree))
    accounted = (*DP_ROWS, "selectiveshield")
    assert stale and stale == _labels(core_cells, lambda c: c.defense.name in accounted)


def test_a_cifar_only_edit_stales_no_mnist_cell(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "data" / "vision.py", "_read_cifar")
    stale = _stale(before, _components(core_cells, tree))
    assert stale and stale == _labels(core_cells, lambda c: c.scenario.dataset == "cifar10")
    _edit(tree / "bench" / "data" / "vision.py", "read_idx")   # the IDX reader: MNIST and Fashion-MNIST
    stale = _stale(before, _components(core_cells, tree))
    assert stale == _labels(core_cells, lambda c: c.scenario.dataset in ("cifar10", "mnist", "fashion-mnist"))


def test_a_lenet_only_edit_stales_no_mlp_cell(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "models" / "vision.py", "lenet5_sigmoid")
    stale = _stale(before, _components(core_cells, tree))
    assert stale and stale == _labels(core_cells, lambda c: c.scenario.model == "lenet5-sigmoid")
    _edit(tree / "bench" / "models" / "vision.py", "Classifier")   # shared by every conv model, not the MLP
    stale = _stale(before, _components(core_cells, tree))
    assert stale and not stale & _labels(core_cells, lambda c: c.scenario.model in ("mlp", "fcn"))


def test_editing_a_dataset_module_stales_only_its_datasets(core_cells, tree):
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "data" / "text.py", "_text_dataset")
    stale = _stale(before, _components(core_cells, tree))
    text = {"sst2-sentences-cls", "sst2-sentences-cls-smollm2", "rt-polarity-smollm2", "sst2-cls-smollm2"}
    assert stale and stale == _labels(core_cells, lambda c: c.scenario.dataset in text)


def test_the_per_example_bits_encoding_stales_every_cell(core_cells, tree):
    """pack_bits encodes the per-example outcomes behind every utility interval; it lives with what computes them
    (bench/models/losses.py, the harness), no longer among the modules that only identify a cell."""
    before = _components(core_cells, tree)
    _edit(tree / "bench" / "models" / "losses.py", "pack_bits")
    after = _components(core_cells, tree)
    assert _stale(before, after) == set(before)
    assert all(stale_components(before[k], after[k]) == ["harness"] for k in before)


@pytest.mark.parametrize("harness_file", [("bench", "federation", "engine.py"), ("metrics", "images.py"),
                                          ("bench", "protocol", "view.py")])
def test_editing_the_harness_stales_every_cell(core_cells, tree, harness_file):
    before = _components(core_cells, tree)
    _append(tree.joinpath(*harness_file))
    after = _components(core_cells, tree)
    assert _stale(before, after) == set(before)
    assert all(stale_components(before[k], after[k]) == ["harness"] for k in before)


@pytest.mark.parametrize("renders_only", [("leaderboards", "grid.py"), ("bench", "run", "spec.py"),
                                          ("bench", "cli.py"), ("bench", "protocol", "records.py")])
def test_what_only_renders_or_identifies_a_cell_stales_nothing(core_cells, tree, renders_only):
    before = _components(core_cells, tree)
    _append(tree.joinpath(*renders_only))
    assert _components(core_cells, tree) == before


def test_the_harness_holds_the_engine_and_every_metric_but_no_plugin_module():
    modules = harness_modules()
    assert {"bench.federation.engine", "bench.run.cells", "bench.models.losses", "metrics.images",
            "metrics.text"} <= modules
    assert not any(m.split(".")[0] in ("defenses", "attacks", "leaderboards") for m in modules)
    assert "bench.data.vision" not in modules and "bench.models.text" not in modules   # a dataset's, a model's


def test_the_same_tree_gives_the_same_fingerprints_in_two_processes(core_cells):
    script = ("import json; from bench.run.spec import load_suite; from bench.run.version import cell_fingerprint; "
              "print(json.dumps({c.label: cell_fingerprint(c) for c in load_suite('core').cells}))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      env={"PYTHONHASHSEED": str(seed), "PATH": ""}, cwd=ROOT).stdout)
            for seed in (1, 2)]
    assert runs[0] == runs[1] == {c.label: version.cell_fingerprint(c) for c in core_cells}


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
    real = version.entry_hash
    monkeypatch.setattr(version, "entry_hash", lambda role, name, root=str(ROOT): "edited"
                        if (role, name) == ("attack", "random-guess") else real(role, name, root))
    stale = version.staleness(records)
    assert sorted(stale.values()) == [[], ["attack random-guess"]]
    state = code_state(records, stale)
    assert state["stale_cells"] == 1 and state["stale"] == [{"component": "attack random-guess",
                                                           "cells": ["tiny/plaintext/random-guess"]}]
    old = [{**r, "environment": {**{k: v for k, v in r["environment"].items() if k != "components"},
                                 "fingerprint": "0123456789abcdef"}} for r in records]   # one code hash, as before
    assert all(v == [version.OLDER] for v in version.staleness(old).values())


def test_a_record_lists_what_its_computation_resolved_libraries_and_data(tmp_path, monkeypatch):
    """The registry logs what it hands out while a cell computes (bench/registry.py): DP-FedAvg's inner plaintext
    is in its record even where its default is not read; torch, numpy, opacus, tenseal and python by public
    version; the data file it read by the digest of its bytes. Each reaches the fingerprint."""
    from bench.data.loading import file_digest, find_data
    from bench.run.runner import run_suite
    from bench.run.store import Store
    from tests.conftest import tiny_suite

    monkeypatch.setattr(version, "_defaults", lambda kind, name: {})   # only the log can name plaintext now
    suite = tiny_suite([("dp-fedavg", {"noise_multiplier": 1.0})], ["random-guess"])
    assert run_suite(suite, tmp_path).ok == 1
    store = Store(tmp_path / "leakbench.sqlite")
    (env,) = [r["environment"] for r in store.records()]
    store.close()
    components = env["components"]
    assert {"defense dp-fedavg", "defense plaintext", "attack random-guess", "dataset digits", "model mlp",
            "harness"} <= set(components)
    for library in ("python", "torch", "numpy", "opacus", "tenseal"):
        assert re.fullmatch(r"[0-9][0-9A-Za-z.]*|not installed", components[f"library {library}"]), components
    assert "+" not in components["library torch"] and env["libraries"]["torch"].startswith(components["library torch"])
    (key,) = [k for k in components if k.startswith("data ")]
    assert key == "data package:sklearn/datasets/data/digits.csv.gz"
    assert components[key] == file_digest(find_data(key.removeprefix("data "), None))
    assert env["fingerprint"] == fingerprint_of(components) and version.is_current(env)
    for changed in ({"library torch": "0.0.1"}, {key: "0" * 16}):
        other = {**components, **changed}
        assert not version.is_current({"components": other, "fingerprint": fingerprint_of(other)})
    assert {"model", "capability"} <= set(env["cpu"]) | set(env["numerics"])
    assert env["torch_build"]["torch"] == env["libraries"]["torch"]


def test_a_data_file_is_noted_by_its_bytes_and_an_edit_stales_it(tmp_path):
    from bench.data.loading import read_data
    from bench.registry import using

    root = tmp_path / "data"
    (root / "set").mkdir(parents=True)
    (root / "set" / "train.bin").write_bytes(b"12345")
    with using() as used:
        read_data(root / "set" / "train.bin", root)
    assert list(used.files) == ["root:set/train.bin"]
    components = {f"data {k}": v for k, v in used.files.items()}
    assert version.outdated(components, root) == []
    (root / "set" / "train.bin").write_bytes(b"12346")
    assert version.outdated(components, root) == ["data root:set/train.bin"]
    (root / "set" / "train.bin").unlink()   # not on this machine: a run recomputes, a page cannot tell
    assert version.outdated(components, root) == ["data root:set/train.bin"]
    assert version.outdated(components, root, absent=False) == []


def test_the_noise_calibration_cache_is_keyed_by_the_code_that_computed_it(tmp_path, monkeypatch):
    import opacus.accountants.utils

    from bench.federation import accounting

    calls = []
    monkeypatch.setattr(opacus.accountants.utils, "get_noise_multiplier",   # the bisection, counted
                        lambda **kw: calls.append(kw) or 1.5 + len(calls))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    accounting._cached.cache_clear()
    assert accounting.noise_for_epsilon(2.0, 1e-5, 0.5, 3) == 2.5
    (key,) = json.loads(accounting.cache_file().read_text())
    assert accounting.CODE in json.loads(key)
    accounting._cached.cache_clear()
    assert accounting.noise_for_epsilon(2.0, 1e-5, 0.5, 3) == 2.5 and len(calls) == 1   # read back: same code
    monkeypatch.setattr(accounting, "CODE", "edited")
    accounting._cached.cache_clear()
    assert accounting.noise_for_epsilon(2.0, 1e-5, 0.5, 3) == 3.5 and len(calls) == 2   # edited code recomputes
    accounting._cached.cache_clear()


def test_verify_refuses_a_forged_fingerprint_and_an_only_that_selects_nothing(tiny_core, tmp_path, capsys):
    """A fingerprint set to make a cell skip verification ("stale", exit 0) is refused when the folder is read; a
    record whose config this code cannot rebuild no longer survives --only."""
    from bench.cli import main
    from bench.protocol.records import config_id, seal
    from tests.conftest import DP, copy_export, find_record

    def forge(records):
        rec = find_record(records, f"{DP}/idlg-extended")
        rec["metrics"]["label_acc"] = 0.05
        rec["environment"]["fingerprint"] = "deadbeefdeadbeef"
        seal(rec)

    folder = copy_export(tiny_core, tmp_path / "forged", forge)
    assert main(["verify", str(folder), "--only", f"{DP}/idlg-extended", "--sample", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fingerprint deadbeefdeadbeef is not the hash of its components" in err
    assert str(folder / "results.json") in err

    def older_schema(records):   # a field today's scenario does not know: the record cannot be rebuilt
        rec = records[0]
        rec["config"]["scenario"]["retired_field"] = 1
        rec["cell_id"] = config_id(rec["config"])
        seal(rec)

    folder = copy_export(tiny_core, tmp_path / "older", older_schema)
    assert main(["verify", str(folder), "--only", "zzz-nothing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--only 'zzz-nothing' selects none of the" in err


def test_a_definition_reaches_what_it_names_across_modules_and_nothing_beside_it(tmp_path):
    """bench/run/closure.py on a small package: a function reaches the definitions it names, through a re-export,
    with each module's import-time statements, and not the definitions beside them."""
    from bench.run.closure import definitions, definitions_text

    pkg = tmp_path / "defenses"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("import math\n\n\ndef used(x):\n    return math.sqrt(x) + _CONST\n\n\n"
                                    "_CONST = 2\n\n\ndef unused():\n    return 1\n\n\nREGISTERED = []\n"
                                    "REGISTERED.append(used)\n")
    (pkg / "shim.py").write_text("from defenses.helpers import used  # re-exported\n")
    (pkg / "entry.py").write_text("from defenses import shim\nfrom defenses.shim import used\n\n\n"
                                  "def entry(x):\n    return used(x)\n\n\ndef other(x):\n    return shim.used(x) * 2\n")
    reached = definitions(tmp_path, "defenses.entry", "entry", stop=lambda m: False)
    text = definitions_text(tmp_path, reached).decode()
    assert "def entry" in text and "def used" in text and "_CONST = 2" in text
    assert "REGISTERED.append(used)" in text                 # runs at import: every user of the module has it
    assert "def unused" not in text and "def other" not in text
    assert definitions(tmp_path, "defenses.entry", "entry", stop=lambda m: m == "defenses.helpers").keys() == \
        {"defenses", "defenses.entry", "defenses.shim"}   # a stopped module is not entered
