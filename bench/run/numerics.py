"""The numerical path a cell's floats take: pinned so that a cell computes the same numbers on another x86 machine,
and described in every record's environment (the CPU, torch's build, the settings in effect).

Torch picks its vectorized kernels by the CPU it finds (ATen's CPU capability: AVX-512 where the CPU has it,
else AVX2), MKL picks its code path by the CPU too (and may change the order of a reduction with it), and oneDNN
(convolutions) JIT-compiles for the widest ISA it finds. Two machines with different CPUs then sum in different
orders, and a trained model, an accuracy, a selection mask made from float ranks differ in their last bits or
more. `pin` asks every library for the AVX2 path, which every x86-64 CPU since 2013-2015 has: ATen's capability
(ATEN_CPU_CAPABILITY), MKL's conditional numerical reproducibility (MKL_CBWR: the same results on every CPU that
supports the named path, for a fixed thread count) and oneDNN's widest ISA (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA
for older builds). Each is read once, when its library first computes, so `pin` runs before torch is imported:
in `bench/__init__.py`, which every process that computes cells imports first (the command line, pool workers,
Ray tasks, pytest). A variable already set is kept (the environment then records it); LEAKBENCH_NUMERICS=native
leaves every library its own choice. The thread count is fixed per run and recorded (bench/run/threads.py), and
`leakbench verify` recomputes with the recorded count. What was found on a 2-core AMD EPYC with AVX-512, and what the
pinning costs, is in docs/architecture.md's Record paragraph.
"""
from __future__ import annotations

import functools
import os
import platform
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

ENV = "LEAKBENCH_NUMERICS"
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}
LIBRARIES = ("torch", "numpy", "opacus", "tenseal", "transformers")


def pin() -> None:
    """Ask torch, MKL and oneDNN for the AVX2 path on an x86-64 machine, for each variable this process has not set
    (module docstring); nothing under LEAKBENCH_NUMERICS=native or on another architecture."""
    if os.environ.get(ENV, "").strip().lower() == "native" or platform.machine().lower() not in ("x86_64", "amd64"):
        return
    for name, value in PINNED.items():
        os.environ.setdefault(name, value)


def environment() -> dict[str, str]:
    """The numerical settings this process runs with, for worker processes started elsewhere (Ray's)."""
    return {k: os.environ[k] for k in (ENV, *PINNED) if k in os.environ}


def settings() -> dict[str, Any]:
    """The numerical settings in effect: the variables (None where unset), the kernels torch dispatches, whether
    deterministic algorithms are asked for and whether oneDNN computes convolutions (the thread count is the
    environment's `threads`)."""
    import torch

    variables = {k: os.environ.get(k) for k in (ENV, *PINNED)}
    return {"variables": variables, "capability": torch.backends.cpu.get_cpu_capability(),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "onednn": bool(torch.backends.mkldnn.enabled)}


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, Any]:
    """The CPU: its model name, architecture and the widest vector extensions it has (x86: avx2, avx512f)."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:   # not Linux: the processor string is all there is
        pass
    name = name or platform.processor()
    wide = sorted(f for f in flags if f in ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile",
                                            "sve", "sve2", "asimd"))
    return {"model": name or "unknown", "machine": platform.machine(), "vector": wide}


@functools.lru_cache(maxsize=1)
def torch_build() -> dict[str, Any]:
    """torch's full build string and the libraries it computes with: BLAS, MKL and oneDNN versions, the OpenMP
    version, the parallel backend (from torch.__config__.show())."""
    import torch

    shown = torch.__config__.show()

    def find(pattern: str) -> str | None:
        match = re.search(pattern, shown)
        return match.group(1) if match else None

    return {"torch": torch.__version__, "blas": find(r"BLAS_INFO=(\w+)"),
            "mkl": find(r"Math Kernel Library Version ([\w.]+)"), "onednn": find(r"MKL-DNN (v[\w.]+)"),
            "openmp": find(r"OpenMP (\d+)"), "cuda": torch.version.cuda}


@functools.lru_cache(maxsize=1)
def libraries() -> dict[str, str]:
    """Full version strings of the libraries a cell computes with (a local build tag such as +cu130 kept)."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    import torch
    out["torch"] = torch.__version__
    return out
