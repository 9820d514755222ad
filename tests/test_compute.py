"""--device: resolution, the one-line refusal of cuda without a GPU, and device-independent cell identity."""
from __future__ import annotations

import json

import pytest
import torch

from bench.cli import main
from bench.models import torch_device


@pytest.fixture(autouse=True)
def _restore_device(monkeypatch):
    monkeypatch.setenv(torch_device.ENV, "cpu")   # the CLI sets it for the process; put it back after each test


def test_resolve(monkeypatch):
    assert torch_device.resolve("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_device.resolve("auto") == "cpu"
    with pytest.raises(ValueError, match="^--device cuda: torch sees no CUDA GPU"):
        torch_device.resolve("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch_device.resolve("cuda") == "cuda" and torch_device.resolve("auto") == "auto"
    with pytest.raises(ValueError, match="--device must be one of auto, cpu, cuda, got 'gpu'"):
        torch_device.resolve("gpu")


def test_use_sets_the_process_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_device.use("auto") == "cpu"
    assert torch_device.device() == torch.device("cpu") and torch_device.device_name() == "cpu"
    monkeypatch.setenv(torch_device.ENV, "cuda")      # inherited by a worker on a machine without a GPU
    with pytest.raises(ValueError, match="no CUDA GPU"):
        torch_device.device()


def test_auto_chooses_by_the_size_of_the_model(monkeypatch):
    """auto: small models (LeNet, the MLPs) stay on the CPU, where the GPU loses; large ones go to the GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(torch_device.ENV, torch_device.use("auto"))
    small = torch.nn.Linear(100, 10)
    large = torch.nn.Linear(1000, torch_device.AUTO_GPU_PARAMS // 1000)
    assert torch_device.device_name(small) == "cpu" and torch_device.device_name() == "cpu"
    assert torch_device.device_name(large) == "cuda"
    monkeypatch.setenv(torch_device.ENV, "cpu")
    assert torch_device.device_name(large) == "cpu"


@pytest.mark.parametrize("choice, message", [("cuda", "--device cuda: torch sees no CUDA GPU"),
                                             ("tpu", "--device must be one of auto, cpu, cuda")])
def test_cli_refuses_in_one_line_before_writing(choice, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert main(["run", "smoke", "--out", str(out), "--device", choice]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"leakbench: error: {message}") and "\n" not in err
    assert not out.exists()


def test_device_is_recorded_but_not_part_of_the_cell_id(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert main(["run", "smoke", "--out", str(out), "--device", "cpu"]) == 0
    records = json.loads((out / "results.json").read_text())
    assert records and all(r["environment"]["device"] == "cpu" for r in records)
    capsys.readouterr()
    assert main(["run", "smoke", "--out", str(out), "--device", "auto"]) == 0   # resolves to cpu here
    assert f"{len(records)} already done" in capsys.readouterr().out
