"""DLG and Inverting Gradients where the head is encrypted (FedHE-Top2), sigmoid LeNet, batch 1.

Heavy (minutes): `pytest -m heavy tests/benchmarks`. The smoke variant runs in CI. DLG on the
visible lower layers, labels learned, reaches a median PSNR >= 30 dB on digits; Inverting
Gradients (cosine + TV, signed Adam) must beat a grey image by a clear margin.
"""
import numpy as np
import pytest

from bench.run.cells import run_group
from bench.run.spec import parse_suite


def _cell(attack, params, repeats, defense="fedhe-top2"):
    return parse_suite({"name": "inversion-bench", "scenarios": [{
        "name": "digits-lenet-inversion", "dataset": "digits", "model": "lenet5-sigmoid", "num_clients": 2,
        "clients_per_round": 2, "rounds": 1, "max_train": 400, "max_test": 100, "attack_batch_size": 1,
        "attack_repeats": repeats}], "defenses": [{"name": defense}],
        "attacks": [{"name": attack, "params": params}]}).cells[0]


def _run(benchmark, cell):
    record = benchmark.pedantic(lambda: next(run_group([cell], None)), rounds=1, iterations=1)
    assert record["status"] == "ok", record["reason"]
    psnrs = record["details"]["per_target"]["psnr"]
    benchmark.extra_info.update(median_psnr=float(np.median(psnrs)), psnr=psnrs,
                                label_acc=record["metrics"]["label_acc"], attack_s=record["metrics"]["attack_s"])
    print(f"\n{cell.defense.name} x {cell.attack.name}: label_acc {record['metrics']['label_acc']}, "
          f"psnr per image {np.round(psnrs, 1)}, {record['metrics']['attack_s']:.1f} s per image")
    return record, psnrs


@pytest.mark.heavy
def test_dlg_fedhe_top2_ten_images(benchmark):
    record, psnrs = _run(benchmark, _cell("dlg", {"steps": 300}, repeats=10))
    assert np.median(psnrs) >= 30.0


@pytest.mark.heavy
def test_inverting_gradients_fedhe_top2_ten_images(benchmark):
    record, psnrs = _run(benchmark, _cell("inverting-gradients", {"steps": 2000, "tv": 1e-4}, repeats=10))
    assert np.median(psnrs) >= 20.0


@pytest.mark.heavy
def test_inversion_smoke(benchmark):
    record, psnrs = _run(benchmark, _cell("dlg", {"steps": 30}, repeats=1))
    assert np.median(psnrs) >= 20.0
