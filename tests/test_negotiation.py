"""Negotiation messages sent in the clear: attacked where the head rows reveal labels, listed otherwise."""
import numpy as np
import pytest

from attacks.labels.negotiation import split_classes, spread
from bench.run.cells import run_group
from tests.conftest import tiny_suite

SCENARIO = {"model": "mlp-tiny", "partition": "k-classes", "classes_per_client": 3, "num_clients": 4,
            "clients_per_round": 4, "attack_batch_size": 4, "max_train": 300}
DEFENSES = [("sensecrypt", {"key_bits": 512, "ratio_cap": 0.05}, "sent/-1/sensitivity vector"),
            ("selectiveshield", {"noise_multiplier": 1.0}, "sent/0/sensitive mask"),
            ("maskcrypt", {}, "sent/0/mask proposal")]


def test_split_and_spread():
    scores = np.array([0.30, 0.01, 0.25, 0.02, 0.20, 0.015])
    assert split_classes(scores).tolist() == [True, False, True, False, True, False]
    counts = spread(scores, split_classes(scores), 4)
    assert counts.sum() == 4 and counts[[1, 3, 5]].sum() == 0 and counts[0] == 2


@pytest.mark.parametrize("defense,params,key", DEFENSES, ids=[d[0] for d in DEFENSES])
def test_head_rows_of_clear_maps_reveal_the_client_classes(defense, params, key):
    suite = tiny_suite([(defense, params)], [("negotiation-labels", {}), ("random-guess", {})], **SCENARIO)
    records = {r["attack"]: r for r in run_group(list(suite.cells), None)}
    rec = records["negotiation-labels"]
    assert rec["status"] == "ok", rec["reason"]
    listed = {m["key"]: m for m in rec["details"]["sent_in_clear"]}
    assert listed[key]["attacked"] and listed[key]["bytes"] > 0
    assert not any(m["attacked"] for k, m in listed.items() if k != key)
    assert not any(m["attacked"] for m in records["random-guess"]["details"]["sent_in_clear"])
    assert set(listed) == {m["key"] for m in records["random-guess"]["details"]["sent_in_clear"]}
    f1 = rec["metrics"]["client_class_f1"]
    print(f"\n{defense}: client_class_f1={f1:.2f} label_f1={rec['metrics']['label_f1']:.2f}")
    assert 0.0 < f1 <= 1.0
    if defense == "selectiveshield":
        assert f1 >= 0.8


def test_nothing_sent_in_the_clear_blocks_the_attack():
    rec = next(run_group(list(tiny_suite(["plaintext"], ["negotiation-labels"], **SCENARIO).cells), None))
    assert rec["status"] == "blocked" and "in the clear" in rec["reason"]
    assert rec["details"]["sent_in_clear"] == []


def test_page_lists_what_no_attack_read():
    from leaderboards.render import clear_not_attacked

    def rec(defense, items):
        return {"scenario": "s", "defense": defense, "defense_params": {}, "details": {"sent_in_clear": items}}
    vector = {"key": "sent/-1/sensitivity vector", "bytes": 40, "layout": "entries:f4"}
    mask = {"key": "mask", "bytes": 5, "layout": "entries:bits", "attacked": False}
    records = [rec("sensecrypt", [vector | {"attacked": True}, mask]), rec("sensecrypt", [vector | {"attacked": False},
                                                                                        mask]),
               {"scenario": "s", "defense": "plaintext", "defense_params": {}, "details": {}}]
    assert clear_not_attacked(records) == {"sensecrypt": ["mask (5 B)"]}
