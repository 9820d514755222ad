"""Pairwise additive masks (Bonawitz et al., CCS 2017, without dropout recovery): the server learns the sum only.

Every pair of clients agrees on a seed by X25519 key agreement (the public keys travel through the
server, the shared secrets never do), HKDF-SHA256 turns it into a key, and a ChaCha20 keystream under a
per-round nonce expands it into a mask over the ring Z_2^64. Client i uploads its fixed-point vector plus
the masks it shares with every j > i minus those with every j < i: each masked upload is uniformly
distributed to anyone without the seeds, and the masks cancel in the sum of all uploads of the round.
Values are fixed point with FRACTION_BITS fractional bits, two's complement: exact to 2^-32 per value,
and any sum whose magnitude stays under 2^31 decodes correctly.
"""
from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FRACTION_BITS = 32
RING = np.uint64


def keypair() -> tuple[X25519PrivateKey, bytes]:
    """A client's key-agreement secret and the 32 public bytes it sends through the server."""
    secret = X25519PrivateKey.generate()
    return secret, secret.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def shared_key(secret: X25519PrivateKey, their_public: bytes) -> bytes:
    """The pair's 32-byte mask key: X25519 agreement, then HKDF-SHA256."""
    agreed = secret.exchange(X25519PublicKey.from_public_bytes(their_public))
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"leakbench pairwise mask").derive(agreed)


def mask(key: bytes, round: int, length: int) -> np.ndarray:
    """The pair's mask for one round: `length` ring elements of a ChaCha20 keystream (nonce = the round)."""
    nonce = int(round + 1).to_bytes(8, "little") + bytes(8)
    stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(8 * length))
    return np.frombuffer(stream, dtype="<u8").astype(RING)


def encode(values: np.ndarray) -> np.ndarray:
    """Fixed point in the ring (two's complement)."""
    scaled = np.rint(np.asarray(values, dtype=np.float64) * 2.0 ** FRACTION_BITS).astype(np.int64)
    return scaled.view(RING)


def decode(ring: np.ndarray) -> np.ndarray:
    return np.asarray(ring, dtype=RING).view(np.int64).astype(np.float64) / 2.0 ** FRACTION_BITS


def masked(values: np.ndarray, keys: dict[int, bytes], me: int, round: int) -> np.ndarray:
    """Client `me`'s upload: its fixed-point values plus the masks shared with higher indices, minus lower."""
    out = encode(values)
    with np.errstate(over="ignore"):
        for other, key in keys.items():
            m = mask(key, round, out.size)
            out = out + m if other > me else out - m
    return out


def ring_sum(vectors: list[np.ndarray]) -> np.ndarray:
    """The server's sum mod 2^64: the masks of a complete round cancel."""
    total = np.zeros_like(vectors[0])
    with np.errstate(over="ignore"):
        for v in vectors:
            total = total + v
    return total
