"""Crypto layer: round trips, aggregation precision, the server's inability to decrypt, and blob rejection."""
from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.crypto import (
    PARAM_SETS,
    CKKSParams,
    CryptoError,
    KeyMaterial,
    choose_ckks_params,
    ckks_keygen,
    open_aggregator,
    open_decryptor,
    open_encryptor,
    paillier_keygen,
)
from bench.crypto.ckks import to_grid
from bench.crypto.params import GRID, HEADER_BYTES

TEST_ONLY_PAILLIER_BITS = 512  # far below 2048: fast, and flagged test-only in the key's params


@pytest.fixture(scope="module")
def ckks_km() -> KeyMaterial:
    return ckks_keygen(PARAM_SETS["n4096"])


@pytest.fixture(scope="module")
def other_ckks_km() -> KeyMaterial:
    return ckks_keygen(PARAM_SETS["n4096"])


@pytest.fixture(scope="module")
def paillier_km() -> KeyMaterial:
    return paillier_keygen(TEST_ONLY_PAILLIER_BITS)


def _upload(km: KeyMaterial, values: np.ndarray) -> list[bytes]:
    return open_encryptor(km.public_only(), "client-0").encrypt(values)


# ------------------------------------------------------------------------- parameter sets

def test_param_sets_meet_128_bit_bound():
    bound = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
    for params in PARAM_SETS.values():
        assert params.security_bits == 128
        assert sum(params.coeff_mod_bit_sizes) <= bound[params.poly_modulus_degree]
        assert params.as_dict()["slots"] == params.slots == params.poly_modulus_degree // 2


def test_over_budget_params_raise():
    with pytest.raises(ValueError, match="exceeds 218"):
        CKKSParams("too-big", 8192, (60, 60, 60, 60), 40)
    with pytest.raises(ValueError, match="scale_bits"):
        CKKSParams("low-scale", 8192, (60, 40, 60), 10)


def test_choose_params():
    assert choose_ckks_params(20).name == PARAM_SETS["n4096"].name
    assert choose_ckks_params(20, needs_multiply=True).multiply_depth >= 1
    assert choose_ckks_params(20).expected_error(20) < 1e-7
    with pytest.raises(ValueError):
        choose_ckks_params(10**9)


# ------------------------------------------------------------------------- CKKS

def test_ckks_round_trip(ckks_km):
    x = np.random.default_rng(0).normal(0, 0.05, 5000)
    blobs = _upload(ckks_km, x)
    assert len(blobs) == 3  # 2048 + 2048 + 904 slots
    out = open_decryptor(ckks_km, "client-0").decrypt(blobs, x.size)
    assert out.dtype == np.float64 and out.shape == x.shape
    np.testing.assert_array_equal(out, to_grid(x))         # exactly the grid-rounded input: no CKKS noise
    assert np.abs(out - x).max() <= GRID / 2


def test_ckks_twenty_clients_weighted_sum(ckks_km):
    rng = np.random.default_rng(1)
    updates = rng.normal(0, 0.05, (20, 10_000))
    weights = rng.uniform(1, 5, 20)
    weights /= weights.sum()
    uploads = [open_encryptor(ckks_km.public_only(), f"client-{i}").encrypt(w * u)
               for i, (w, u) in enumerate(zip(weights, updates))]
    total = open_aggregator(ckks_km.public_only(), "aggregation server").add(uploads)
    out = open_decryptor(ckks_km, "client-0").decrypt(total, 10_000)
    np.testing.assert_array_equal(out, sum(to_grid(w * u) for w, u in zip(weights, updates)))
    assert np.abs(out - weights @ updates).max() <= 20 * GRID / 2
    again = open_aggregator(ckks_km.public_only(), "aggregation server").add(
        [open_encryptor(ckks_km.public_only(), f"client-{i}").encrypt(w * u)
         for i, (w, u) in enumerate(zip(weights, updates))])
    np.testing.assert_array_equal(open_decryptor(ckks_km, "client-0").decrypt(again, 10_000), out)  # fresh noise


def test_server_cannot_decrypt(ckks_km):
    server_km = ckks_km.public_only()
    assert server_km.secret is None and not server_km.can_decrypt
    agg = open_aggregator(server_km, "aggregation server")
    assert not agg.context.is_private()
    blob = agg.add([_upload(ckks_km, np.ones(10))])[0]
    vec = ts.ckks_vector_from(agg.context, blob[HEADER_BYTES:])
    with pytest.raises(ValueError, match="doesn't hold a secret_key"):
        vec.decrypt()
    with pytest.raises(CryptoError, match="^aggregation server: holds no secret key"):
        open_decryptor(server_km, "aggregation server")
    with pytest.raises(CryptoError, match="must hold public material only"):
        open_aggregator(ckks_km, "aggregation server")


