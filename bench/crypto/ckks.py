"""CKKS via TenSEAL: full packing into N/2-slot vectors, add-only aggregation on a public context.

A flat vector is cut into `ts.ckks_vector` chunks of exactly N/2 slots (the last one partial), one
framed blob per chunk; `ckks_tensor` (one ciphertext per element) is never used. Neither galois nor
relinearization keys are generated into the serialized material: aggregation only adds, and they would
make the public context several times larger. Decrypted values carry CKKS noise that can leak the
secret key if shared verbatim (IND-CPA^D, Li-Micciancio 2020); round them, e.g. to float32, before
anything derived from them leaves the key holder.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import tenseal as ts

from bench.crypto.params import (Aggregator, CKKSParams, CryptoError, Decryptor, Encryptor, KeyMaterial)


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


class CKKSEncryptor(Encryptor):
    def __init__(self, km: KeyMaterial, party: str):
        params = _params(km)
        super().__init__(party, km, params.slots)
        self.max_abs_value = params.max_abs_value / _max_summands(km)
        self.context = _context(km.public)

    def _encrypt_chunk(self, chunk: np.ndarray) -> bytes:
        return ts.ckks_vector(self.context, chunk.tolist()).serialize()


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
        self.context = _context(km.secret)
        if not self.context.is_private():
            raise CryptoError(party, "the secret material holds no secret key")

    def _decrypt_chunk(self, payload: bytes, what: str, verdict: str) -> np.ndarray:
        try:
            vec = ts.ckks_vector_from(self.context, payload)
        except Exception as exc:
            raise CryptoError(self.party, f"{what} is truncated or garbled ({type(exc).__name__}: {exc}); "
                                          f"{verdict}") from None
        return np.asarray(vec.decrypt(), dtype=np.float64)
