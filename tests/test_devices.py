"""Device profiles are scenario data, and a suite may give a defense different parameters per scenario."""
import pytest

from bench.federation.client_devices import CATALOGS, assign
from bench.federation.scenario import Scenario, SpecError
from bench.run.spec import parse_suite


def scenario(**kw):
    return Scenario(**({"name": "s", "dataset": "digits", "model": "mlp", "num_clients": 10,
                        "clients_per_round": 10} | kw))


def test_she_lora_table_1_mix_and_types():
    devices = assign(scenario(devices="she-lora-bert", device_assign="mix"), [[0]] * 10)
    assert [d.type for d in devices] == ["type-1"] * 4 + ["type-2"] * 3 + ["type-3"] * 2 + ["type-4"]
    assert [d.lora_rank for d in devices[::3]] == [8, 8, 16, 32]
    assert {d.type: d.he_budget for d in devices} == {"type-1": 0.004, "type-2": 0.004, "type-3": 0.008,
                                                      "type-4": 0.016}
    llama = CATALOGS["she-lora-llama"]
    assert [llama[t][0].he_budget for t in llama] == [0.00125, 0.00125, 0.0025, 0.005]
    assert [d.cpus for d in assign(scenario(devices="she-lora-llama", num_clients=4, clients_per_round=4),
                                   [[0]] * 4)] == [105.2, 165.5, 216.9, 243.1]


def test_explicit_types_and_by_category():
    sc = scenario(devices="sensecrypt-4.1", num_clients=3, clients_per_round=3,
                  device_types=["tier-5", "tier-1", "tier-5"])
    assert [d.bandwidth_mbps for d in assign(sc, [[0]] * 3)] == [30.0, 50.0, 30.0]
    sc = scenario(devices="sensecrypt-4.1", device_assign="by-category", partition="k-classes",
                  num_clients=4, clients_per_round=4)
    got = assign(sc, [[0, 1], [2, 3], [1, 0], [3, 2]])
    assert [d.type for d in got] == ["tier-1", "tier-1", "tier-2", "tier-2"]


@pytest.mark.parametrize("kw,match", [({"devices": "she-lora"}, "did you mean 'she-lora-bert'"),
                                      ({"device_assign": "round-robin"}, "must be one of"),
                                      ({"device_types": ["uniform"]}, "one per client"),
                                      ({"devices": "sensecrypt-4.1", "device_types": ["tier-9"] * 10}, "not a type")])
def test_bad_device_settings_fail_in_one_line(kw, match):
    with pytest.raises(SpecError, match=match) as err:
        scenario(**kw)
    assert "\n" not in str(err.value)


SUITE = {"name": "t", "scenarios": [
    {"name": "a", "dataset": "digits", "model": "mlp", "defense_params": {"maskcrypt": {"rho": 0.2}}},
    {"name": "b", "dataset": "digits", "model": "mlp"}],
    "defenses": [{"name": "maskcrypt", "params": {"rho": 0.1}}, {"name": "plaintext"}],
    "attacks": [{"name": "ilrg"}]}


def test_a_scenario_gives_a_defense_its_own_parameters():
    cells = parse_suite(SUITE).cells
    rho = {(c.scenario.name, c.defense.name): c.defense.params.get("rho") for c in cells}
    assert rho[("a", "maskcrypt")] == 0.2 and rho[("b", "maskcrypt")] == 0.1
    assert rho[("a", "plaintext")] is None


def test_per_scenario_parameters_are_validated():
    bad = SUITE | {"scenarios": [SUITE["scenarios"][0] | {"defense_params": {"maskcrpyt": {"rho": 0.2}}}]}
    with pytest.raises(SpecError, match="did you mean 'maskcrypt'"):
        parse_suite(bad)
    bad = SUITE | {"scenarios": [SUITE["scenarios"][0] | {"defense_params": {"maskcrypt": 0.2}}]}
    with pytest.raises(SpecError, match="table of tables"):
        parse_suite(bad)
