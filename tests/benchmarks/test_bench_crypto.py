"""Crypto layer cost: the project's encryptor must cost no more than raw TenSEAL, and bytes/param per set.

Run with `pytest tests/benchmarks/test_bench_crypto.py -m heavy`.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import tenseal as ts

from bench.crypto import PARAM_SETS, ckks_keygen, open_encryptor

VECTOR_LEN = 100_000
REPEATS = 9  # interleaved runs per side, alternating which goes first; medians are compared


def _raw_encrypt(ctx: ts.Context, flat: np.ndarray, slots: int) -> list[bytes]:
    """What a direct TenSEAL user would write: N/2-slot ckks_vector chunks, serialized."""
    return [ts.ckks_vector(ctx, flat[i:i + slots].tolist()).serialize() for i in range(0, flat.size, slots)]


@pytest.mark.heavy
def test_encrypt_overhead_vs_raw_tenseal(benchmark):
    params = PARAM_SETS["n8192"]
    km = ckks_keygen(params)
    enc = open_encryptor(km.public_only(), "client-0")
    raw_ctx = ts.context_from(km.public)
    flat = np.random.default_rng(0).normal(0, 0.05, VECTOR_LEN)

    timings: dict[str, list[float]] = {"ours": [], "raw": []}
    outputs: dict[str, list[bytes]] = {}
    runs = {"ours": lambda: enc.encrypt(flat), "raw": lambda: _raw_encrypt(raw_ctx, flat, params.slots)}
    for k in range(REPEATS):
        for side in (["ours", "raw"] if k % 2 == 0 else ["raw", "ours"]):
            t = time.perf_counter()
            outputs[side] = runs[side]()
            timings[side].append(time.perf_counter() - t)
    ours_s, raw_s, ours, raw = timings["ours"], timings["raw"], outputs["ours"], outputs["raw"]
    ours_med, raw_med = statistics.median(ours_s), statistics.median(raw_s)
    ours_bytes, raw_bytes = sum(map(len, ours)), sum(map(len, raw))

    benchmark.extra_info.update({
        "params": params.as_dict(), "values": VECTOR_LEN, "ciphertexts": len(ours),
        "ours_median_s": ours_med, "raw_median_s": raw_med, "time_ratio": ours_med / raw_med,
        "ours_bytes": ours_bytes, "raw_bytes": raw_bytes, "bytes_ratio": ours_bytes / raw_bytes,
        "ours_bytes_per_param": ours_bytes / VECTOR_LEN,
    })
    benchmark.pedantic(enc.encrypt, args=(flat,), rounds=3, iterations=1)

    assert len(ours) == len(raw) == -(-VECTOR_LEN // params.slots)
    assert ours_med <= 1.10 * raw_med, f"encrypt median {ours_med:.3f}s vs raw TenSEAL {raw_med:.3f}s"
    assert ours_bytes <= 1.10 * raw_bytes


@pytest.mark.heavy
@pytest.mark.parametrize("set_name", list(PARAM_SETS))
def test_bytes_per_param(benchmark, set_name):
    params = PARAM_SETS[set_name]
    km = ckks_keygen(params)
    enc = open_encryptor(km.public_only(), "client-0")
    flat = np.random.default_rng(1).normal(0, 0.05, VECTOR_LEN)

    blobs = benchmark.pedantic(enc.encrypt, args=(flat,), rounds=3, iterations=1)
    total = sum(map(len, blobs))
    per_param = total / VECTOR_LEN
    per_slot = total / (len(blobs) * params.slots)  # fully packed cost, without the last chunk's empty slots
    benchmark.extra_info.update({
        "params": params.as_dict(), "values": VECTOR_LEN, "ciphertexts": len(blobs), "bytes": total,
        "bytes_per_param": per_param, "bytes_per_slot": per_slot, "expansion_vs_fp32": per_param / 4,
        "public_context_bytes": len(km.public), "secret_context_bytes": len(km.secret),
    })
    assert 20 <= per_slot <= per_param <= 150
