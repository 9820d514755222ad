"""Crypto layer: key generation and the three party roles (client encrypts, server adds, key holder decrypts).

Defenses only see `KeyMaterial` and the roles opened from it, so the threat model is enforced here:
the aggregation server refuses material that carries a secret key, and decryption needs one.
"""
from __future__ import annotations

from bench.crypto.ckks import CKKSAggregator, CKKSDecryptor, CKKSEncryptor, ckks_keygen
from bench.crypto.paillier import PaillierAggregator, PaillierDecryptor, PaillierEncryptor, paillier_keygen
from bench.crypto.params import (
    PARAM_SETS,
    Aggregator,
    CKKSParams,
    CryptoError,
    Decryptor,
    Encryptor,
    KeyMaterial,
    choose_ckks_params,
)

__all__ = ["CryptoError", "CKKSParams", "PARAM_SETS", "choose_ckks_params", "KeyMaterial", "ckks_keygen",
           "paillier_keygen", "Encryptor", "Aggregator", "Decryptor", "open_encryptor", "open_aggregator",
           "open_decryptor"]

_ROLES = {
    "ckks": (CKKSEncryptor, CKKSAggregator, CKKSDecryptor),
    "paillier": (PaillierEncryptor, PaillierAggregator, PaillierDecryptor),
}


def _roles(km: KeyMaterial, party: str) -> tuple[type, type, type]:
    if not isinstance(km, KeyMaterial):
        raise CryptoError(party, f"expected KeyMaterial, got {type(km).__name__}")
    if km.scheme not in _ROLES:
        raise CryptoError(party, f"unknown scheme '{km.scheme}'; known: {sorted(_ROLES)}")
    return _ROLES[km.scheme]


def open_encryptor(km: KeyMaterial, party: str) -> Encryptor:
    """Client-side encryptor; uses only the public part of `km`."""
    return _roles(km, party)[0](km, party)


def open_aggregator(km: KeyMaterial, party: str) -> Aggregator:
    """Server-side adder; refuses material with a secret key (a server holding it voids the defense)."""
    cls = _roles(km, party)[1]
    if km.secret is not None:
        raise CryptoError(party, f"was handed {km.scheme} material with a secret key; the aggregation server "
                                 f"must hold public material only (KeyMaterial.public_only())")
    return cls(km, party)


def open_decryptor(km: KeyMaterial, party: str) -> Decryptor:
    """Decryptor for a key holder; CryptoError if `km` is public-only."""
    cls = _roles(km, party)[2]
    if km.secret is None:
        raise CryptoError(party, f"holds no secret key for this {km.scheme} key, so it cannot decrypt; "
                                 f"only the key holder can")
    return cls(km, party)
