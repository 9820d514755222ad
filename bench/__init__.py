"""LeakBench's harness. A plugin needs only this module: `from bench import Defense, DEFENSES, ...`.

Rooms, lowest first (docs/architecture.md): registry and protocol (the contracts), crypto, data,
models, federation (the engine), run (suites, runner, executors, store), and at the top the CLI,
the catalog and the pytest plugin. The names below are loaded on first use, so `import bench`
stays cheap (`leakbench list` never loads torch).
"""
from __future__ import annotations

import importlib
from typing import Any

from bench.run.numerics import pin

pin()   # before torch is imported: every process that computes cells imports this package first (bench/run/numerics.py)

_API = {
    # registries and the decorator that registers a metric
    "DEFENSES": "bench.registry", "ATTACKS": "bench.registry", "METRICS": "bench.registry",
    "DATASETS": "bench.registry", "MODELS": "bench.registry", "SUITES": "bench.registry",
    # the defense contract and its wire arithmetic
    "Defense": "bench.protocol.defense", "Party": "bench.protocol.defense",
    "dense_payload": "bench.protocol.wire", "hybrid_payload": "bench.protocol.payloads",
    "encrypt_part": "bench.protocol.payloads", "pack": "bench.protocol.payloads", "unpack": "bench.protocol.payloads",
    "sum_plain": "bench.protocol.payloads", "sum_cipher": "bench.protocol.payloads",
    "Aggregation": "bench.protocol.aggregation", "RunningSum": "bench.protocol.aggregation",
    "provision": "bench.crypto.keys",
    # what travels and what the server sees
    "Payload": "bench.protocol.wire", "PlainPart": "bench.protocol.wire", "CipherPart": "bench.protocol.wire",
    "Message": "bench.protocol.wire", "Upload": "bench.protocol.wire",
    "ServerView": "bench.protocol.view", "Knowledge": "bench.protocol.view",
    # the attack contract
    "Attack": "bench.protocol.attack", "Reconstruction": "bench.protocol.attack", "Setting": "bench.protocol.attack",
    # what a dataset loader returns; the checkpoint a model factory reads (checked at suite load)
    "Dataset": "bench.data.loading", "Checkpoint": "bench.models.checkpoints",
    # the metric contract
    "Evidence": "bench.protocol.evidence", "Metric": "bench.protocol.evidence", "Truth": "bench.protocol.evidence",
    "metric": "bench.protocol.evidence", "run_value": "bench.protocol.evidence", "run_metric": "bench.protocol.evidence",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'bench' has no attribute '{name}'")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
