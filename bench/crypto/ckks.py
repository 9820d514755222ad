"""CKKS via TenSEAL: full packing into N/2-slot vectors, add-only aggregation on a public context.

A flat vector is cut into `ts.ckks_vector` chunks of exactly N/2 slots (the last one partial), one
framed blob per chunk; `ckks_tensor` (one ciphertext per element) is never used. Neither galois nor
relinearization keys are generated into the serialized material: aggregation only adds, and they would
make the public context several times larger.

Fixed point on a grid: clients round every value to a multiple of GRID = 2^-21 before encrypting,
and the key holder rounds what it decrypts to the same grid. A sum of grid values is a grid value,
and choose_ckks_params keeps the conservative noise bound of the sum under GRID / 4, so decryption
returns the exact sum of the rounded inputs: no CKKS noise reaches anything derived from it (the
IND-CPA^D hygiene of Li-Micciancio 2020) and a run is reproducible, where raw noise would feed
thresholds (Fisher masks, pruning) differently each run. The rounding moves a value by at most
GRID / 2 = 2.4e-7, inside the 1e-6 error CKKS was accepted with.

Long vectors are encrypted and decrypted chunk-parallel in worker processes (bench/crypto/parallel.py
says why processes); the chunks and bytes are the serial path's, and a worker runs the same
module-level function the serial path does.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import tenseal as ts

from bench.crypto.parallel import map_chunks
from bench.crypto.params import GRID, Aggregator, CKKSParams, CryptoError, Decryptor, Encryptor, KeyMaterial, frame


def to_grid(values: np.ndarray) -> np.ndarray:
    """Nearest multiple of GRID (exact in float64 for |values| < 2^31 * GRID)."""
    return np.rint(np.asarray(values, dtype=np.float64) / GRID) * GRID


DEFAULT_MAX_SUMMANDS = 64


def ckks_keygen(params: CKKSParams, max_summands: int = DEFAULT_MAX_SUMMANDS) -> KeyMaterial:
    """Fresh in-memory key; public bytes carry no secret key, secret bytes carry it.

    `max_summands` is the key's sum headroom: each encrypted value is bounded by
    max_abs_value / max_summands and the server refuses to add more uploads than that, so a
    sum can never pass the decodable range (CKKS wraps silently modulo the first prime).
    """
    if not isinstance(max_summands, int) or isinstance(max_summands, bool) or max_summands < 1:
        raise ValueError(f"max_summands must be an int >= 1, got {max_summands!r}")
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, params.poly_modulus_degree,
                     coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes))
    ctx.global_scale = 2.0 ** params.scale_bits
    keep = dict(save_public_key=True, save_galois_keys=False, save_relin_keys=False)
    public = ctx.serialize(save_secret_key=False, **keep)
    secret = ctx.serialize(save_secret_key=True, **keep)
    return KeyMaterial("ckks", public, secret, {**params.as_dict(), "max_summands": max_summands})


@lru_cache(maxsize=8)
def _context(data: bytes) -> ts.Context:
    """Deserialize a context once per key: parties are reopened every round, contexts are never mutated."""
    return ts.context_from(data)


def _params(km: KeyMaterial) -> CKKSParams:
    p = km.params
    return CKKSParams(p["name"], p["poly_modulus_degree"], tuple(p["coeff_mod_bit_sizes"]), p["scale_bits"],
                      p.get("security_bits", 128))


def _max_summands(km: KeyMaterial) -> int:
    return int(km.params.get("max_summands", 1))


def _encrypt_one(ctx: ts.Context, chunk: np.ndarray) -> bytes:
    return ts.ckks_vector(ctx, to_grid(chunk).tolist()).serialize()


def _decrypt_one(ctx: ts.Context, payload: bytes, party: str, what: str, verdict: str) -> np.ndarray:
    try:
        vec = ts.ckks_vector_from(ctx, payload)
    except Exception as exc:  # SEAL/protobuf raise ValueError or RuntimeError
        raise CryptoError(party, f"{what} is truncated or garbled ({type(exc).__name__}: {exc}); "
                                 f"{verdict}") from None
    return to_grid(vec.decrypt())


def encrypt_group(public: bytes, fingerprint: bytes, start: int, chunks: list[np.ndarray]) -> list[bytes]:
    """Framed ciphertexts of consecutive chunks (`start`, map_chunks' group offset, is not needed)."""
    ctx = _context(public)
    return [frame(fingerprint, _encrypt_one(ctx, c)) for c in chunks]


def decrypt_group(secret: bytes, party: str, verdict: str, start: int, payloads: list[bytes]) -> list[np.ndarray]:
    """Grid-rounded values of consecutive unframed payloads, the first being ciphertext `start`."""
    ctx = _context(secret)
    return [_decrypt_one(ctx, p, party, f"ciphertext {i} of the aggregate", verdict)
            for i, p in enumerate(payloads, start)]


class CKKSEncryptor(Encryptor):
    def __init__(self, km: KeyMaterial, party: str):
        params = _params(km)
        super().__init__(party, km, params.slots)
        self.max_abs_value = params.max_abs_value / _max_summands(km)
        self.public = km.public
        self.context = _context(km.public)

    def _encrypt_chunks(self, chunks: list[np.ndarray]) -> list[bytes]:
        return map_chunks(encrypt_group, (self.public, self.fingerprint), chunks)

    def _encrypt_chunk(self, chunk: np.ndarray) -> bytes:
        return _encrypt_one(self.context, chunk)


class CKKSAggregator(Aggregator):
    def __init__(self, km: KeyMaterial, party: str):
        super().__init__(party, km, _params(km).slots)
        self.max_summands = _max_summands(km)
        self.context = _context(km.public)
        if self.context.is_private():
            raise CryptoError(party, "the public context carries a secret key; the aggregation server "
                                     "must not be able to decrypt")

    def _load(self, payload: bytes, what: str, verdict: str) -> tuple[Any, int]:
        try:
            vec = ts.ckks_vector_from(self.context, payload)
        except Exception as exc:  # SEAL/protobuf raise ValueError or RuntimeError
            raise CryptoError(self.party, f"{what} is truncated or garbled ({type(exc).__name__}: {exc}); "
                                          f"{verdict}") from None
        size = vec.size()
        if not 1 <= size <= self.values_per_blob:
            raise CryptoError(self.party, f"{what} holds {size} values, outside 1..{self.values_per_blob}; "
                                          f"{verdict}")
        return vec, size

    def _add(self, acc: Any, item: Any) -> Any:
        acc += item
        return acc

    def _dump(self, acc: Any) -> bytes:
        return acc.serialize()


class CKKSDecryptor(Decryptor):
    def __init__(self, km: KeyMaterial, party: str):
        super().__init__(party, km, _params(km).slots)
        self.secret = km.secret
        self.context = _context(km.secret)
        if not self.context.is_private():
            raise CryptoError(party, "the secret material holds no secret key")

    def _decrypt_chunks(self, payloads: list[bytes], verdict: str) -> list[np.ndarray]:
        return map_chunks(decrypt_group, (self.secret, self.party, verdict), payloads)

    def _decrypt_chunk(self, payload: bytes, what: str, verdict: str) -> np.ndarray:
        return _decrypt_one(self.context, payload, self.party, what, verdict)
