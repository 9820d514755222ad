"""iDLG on plaintext, sigmoid LeNet, batch 1: label accuracy 1.0 and median PSNR >= 30 dB on MNIST.

Heavy (minutes): `pytest -m heavy tests/benchmarks`. The smoke variant runs in CI.
"""
import numpy as np
import pytest

from bench.run.cells import run_group
from bench.run.spec import parse_suite


def _cell(dataset, repeats, steps, max_train):
    return parse_suite({"name": "idlg-bench", "scenarios": [{
        "name": f"{dataset}-lenet-idlg", "dataset": dataset, "model": "lenet5-sigmoid", "num_clients": 1,
        "clients_per_round": 1, "rounds": 1, "max_train": max_train, "max_test": 100, "attack_batch_size": 1,
        "attack_repeats": repeats}], "defenses": [{"name": "plaintext"}],
        "attacks": [{"name": "idlg", "params": {"steps": steps}}]}).cells[0]


def _run(benchmark, cell, data_root):
    record = benchmark.pedantic(lambda: next(run_group([cell], data_root)), rounds=1, iterations=1)
    assert record["status"] == "ok", record["reason"]
    psnrs = record["details"]["per_target"]["psnr"]
    benchmark.extra_info.update(median_psnr=float(np.median(psnrs)), psnr=psnrs,
                                label_acc=record["metrics"]["label_acc"], lpips=record["metrics"].get("lpips"))
    print(f"\n{cell.scenario.dataset}: label_acc {record['metrics']['label_acc']}, psnr per image {np.round(psnrs, 1)}")
    return record, psnrs


@pytest.mark.heavy
def test_idlg_mnist_ten_images(benchmark, data_root):
    record, psnrs = _run(benchmark, _cell("mnist", repeats=10, steps=300, max_train=1000), data_root)
    assert record["metrics"]["label_acc"] == 1.0
    assert np.median(psnrs) >= 30.0


@pytest.mark.heavy
def test_idlg_digits_ten_images(benchmark):
    record, psnrs = _run(benchmark, _cell("digits", repeats=10, steps=300, max_train=500), None)
    assert record["metrics"]["label_acc"] == 1.0


@pytest.mark.heavy
def test_idlg_smoke(benchmark):
    record, psnrs = _run(benchmark, _cell("digits", repeats=1, steps=30, max_train=100), None)
    assert record["metrics"]["label_acc"] == 1.0
