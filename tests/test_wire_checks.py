"""Property tests of the wire and crypto checks: mask positions, declared lengths, CKKS sum headroom."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bench.crypto import PARAM_SETS, CryptoError, ckks_keygen, open_aggregator, open_decryptor, open_encryptor
from bench.protocol.payloads import sum_plain
from bench.protocol.wire import CipherPart, Payload, PlainPart, Upload, WireError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=4)
def _key(max_summands: int):
    return ckks_keygen(PARAM_SETS["n4096"], max_summands=max_summands)


def _upload(sender: str, values: np.ndarray, mask: np.ndarray, shape: tuple[int, ...]) -> Upload:
    part = PlainPart(values.astype("<f4").tobytes(), shape, mask)
    return Upload(sender, 0, 1.0, Payload(plain={"w": part}))


@st.composite
def _two_masks_same_count(draw):
    size = draw(st.integers(2, 64))
    count = draw(st.integers(1, size - 1))
    a = np.zeros(size, bool)
    a[draw(st.permutations(range(size)))[:count]] = True
    b = np.zeros(size, bool)
    b[draw(st.permutations(range(size)))[:count]] = True
    return a, b


@SETTINGS
@given(_two_masks_same_count(), st.integers(0, 2**31 - 1))
def test_sum_plain_refuses_equal_count_masks_at_other_positions(masks, seed):
    a, b = masks
    rng = np.random.default_rng(seed)
    va, vb = rng.normal(size=a.sum()), rng.normal(size=b.sum())
    uploads = [_upload("client-0", va, a, (a.size,)), _upload("client-3", vb, b, (b.size,))]
    if np.array_equal(a, b):
        out = sum_plain(uploads)["w"]
        np.testing.assert_allclose(out.values(), (va + vb).astype(np.float32), rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(WireError, match=r"^client-3: the plaintext mask of 'w' differs from client-0's "
                                            r"at position \d+"):
            sum_plain(uploads)


@SETTINGS
@given(st.integers(1, 40), st.integers(-3, 3).filter(lambda d: d != 0))
def test_plain_part_declared_length_mismatch_names_the_sender(size, delta):
    assume(size + delta >= 0)
    good = _upload("client-0", np.ones(size), None, (size,))
    bad = _upload("client-2", np.ones(size + delta), None, (size,))
    with pytest.raises(WireError, match=rf"^client-2: 'w' carries {4 * (size + delta)} bytes but its layout "
                                        rf"declares {size} float32 values"):
        sum_plain([good, bad])


@SETTINGS
@given(st.integers(2, 40), st.integers(-3, 3).filter(lambda d: d != 0))
def test_wrong_length_mask_names_the_sender(size, delta):
    assume(size + delta >= 1)
    good = _upload("client-0", np.ones(size), np.ones(size, bool), (size,))
    bad = _upload("client-1", np.ones(size), np.ones(size + delta, bool), (size,))
    with pytest.raises(WireError, match=rf"^client-1: the mask of 'w' has {size + delta} entries but the "
                                        rf"parameter \({size},\) has {size}"):
        sum_plain([good, bad])


@SETTINGS
@given(st.integers(1, 300), st.integers(-300, 300).filter(lambda d: d != 0))
def test_decryptor_refuses_any_declared_length_but_the_true_one(n, delta):
    km = _key(8)
    blobs = open_encryptor(km, "client-0").encrypt(np.linspace(-1, 1, n))
    dec = open_decryptor(km, "key-server")
    np.testing.assert_allclose(dec.decrypt(blobs, n), np.linspace(-1, 1, n), atol=1e-6)
    declared = n + delta
    assume(declared >= 0)
    with pytest.raises(CryptoError, match=r"^key-server: "):
        dec.decrypt(blobs, declared)


@SETTINGS
@given(st.integers(1, 30), st.integers(1, 20))
def test_cipher_layout_must_select_the_declared_length(count, declared):
    mask = np.zeros(40, bool)
    mask[:count] = True
    part = CipherPart("ckks", (), (("w", mask),), declared)
    if count == declared:
        part.check("client-5", {"w": (40,)})
    else:
        with pytest.raises(WireError, match=rf"^client-5: the ckks part declares {declared} values but its "
                                            rf"layout selects {count}"):
            part.check("client-5", {"w": (40,)})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 6), st.integers(1, 12), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_ckks_sums_within_headroom_decode_and_beyond_it_are_refused(max_summands, k, fill, seed):
    km = _key(max_summands)
    enc = open_encryptor(km, "client-0")
    bound = enc.max_abs_value
    assert bound * max_summands <= PARAM_SETS["n4096"].max_abs_value   # the sum stays decodable
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-1, 1, 8) * bound * fill for _ in range(k)]
    uploads = [open_encryptor(km, f"client-{i}").encrypt(v) for i, v in enumerate(values)]
    server = open_aggregator(km.public_only(), "server")
    if k > max_summands:
        with pytest.raises(CryptoError, match=rf"^server: {k} uploads exceed this key's sum headroom of "
                                              rf"{max_summands} summands"):
            server.add(uploads)
        return
    total = open_decryptor(km, "key-server").decrypt(server.add(uploads), 8)
    np.testing.assert_allclose(total, np.sum(values, axis=0), atol=1e-6 * max(1.0, bound))
    with pytest.raises(CryptoError, match=r"^client-0: value magnitude .* exceeds"):
        enc.encrypt(np.array([bound * 1.5]))


def test_un_weighted_uploads_beyond_headroom_no_longer_overflow_silently():
    """37 uploads of large un-weighted values: refused by the server instead of decrypting to garbage."""
    km = _key(4)
    big = np.full(4, open_encryptor(km, "client-0").max_abs_value)
    uploads = [open_encryptor(km, f"client-{i}").encrypt(big) for i in range(37)]
    with pytest.raises(CryptoError, match="37 uploads exceed"):
        open_aggregator(km.public_only(), "server").add(uploads)


def test_server_view_names_the_sender_of_a_bad_mask():
    from bench.protocol.view import ServerView
    part = PlainPart(np.ones(3, "<f4").tobytes(), (2, 2), np.array([True, True, True], bool))
    with pytest.raises(WireError, match=r"^client-7: the mask of 'w' has 3 entries"):
        ServerView.of(Upload("client-7", 0, 1.0, Payload(plain={"w": part})), {"w": (2, 2)})
    assert torch.isnan(ServerView.of(Upload("client-7", 0, 1.0, Payload()), {"w": (2, 2)}).values["w"]).all()
