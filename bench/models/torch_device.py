"""Where torch computes: the run's device, `--device auto|cpu|cuda` (default cpu).

The choice is resolved once and kept in LEAKBENCH_DEVICE, so
cell processes and local Ray workers started by the run inherit it (a remote Ray cluster gets it
through the job's runtime_env). Only the heavy loops move: local training and FedSGD steps
(bench/federation/engine.py), test-set evaluation, and the optimization attacks (DLG, iDLG, Inverting
Gradients, DAGER). Everything that crosses a party boundary stays a CPU tensor, so defenses,
the wire and the server view never see a device.

`auto` chooses per workload, by the size of the model a loop runs on: the GPU for models of
AUTO_GPU_PARAMS parameters or more, the CPU below. On small models a GPU loses to the CPU: an
optimization attack's L-BFGS closure on the 60k-parameter LeNet is kernel launches and host
syncs, and iDLG / DLG cells took 13-17 s on an H200 against 0.5-0.6 s on its CPUs (the default
suite summed 312 s of cell time on cuda against 125 s on cpu). From about a million parameters
on, the GPU wins: DAGER on a 3-layer GPT-2 (d = 768) took 1.9 s a batch on the H200 against
6.5 s on its 16 cores; ResNet-18 training and Inverting Gradients are larger still.

The device is not part of a cell's identity: a result computed on the GPU is reused by a CPU run
and the other way round. GPU results are not bit-identical to CPU ones, but close:
- every random draw (partitions, batch order, dummy inputs, label logits) is taken on the CPU from
  the same seeded generators and then moved, so both devices start from the same numbers;
- TF32 is switched off, so matmuls and convolutions stay float32; what differs is the order of
  float32 reductions in cuBLAS / cuDNN (relative error ~1e-6 per op).
Expected tolerance: model updates and accuracies agree to ~1e-5 relative after a few local epochs
(an accuracy may move by one test sample at a near-tie) except under DP, whose clipping and noise
amplify them (dp-fedavg and SelectiveShield: 0.770 on an H200 against 0.793 on the CPU, 7 of 300 test samples); analytic attacks (iLRG, the iDLG label
rule, DAGER's span checks) give the same labels and texts unless a value sits within ~1e-5 of a
threshold; iterative reconstructions (L-BFGS, signed Adam) amplify the 1e-6 differences along
their trajectories, so PSNR / SSIM / LPIPS per image may differ by a few percent (more where the
optimization is chaotic, as DLG on a sigmoid LeNet is); compare those as means over images.
CKKS results are exact on the grid either way (bench/crypto/ckks.py).
"""
from __future__ import annotations

import os

import torch

ENV = "LEAKBENCH_DEVICE"
CHOICES = ("auto", "cpu", "cuda")


AUTO_GPU_PARAMS = 1_000_000   # `auto`: models this large (parameters) compute on the GPU, smaller ones on the CPU


def resolve(choice: str) -> str:
    """'cpu', 'cuda' or 'auto' (per workload; only where torch sees a GPU, else 'cpu') for a --device choice;
    ValueError (one line) for an unknown one or a missing GPU."""
    if choice not in CHOICES:
        raise ValueError(f"--device must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "auto":
        return "auto" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA GPU on this machine (torch.cuda.is_available() is "
                         "False); use --device cpu or --device auto")
    return choice


def use(choice: str) -> str:
    """Resolve a --device choice and make it this process's (and its children's) device."""
    name = resolve(choice)
    os.environ[ENV] = name
    return name


def device(model: torch.nn.Module | None = None) -> torch.device:
    """Where a loop on `model` computes (LEAKBENCH_DEVICE, default cpu; `auto` picks by the model's size, and
    without a model the CPU); a cuda setting on a machine without GPU is refused."""
    name = resolve(os.environ.get(ENV, "cpu") or "cpu")
    if name == "auto":
        large = model is not None and sum(p.numel() for p in model.parameters()) >= AUTO_GPU_PARAMS
        name = "cuda" if large else "cpu"
    if name == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch.device(name)


def device_name(model: torch.nn.Module | None = None) -> str:
    return device(model).type


def setting() -> str:
    """The run's setting as a record states it: cpu, cuda, or auto (with the rule it follows)."""
    return resolve(os.environ.get(ENV, "cpu") or "cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's parameters live (cpu for a model without any)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def native_bfloat16(where: torch.device) -> bool:
    """Whether bfloat16 matrix products run in hardware on `where`: a GPU that supports them, or a CPU whose oneDNN
    may use AVX512_BF16 or AMX. Elsewhere torch emulates them, tens of times slower than float32 (a 512 x 768 by
    768 x 768 product: 3.4 ms native, 312 ms emulated, one thread); that includes every CPU under the pinned AVX2
    path (bench/run/numerics.py), which caps oneDNN below them."""
    if where.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):   # a build without the query: assume emulation
        return False

