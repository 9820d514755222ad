"""Paillier via python-paillier (`phe`, gmpy2-accelerated), one ciphertext per value.

Values are fixed-point integers round(v * 2**precision_bits), reduced mod n so negatives work; every
value shares that one exponent, so adding ciphertexts is a single modular product and never triggers
phe's `decrease_exponent_to` rescaling. Each ciphertext is a fixed-width big-endian integer of
2 * key_bytes bytes (the size of n**2). A framed blob carries up to VALUES_PER_BLOB consecutive values,
so one fingerprint and checksum cover many ciphertexts. Keys below 2048 bits are test-only.
"""
from __future__ import annotations

import json
from typing import Any

import gmpy2
import numpy as np
import phe

from bench.crypto.params import Aggregator, CryptoError, Decryptor, Encryptor, KeyMaterial

VALUES_PER_BLOB = 256
SUM_HEADROOM_BITS = 32  # encoded magnitudes stay 2**32 below n/3, so sums of many uploads cannot wrap


def paillier_keygen(key_bits: int = 2048, precision_bits: int = 40) -> KeyMaterial:
    """Fresh in-memory key; public bytes hold n and the encoding, secret bytes hold p and q."""
    if key_bits < 512 or key_bits % 8:
        raise ValueError(f"key_bits must be a multiple of 8 and >= 512, got {key_bits}")
    if not 1 <= precision_bits <= key_bits // 4:
        raise ValueError(f"precision_bits must be in 1..{key_bits // 4}, got {precision_bits}")
    pub, priv = phe.generate_paillier_keypair(n_length=key_bits)
    public = json.dumps({"n": format(pub.n, "x"), "precision_bits": precision_bits,
                         "values_per_blob": VALUES_PER_BLOB}, sort_keys=True).encode()
    secret = json.dumps({"p": format(priv.p, "x"), "q": format(priv.q, "x")}, sort_keys=True).encode()
    params = {"scheme": "paillier", "name": f"paillier-{key_bits}-p{precision_bits}", "key_bits": key_bits,
              "test_only_key_size": key_bits < 2048, "precision_bits": precision_bits,
              "ciphertext_bytes": 2 * (key_bits // 8), "values_per_blob": VALUES_PER_BLOB}
    return KeyMaterial("paillier", public, secret, params)


class _PaillierRole:
    """Parsed public key and the fixed-width encoding every party agrees on."""

    def _setup(self, km: KeyMaterial) -> dict:
        pub = json.loads(km.public)
        self.public_key = phe.PaillierPublicKey(int(pub["n"], 16))
        self.n = self.public_key.n
        self.nsquare = gmpy2.mpz(self.public_key.nsquare)
        self.width = 2 * ((self.n.bit_length() + 7) // 8)
        self.precision_bits = int(pub["precision_bits"])
        return pub

    def _parse(self, payload: bytes, what: str, verdict: str) -> list:
        if len(payload) % self.width:
            raise CryptoError(self.party, f"{what} is truncated or garbled ({len(payload)} bytes is not a "
                                          f"multiple of the {self.width}-byte ciphertext size); {verdict}")
        count = len(payload) // self.width
        if not 1 <= count <= self.values_per_blob:
            raise CryptoError(self.party, f"{what} holds {count} values, outside 1..{self.values_per_blob}; "
                                          f"{verdict}")
        out = []
        for j in range(count):
            c = gmpy2.mpz(int.from_bytes(payload[j * self.width:(j + 1) * self.width], "big"))
            if not 0 < c < self.nsquare or gmpy2.gcd(c, self.n) != 1:
                raise CryptoError(self.party, f"value {j} of {what} is not a valid ciphertext for this key "
                                              f"(garbled); {verdict}")
            out.append(c)
        return out

    def _serialize(self, cts: list) -> bytes:
        return b"".join(int(c).to_bytes(self.width, "big") for c in cts)


class PaillierEncryptor(_PaillierRole, Encryptor):
    def __init__(self, km: KeyMaterial, party: str):
        pub = self._setup(km)
        Encryptor.__init__(self, party, km, int(pub["values_per_blob"]))
        self.scale = 2.0 ** self.precision_bits
        limit = self.public_key.max_int >> (self.precision_bits + SUM_HEADROOM_BITS)
        self.max_abs_value = float(min(limit, 1 << 1000))

    def _encrypt_chunk(self, chunk: np.ndarray) -> bytes:
        n, enc = self.n, self.public_key.raw_encrypt
        return self._serialize([enc(int(m) % n) for m in np.rint(chunk * self.scale)])


class PaillierAggregator(_PaillierRole, Aggregator):
    def __init__(self, km: KeyMaterial, party: str):
        pub = self._setup(km)
        Aggregator.__init__(self, party, km, int(pub["values_per_blob"]))
        self.max_summands = 2 ** SUM_HEADROOM_BITS

    def _load(self, payload: bytes, what: str, verdict: str) -> tuple[Any, int]:
        cts = self._parse(payload, what, verdict)
        return cts, len(cts)

    def _add(self, acc: Any, item: Any) -> Any:
        nsq = self.nsquare
        return [a * b % nsq for a, b in zip(acc, item)]

    def _dump(self, acc: Any) -> bytes:
        return self._serialize(acc)


class PaillierDecryptor(_PaillierRole, Decryptor):
    def __init__(self, km: KeyMaterial, party: str):
        pub = self._setup(km)
        Decryptor.__init__(self, party, km, int(pub["values_per_blob"]))
        sec = json.loads(km.secret)
        self.private_key = phe.PaillierPrivateKey(self.public_key, int(sec["p"], 16), int(sec["q"], 16))

    def _decrypt_chunk(self, payload: bytes, what: str, verdict: str) -> np.ndarray:
        n, max_int, scale = self.n, self.public_key.max_int, 2 ** self.precision_bits
        values = []
        for j, c in enumerate(self._parse(payload, what, verdict)):
            m = self.private_key.raw_decrypt(int(c))
            if m >= n - max_int:
                m -= n
            elif m > max_int:
                raise CryptoError(self.party, f"value {j} of {what} overflowed the fixed-point range "
                                              f"(|sum| too large for a {n.bit_length()}-bit key); {verdict}")
            values.append(m / scale)
        return np.asarray(values, dtype=np.float64)
