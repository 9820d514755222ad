"""Registry lookups, outside plugins through entry points, and the grid-coverage rule."""
import pytest

from bench.registry import ATTACKS, DEFENSES, Registry, UnknownName


def test_unknown_name_suggests_the_closest():
    with pytest.raises(UnknownName, match="did you mean 'plaintext'"):
        DEFENSES.get("plaintex")


def test_outside_plugin_is_discovered_listed_and_runnable(site, capsys):
    site.install("toy-plugin", {"toy_plugin.py": '''
        from bench.protocol.defense import Defense

        class ToyDefense(Defense):
            """toy: plaintext FedAvg from an outside package"""
            key_topology = "none"
            reference_row = True
    '''}, {"leakbench.defenses": {"toy": "toy_plugin:ToyDefense"}})
    assert "toy" in DEFENSES.names()
    from bench.cli import main
    assert main(["list", "defenses"]) == 0
    assert "toy" in capsys.readouterr().out
    from bench.run.cells import run_group
    from tests.conftest import tiny_suite
    suite = tiny_suite(["toy"], [("idlg", {"reconstruct": False})])
    record = next(run_group(list(suite.cells), None))
    assert record["status"] == "ok", record["reason"]
    assert record["environment"]["plugins"] == {"toy-plugin": record["environment"]["plugins"]["toy-plugin"]}


def test_registry_rejects_double_registration():
    reg = Registry("things")
    reg.add("a", object())
    with pytest.raises(ValueError):
        reg.add("a", object())


def test_every_builtin_defense_and_attack_is_in_the_e2e_grid():
    from tests.test_e2e_grid import GRID_ATTACKS, GRID_DEFENSES
    missing = (set(DEFENSES.builtins()) - {d for d, _ in GRID_DEFENSES}) | \
        (set(ATTACKS.builtins()) - {a for a, _ in GRID_ATTACKS})
    assert not missing, f"add these to tests/test_e2e_grid.py: {sorted(missing)}"


def test_every_attack_declares_a_family():
    from bench.protocol.attack import FAMILIES
    from bench.registry import ATTACKS

    missing = {e.name: getattr(e.obj, "family", "") for e in ATTACKS.entries()
               if getattr(e.obj, "family", "") not in FAMILIES}
    assert not missing, f"attacks without a family in {FAMILIES}: {missing}"
