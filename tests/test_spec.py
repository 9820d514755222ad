"""Suite validation: every fault is one line naming it and the closest valid value."""
import pytest

from bench.federation.scenario import SpecError
from bench.run.spec import parse_suite
from tests.conftest import TINY_SCENARIO, tiny_suite


def _suite(**over):
    data = {"name": "s", "scenarios": [dict(TINY_SCENARIO)], "defenses": [{"name": "plaintext"}],
            "attacks": [{"name": "idlg"}]}
    data.update(over)
    return data


@pytest.mark.parametrize("data, needle", [
    (_suite(defenses=[{"name": "plaintxt"}]), "did you mean 'plaintext'"),
    (_suite(attacks=[{"name": "idgl"}]), "did you mean 'idlg'"),
    (_suite(scenarios=[{**TINY_SCENARIO, "rounds": "three"}]), "'rounds' must be int"),
    (_suite(scenarios=[{**TINY_SCENARIO, "dataset": "mnsit"}]), "did you mean 'mnist'"),
    (_suite(scenarios=[{k: v for k, v in TINY_SCENARIO.items() if k != "dataset"}]), "missing required key 'dataset'"),
    (_suite(scenarios=[{**TINY_SCENARIO, "partiton": "iid"}]), "did you mean 'partition'"),
    (_suite(scenarios=[{**TINY_SCENARIO, "partition": "dirichlett"}]), "did you mean 'dirichlet'"),
    (_suite(defenses=[{"name": "maskcrypt", "params": {"roh": 0.1}}]), "did you mean 'rho'"),
    (_suite(scenarios=[{**TINY_SCENARIO, "clients_per_round": 5}]), "lower it to at most 2"),
])
def test_invalid_suites_fail_in_one_line(data, needle):
    with pytest.raises(SpecError) as err:
        parse_suite(data)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_cell_id_is_stable_and_config_sensitive():
    a = tiny_suite(["plaintext"], ["idlg"]).cells[0]
    b = tiny_suite(["plaintext"], ["idlg"], name="other").cells[0]
    c = tiny_suite(["plaintext"], ["idlg"], seed=1).cells[0]
    assert a.cell_id == b.cell_id          # suite name is not part of the work
    assert a.cell_id != c.cell_id
    assert len(a.cell_id) == 16


def test_sweeps_expand_to_a_product():
    suite = parse_suite(_suite(defenses=[{"name": "selective", "sweep": {"rule": ["max", "min"],
                                                                          "ratio": [0.1, 0.2, 0.4]}}]))
    assert len(suite.cells) == 6
    assert len({c.cell_id for c in suite.cells}) == 6


def test_builtin_suites_load():
    from bench.registry import SUITES
    from bench.run.spec import load_suite
    for name in SUITES.builtins():
        assert load_suite(name).cells
