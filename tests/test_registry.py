"""Registry lookups, outside plugins through entry points, and the grid-coverage rule."""
import sys
import textwrap

import pytest

from bench.registry import ATTACKS, DEFENSES, Registry, UnknownName


def test_unknown_name_suggests_the_closest():
    with pytest.raises(UnknownName, match="did you mean 'plaintext'"):
        DEFENSES.get("plaintex")


def test_outside_plugin_is_discovered_listed_and_runnable(tmp_path, monkeypatch, capsys):
    (tmp_path / "toy_plugin.py").write_text(textwrap.dedent('''
        from bench.protocol.defense import Defense

        class ToyDefense(Defense):
            """toy: plaintext FedAvg from an outside package"""
            key_topology = "none"
    '''))
    dist = tmp_path / "toy_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[leakbench.defenses]\ntoy = toy_plugin:ToyDefense\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        DEFENSES.load_entry_points()
        assert "toy" in DEFENSES.names()
        from bench.cli import main
        assert main(["list", "defenses"]) == 0
        assert "toy" in capsys.readouterr().out
        from bench.run.cells import run_group
        from tests.conftest import tiny_suite
        suite = tiny_suite(["toy"], [("idlg", {"reconstruct": False})])
        record = next(run_group(list(suite.cells), None))
        assert record["status"] == "ok", record["reason"]
    finally:
        DEFENSES._entries.pop("toy", None)
        sys.modules.pop("toy_plugin", None)


def test_registry_rejects_double_registration():
    reg = Registry("things")
    reg.add("a", object())
    with pytest.raises(ValueError):
        reg.add("a", object())


def test_every_registered_defense_and_attack_is_in_the_e2e_grid():
    from tests.test_e2e_grid import GRID_ATTACKS, GRID_DEFENSES
    missing = (set(DEFENSES.names()) - {d for d, _ in GRID_DEFENSES}) | (set(ATTACKS.names()) - {a for a, _ in GRID_ATTACKS})
    assert not missing, f"add these to tests/test_e2e_grid.py: {sorted(missing)}"


def test_every_attack_declares_a_family():
    from bench.protocol.attack import FAMILIES
    from bench.registry import ATTACKS

    missing = {e.name: getattr(e.obj, "family", "") for e in ATTACKS.entries()
               if getattr(e.obj, "family", "") not in FAMILIES}
    assert not missing, f"attacks without a family in {FAMILIES}: {missing}"
