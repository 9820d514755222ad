"""Chunk-parallel CKKS: the parallel path's chunks, byte format and values are the serial path's."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import tenseal as ts

from bench.crypto import PARAM_SETS, CryptoError, ckks_keygen, open_aggregator, open_decryptor, open_encryptor, parallel
from bench.crypto.ckks import to_grid
from bench.crypto.params import HEADER_BYTES, frame

PARAMS = PARAM_SETS["n4096"]
LENGTH = (parallel.MIN_PARALLEL_CHUNKS + 4) * PARAMS.slots + 123   # enough chunks to go parallel, last one partial


@pytest.fixture(scope="module")
def km():
    return ckks_keygen(PARAMS)


@pytest.fixture(scope="module")
def values():
    return np.random.default_rng(7).normal(0, 0.05, LENGTH)


def _encrypt(km, x, workers: int, monkeypatch) -> list[bytes]:
    monkeypatch.setenv(parallel.WORKERS_ENV, str(workers))
    return open_encryptor(km.public_only(), "client-0").encrypt(x)


def _decrypt(km, blobs, length, workers: int, monkeypatch) -> np.ndarray:
    monkeypatch.setenv(parallel.WORKERS_ENV, str(workers))
    return open_decryptor(km, "key server").decrypt(blobs, length)


def _payload_sizes(km, blobs) -> list[int]:
    ctx = ts.context_from(km.public)
    return [ts.ckks_vector_from(ctx, b[HEADER_BYTES:]).size() for b in blobs]


def _pid(start: int, items: list) -> list[int]:
    return [os.getpid()] * len(items)


def test_parallel_runs_in_other_processes():
    pids = parallel.map_chunks(_pid, (), list(range(parallel.MIN_PARALLEL_CHUNKS)), workers=2)
    assert len(pids) == parallel.MIN_PARALLEL_CHUNKS
    assert os.getpid() not in pids
    assert parallel.map_chunks(_pid, (), list(range(50)), workers=1) == [os.getpid()] * 50


def _pids_in_child(_):
    return os.getpid(), parallel.map_chunks(_pid, (), list(range(2 * parallel.MIN_PARALLEL_CHUNKS)), workers=2)


def test_a_pool_worker_encrypts_in_process():
    """A cell running in a --workers process never nests a pool (a nested pool hangs its exit)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
        child, pids = pool.submit(_pids_in_child, 0).result(timeout=60)
    assert set(pids) == {child}


def test_groups_keep_order_and_offsets():
    got = parallel.map_chunks(_offsets, (10,), list(range(37)), workers=3)
    assert got == [10 + i for i in range(37)]


def _offsets(base: int, start: int, items: list) -> list[int]:
    return [base + start + k for k in range(len(items))]


def test_parallel_and_serial_encrypt_same_chunking_and_bytes(km, values, monkeypatch):
    serial = _encrypt(km, values, 1, monkeypatch)
    again = _encrypt(km, values, 1, monkeypatch)
    par = _encrypt(km, values, 2, monkeypatch)
    assert len(par) == len(serial) == -(-LENGTH // PARAMS.slots)
    assert _payload_sizes(km, par) == _payload_sizes(km, serial) == [PARAMS.slots] * (len(serial) - 1) + [123]
    assert all(p[:8] == s[:8] for p, s in zip(par, serial))   # same key fingerprint in every frame
    # CKKS encryption is randomized and SEAL compresses its output: two serial runs already differ by a
    # few dozen bytes per chunk; the parallel path must differ from serial by no more than that
    spread = max(abs(len(a) - len(b)) for a, b in zip(serial, again))
    gap = max(abs(len(a) - len(b)) for a, b in zip(serial, par))
    assert gap <= max(4 * spread, 64) and gap <= 0.002 * len(serial[0]), (gap, spread)
    assert abs(sum(map(len, par)) - sum(map(len, serial))) <= 0.001 * sum(map(len, serial))
    # both decrypt exactly to the grid-rounded inputs, either way round
    for blobs in (serial, par):
        for workers in (1, 2):
            np.testing.assert_array_equal(_decrypt(km, blobs, LENGTH, workers, monkeypatch), to_grid(values))


def test_parallel_decrypt_is_bit_identical(km, values, monkeypatch):
    blobs = _encrypt(km, values, 2, monkeypatch)
    agg = open_aggregator(km.public_only(), "aggregation server").add([blobs, _encrypt(km, values, 1, monkeypatch)])
    one = _decrypt(km, agg, LENGTH, 1, monkeypatch)
    two = _decrypt(km, agg, LENGTH, 2, monkeypatch)
    assert one.dtype == two.dtype == np.float64
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, 2 * to_grid(values))


def test_worker_count_one_and_short_vectors_stay_in_process(km, monkeypatch):
    x = np.linspace(-1, 1, 3 * PARAMS.slots)
    for workers in (1, 2):
        blobs = _encrypt(km, x, workers, monkeypatch)
        assert len(blobs) == 3
        np.testing.assert_array_equal(_decrypt(km, blobs, x.size, workers, monkeypatch), to_grid(x))


def test_garbled_payload_named_from_a_worker(km, values, monkeypatch):
    blobs = _encrypt(km, values, 2, monkeypatch)
    bad = len(blobs) - 2
    payload = blobs[bad][HEADER_BYTES:]
    blobs[bad] = frame(km.fingerprint, payload[:len(payload) // 2])   # passes the checksum, fails in SEAL
    with pytest.raises(CryptoError, match=f"^key server: ciphertext {bad} of the aggregate is truncated or garbled"):
        _decrypt(km, blobs, LENGTH, 2, monkeypatch)


def test_crypto_error_pickles():
    err = pickle.loads(pickle.dumps(CryptoError("key server", "no")))
    assert (err.party, err.problem, str(err)) == ("key server", "no", "key server: no")


@pytest.mark.parametrize("raw", ["0", "-2", "two"])
def test_bad_worker_setting_refused(raw, monkeypatch):
    monkeypatch.setenv(parallel.WORKERS_ENV, raw)
    with pytest.raises(ValueError, match="LEAKBENCH_HE_WORKERS must be an integer >= 1"):
        parallel.he_workers()


def test_default_workers_are_the_usable_cores(monkeypatch):
    monkeypatch.delenv(parallel.WORKERS_ENV, raising=False)
    assert parallel.he_workers() == len(os.sched_getaffinity(0))
