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


def test_a_component_confined_to_scenarios_runs_only_there_and_keeps_its_cell_ids():
    two = [dict(TINY_SCENARIO), {**TINY_SCENARIO, "name": "other"}]
    confined = parse_suite(_suite(scenarios=two, defenses=[
        {"name": "plaintext"}, {"name": "base", "scenarios": ["other"]}]))
    assert sorted((c.scenario.name, c.defense.name) for c in confined.cells) == [
        ("other", "base"), ("other", "plaintext"), (TINY_SCENARIO["name"], "plaintext")]
    listed = parse_suite(_suite(scenarios=[two[0], {**two[1], "defenses": ["base", "plaintext"]}],
                                defenses=[{"name": "plaintext"}, {"name": "base"}]))
    listed = [c for c in listed.cells if not (c.scenario.name == TINY_SCENARIO["name"] and c.defense.name == "base")]
    assert sorted(c.cell_id for c in confined.cells) == sorted(c.cell_id for c in listed)
    # a name that covers a confined setting and a free one: a scenario's list keeps only what it may run
    both = parse_suite(_suite(scenarios=[{**two[0], "attacks": ["idlg"]}, two[1]], attacks=[
        {"name": "idlg"}, {"name": "idlg", "params": {"steps": 7}, "scenarios": ["other"]}]))
    assert sorted((c.scenario.name, c.attack.label) for c in both.cells) == [
        ("other", "idlg"), ("other", "idlg(steps=7)"), (TINY_SCENARIO["name"], "idlg")]


@pytest.mark.parametrize("over, needle", [
    ({"defenses": [{"name": "base", "scenarios": ["othr"]}]}, "did you mean 'other'"),
    ({"defenses": [{"name": "base", "scenarios": "other"}]}, "must be a non-empty list"),
    ({"defenses": [{"name": "plaintext"}, {"name": "base", "scenarios": ["other"]}],
      "first": {"defenses": ["base"]}}, "confines to scenarios ['other']"),
])
def test_confining_scenarios_are_checked_at_load(over, needle):
    first = {**TINY_SCENARIO, **over.get("first", {})}
    rest = {k: v for k, v in over.items() if k != "first"}
    with pytest.raises(SpecError) as err:
        parse_suite(_suite(scenarios=[first, {**TINY_SCENARIO, "name": "other"}], **rest))
    assert needle in str(err.value) and "\n" not in str(err.value)