@pytest.mark.parametrize("scheme", ["ckks", "paillier"])
def test_bad_blobs_rejected(scheme, ckks_km, other_ckks_km, paillier_km):
    km = ckks_km if scheme == "ckks" else paillier_km
    agg = open_aggregator(km.public_only(), "aggregation server")
    x = np.linspace(-1, 1, 300)
    good = _upload(km, x)
    n = len(good)
    cases = {
        "truncated": good[:-1] + [good[-1][: len(good[-1]) // 2]],
        "header only": good[:-1] + [good[-1][:HEADER_BYTES]],
        "garbled": good[:-1] + [good[-1][:-40] + bytes(b ^ 0x5A for b in good[-1][-40:])],
        "unequal": good + good[:1],
    }
    if scheme == "ckks":
        cases["other key"] = _upload(other_ckks_km, x)
    expect = {"truncated": "truncated or garbled", "header only": "truncated or garbled",
              "garbled": "truncated or garbled", "unequal": "uploads must be equally long",
              "other key": "encrypted under another key"}
    for case, bad in cases.items():
        with pytest.raises(CryptoError, match=expect[case]) as err:
            agg.add([good, bad], ["client-1", "client-2"])
        assert str(err.value).startswith("aggregation server: ")
        assert "client-2" in str(err.value), case
        if case != "unequal":
            assert f"ciphertext {n - 1 if case != 'other key' else 0} of client-2's upload" in str(err.value)


def test_ckks_unknown_blob_without_checksum_rejected(ckks_km):
    """A correctly framed blob whose body SEAL cannot parse is still refused by the loader."""
    from bench.crypto.params import frame, key_fingerprint
    agg = open_aggregator(ckks_km.public_only(), "aggregation server")
    junk = frame(key_fingerprint(ckks_km.public), b"x" * 100)
    with pytest.raises(CryptoError, match="ciphertext 0 of client-0's upload"):
        agg.add([[junk]])


def test_decryptor_checks_blob_count(ckks_km):
    blobs = _upload(ckks_km, np.zeros(3000))
    with pytest.raises(CryptoError, match="need 1 ciphertexts"):
        open_decryptor(ckks_km, "key server").decrypt(blobs, 100)


def test_encryptor_rejects_bad_input(ckks_km):
    enc = open_encryptor(ckks_km.public_only(), "client-3")
    with pytest.raises(CryptoError, match="^client-3: cannot encrypt non-finite"):
        enc.encrypt(np.array([0.0, np.nan]))
    with pytest.raises(CryptoError, match="1-D"):
        enc.encrypt(np.zeros((2, 2)))
    with pytest.raises(CryptoError, match="exceeds"):
        enc.encrypt(np.array([1e9]))
    assert enc.encrypt(np.zeros(0)) == []


@settings(max_examples=12, deadline=None)
@given(length=st.integers(1, 3 * PARAM_SETS["n4096"].slots), seed=st.integers(0, 2**16))
def test_ckks_round_trip_property(ckks_km, length, seed):
    x = np.random.default_rng(seed).normal(0, 1.0, length).astype(np.float32)
    blobs = _upload(ckks_km, x)
    assert len(blobs) == -(-length // PARAM_SETS["n4096"].slots)
    out = open_decryptor(ckks_km, "client-0").decrypt(blobs, length)
    assert out.shape == (length,)
    np.testing.assert_array_equal(out, to_grid(x))


# ------------------------------------------------------------------------- Paillier

def test_paillier_round_trip_and_sum(paillier_km):
    assert paillier_km.params["test_only_key_size"] is True
    rng = np.random.default_rng(2)
    updates = rng.normal(0, 0.05, (3, 300))
    updates[0, :5] = [-1.5, -1e-9, 0.0, 1e-9, 1.5]
    uploads = [open_encryptor(paillier_km.public_only(), f"client-{i}").encrypt(u) for i, u in enumerate(updates)]
    assert [len(b) for b in uploads[0]] == [HEADER_BYTES + 256 * 128, HEADER_BYTES + 44 * 128]
    single = open_decryptor(paillier_km, "client-0").decrypt(uploads[0], 300)
    assert np.abs(single - updates[0]).max() < 1e-11
    total = open_aggregator(paillier_km.public_only(), "aggregation server").add(uploads)
    out = open_decryptor(paillier_km, "client-0").decrypt(total, 300)
    assert np.abs(out - updates.sum(0)).max() < 1e-11


def test_paillier_rejects_value_out_of_range(paillier_km):
    from bench.crypto.params import frame, key_fingerprint
    agg = open_aggregator(paillier_km.public_only(), "aggregation server")
    bad = frame(key_fingerprint(paillier_km.public), b"\xff" * 128)
    with pytest.raises(CryptoError, match="value 0 of ciphertext 0 of client-0's upload is not a valid"):
        agg.add([[bad]])
    with pytest.raises(CryptoError, match="holds no secret key"):
        open_decryptor(paillier_km.public_only(), "aggregation server")


def test_paillier_keygen_validates():
    with pytest.raises(ValueError):
        paillier_keygen(256)
