"""The cost model of sliced Paillier (defenses/sensecrypt/slices.py) against whole encryptions of other sizes.

The model: a client's encryption time is k * t_enc, with t_enc measured on a 256-value slice; decryption
likewise. Here one key encrypts (and decrypts) 256 values and two larger counts whole (4,096 and 16,384 at
1024 bits, 2,048 and 8,192 at 2048), interleaved so a busy
machine slows every size alike, and the 256-value slice's per-value time predicts the larger ones.
Prints a table; the pages quote it. Run with `pytest tests/benchmarks/test_bench_paillier_slices.py -m heavy`.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from bench.crypto import open_decryptor, open_encryptor, paillier_keygen

SLICE, REPEATS = 256, 2
SIZES = {1024: (4096, 16384), 2048: (2048, 8192)}


def _per_value(enc, dec, values: np.ndarray) -> tuple[float, float, int]:
    started = time.perf_counter()
    blobs = enc.encrypt(values)
    t_enc = time.perf_counter() - started
    started = time.perf_counter()
    out = dec.decrypt(blobs, values.size)
    t_dec = time.perf_counter() - started
    assert np.abs(out - values).max() < 1e-9
    return t_enc / values.size, t_dec / values.size, sum(len(b) for b in blobs)


@pytest.mark.heavy
@pytest.mark.parametrize("key_bits", [1024, 2048])
def test_slice_predicts_whole_encryptions(key_bits, capsys):
    km = paillier_keygen(key_bits)
    enc, dec = open_encryptor(km.public_only(), "client"), open_decryptor(km, "key server")
    rng = np.random.default_rng(0)
    measured: dict[int, list[tuple[float, float, int]]] = {n: [] for n in (SLICE, *SIZES[key_bits])}
    for _ in range(REPEATS):
        for n in (SLICE, *SIZES[key_bits]):
            measured[n].append(_per_value(enc, dec, rng.normal(0, 0.01, n)))
    enc_slice = statistics.median(m[0] for m in measured[SLICE])
    dec_slice = statistics.median(m[1] for m in measured[SLICE])
    bytes_slice = measured[SLICE][0][2] / SLICE
    with capsys.disabled():
        print(f"\n{key_bits}-bit: slice of {SLICE}: encrypt {enc_slice * 1e3:.2f} ms, decrypt {dec_slice * 1e3:.2f} ms, "
              f"{bytes_slice:.1f} B per value")
        for n in SIZES[key_bits]:
            t_enc = statistics.median(m[0] for m in measured[n])
            t_dec = statistics.median(m[1] for m in measured[n])
            print(f"  {n:>6} values whole: encrypt {t_enc * n:.1f} s (model {enc_slice * n:.1f} s, "
                  f"{t_enc / enc_slice - 1:+.1%}), decrypt {t_dec * n:.1f} s (model {dec_slice * n:.1f} s, "
                  f"{t_dec / dec_slice - 1:+.1%}), bytes {measured[n][0][2]:,} (model {bytes_slice * n:,.0f})")
            assert abs(t_enc / enc_slice - 1) < 0.25 and abs(t_dec / dec_slice - 1) < 0.25
            assert abs(measured[n][0][2] / (bytes_slice * n) - 1) < 0.01
