"""Parameter sets, key material, the wire frame and the three party roles shared by both schemes.

Every ciphertext blob on the wire is framed as

    fingerprint (8 B) | crc32 (4 B, big-endian) | scheme ciphertext bytes

The fingerprint (first 8 bytes of sha256 of the public key material) lets a receiver reject a blob
encrypted under another key: TenSEAL deserializes such a blob silently and decrypts it to garbage.
The CRC over fingerprint + ciphertext catches transport corruption: about a third of single-byte flips
in a SEAL ciphertext still load and then decrypt to garbage. It is integrity, not authentication.
The 12 header bytes travel, so they are counted in every size.
"""
from __future__ import annotations

import hashlib
import math
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HEADER_BYTES = 12
TARGET_ABS_ERROR = 1e-6  # max abs CKKS noise of an aggregated, decrypted value that choose_ckks_params accepts
GRID = 2.0 ** -21        # CKKS fixed-point grid (ckks.py); the noise bound of a sum must stay under GRID / 4, and
                         # a K-client sum is exact on the grid, within K * GRID / 2 of the unrounded inputs' sum

# HomomorphicEncryption.org standard, classical attacks, ternary secret: max log2(Q) per N and security level.
_MAX_LOGQ = {
    128: {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881},
    192: {1024: 19, 2048: 37, 4096: 75, 8192: 152, 16384: 305, 32768: 611},
    256: {1024: 14, 2048: 29, 4096: 58, 8192: 118, 16384: 237, 32768: 476},
}


class CryptoError(ValueError):
    """A one-line refusal that names the party and the problem, so a failed run says who rejected what."""

    def __init__(self, party: str, problem: str):
        super().__init__(f"{party}: {problem}")
        self.party = party
        self.problem = problem

    def __reduce__(self):  # raised in HE worker processes and re-raised in the caller
        return type(self), (self.party, self.problem)


class OutOfRange(CryptoError):
    """A value beyond what the key's encoding can hold: the training that produced it left the range the
    protocol can carry (the engine records the run as diverged, an outcome, not an error)."""



@dataclass(frozen=True)
class CKKSParams:
    """A CKKS parameter set; refuses sets below the security level it claims."""

    name: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int
    security_bits: int = 128

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(int(b) for b in self.coeff_mod_bit_sizes))
        n, bits = self.poly_modulus_degree, self.coeff_mod_bit_sizes
        table = _MAX_LOGQ.get(self.security_bits)
        if table is None:
            raise ValueError(f"{self.name}: security_bits must be one of {sorted(_MAX_LOGQ)}")
        if n not in table:
            raise ValueError(f"{self.name}: poly_modulus_degree {n} is not one of {sorted(table)}")
        if len(bits) < 2 or not all(1 <= b <= 60 for b in bits):
            raise ValueError(f"{self.name}: need >= 2 coefficient primes of 1..60 bits, got {list(bits)}")
        if sum(bits) > table[n]:
            raise ValueError(f"{self.name}: log2(Q) = {sum(bits)} exceeds {table[n]}, the bound for "
                             f"{self.security_bits}-bit security at N={n} (HomomorphicEncryption.org standard)")
        if not 20 <= self.scale_bits < bits[0]:
            raise ValueError(f"{self.name}: scale_bits {self.scale_bits} must be in 20..{bits[0] - 1} "
                             f"(below the first prime, leaving integer headroom)")

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def multiply_depth(self) -> int:
        """Plaintext multiplies possible: middle primes at least as large as the scale."""
        return sum(1 for b in self.coeff_mod_bit_sizes[1:-1] if b >= self.scale_bits)

    @property
    def max_abs_value(self) -> float:
        """Largest magnitude a slot may hold and still decode (first prime minus scale, one bit spare)."""
        return float(2 ** (self.coeff_mod_bit_sizes[0] - self.scale_bits - 2))

    def expected_error(self, num_clients: int) -> float:
        """Conservative max abs error after summing `num_clients` fresh ciphertexts.

        Fitted on TenSEAL 0.3.18: fresh error ~ 60..180 * sqrt(N) / scale, growing like sqrt(#summands).
        """
        return 200.0 * math.sqrt(self.poly_modulus_degree) * math.sqrt(max(num_clients, 1)) / 2.0 ** self.scale_bits

    def as_dict(self) -> dict[str, Any]:
        return {"scheme": "ckks", "name": self.name, "poly_modulus_degree": self.poly_modulus_degree,
                "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes), "scale_bits": self.scale_bits,
                "security_bits": self.security_bits, "slots": self.slots, "multiply_depth": self.multiply_depth}


def _named(n: int, bits: tuple[int, ...], scale: int) -> CKKSParams:
    return CKKSParams(f"ckks-n{n}-{'.'.join(map(str, bits))}-s{scale}", n, bits, scale)


# Cheapest first. n4096 has a single data prime: add-only (32 B/param); the others allow plaintext multiplies.
PARAM_SETS: dict[str, CKKSParams] = {
    "n4096": _named(4096, (60, 49), 40),
    "n8192": _named(8192, (60, 40, 60), 40),
    "n16384": _named(16384, (60, 40, 40, 60), 40),
}


def choose_ckks_params(num_clients: int, needs_multiply: bool = False) -> CKKSParams:
    """Cheapest set whose aggregate noise stays under TARGET_ABS_ERROR and GRID / 4 (pre-weighted updates, server
    only adds), so rounding the decrypted sum to the grid recovers it exactly."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    for params in PARAM_SETS.values():
        if needs_multiply and params.multiply_depth < 1:
            continue
        if params.expected_error(num_clients) <= min(TARGET_ABS_ERROR, GRID / 4):
            return params
    raise ValueError(f"no CKKS parameter set keeps the error of a {num_clients}-client sum under "
                     f"{min(TARGET_ABS_ERROR, GRID / 4):g}; aggregate hierarchically or add a set with a larger scale")


@dataclass(frozen=True)
class KeyMaterial:
    """What one party holds: serialized context bytes. `secret` is None for public-only material."""

    scheme: str
    public: bytes = field(repr=False)
    secret: bytes | None = field(repr=False)
    params: dict = field(default_factory=dict)

    def public_only(self) -> "KeyMaterial":
        return KeyMaterial(self.scheme, self.public, None, dict(self.params))

    @property
    def can_decrypt(self) -> bool:
        return self.secret is not None

    @property
    def fingerprint(self) -> bytes:
        return key_fingerprint(self.public)


def key_fingerprint(public: bytes) -> bytes:
    return hashlib.sha256(public).digest()[:8]


def frame(fingerprint: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(fingerprint))
    return fingerprint + crc.to_bytes(4, "big") + payload


def unframe(blob: Any, fingerprint: bytes, party: str, what: str, verdict: str) -> bytes:
    """Ciphertext bytes of a framed blob, or a CryptoError saying what is wrong with it."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CryptoError(party, f"{what} is a {type(blob).__name__}, not bytes; {verdict}")
    blob = bytes(blob)
    if len(blob) <= HEADER_BYTES:
        raise CryptoError(party, f"{what} is truncated or garbled ({len(blob)} bytes, no room for a "
                                 f"ciphertext after the {HEADER_BYTES}-byte header); {verdict}")
    got_fp, payload = blob[:8], blob[HEADER_BYTES:]
    if zlib.crc32(payload, zlib.crc32(got_fp)) != int.from_bytes(blob[8:HEADER_BYTES], "big"):
        raise CryptoError(party, f"{what} is truncated or garbled (checksum mismatch over "
                                 f"{len(blob)} bytes); {verdict}")
    if got_fp != fingerprint:
        raise CryptoError(party, f"{what} was encrypted under another key (fingerprint {got_fp.hex()}, "
                                 f"this key is {fingerprint.hex()}); {verdict}")
    return payload


def _as_vector(values: Any, party: str, max_abs: float) -> np.ndarray:
    flat = np.asarray(values)
    if flat.ndim != 1:
        raise CryptoError(party, f"can only encrypt a 1-D vector, got shape {flat.shape}; flatten it first")
    if flat.size and not (np.issubdtype(flat.dtype, np.floating) or np.issubdtype(flat.dtype, np.integer)):
        raise CryptoError(party, f"can only encrypt real numbers, got dtype {flat.dtype}")
    flat = flat.astype(np.float64, copy=False)
    if flat.size:
        bad = ~np.isfinite(flat)
        if bad.any():
            raise CryptoError(party, f"cannot encrypt non-finite value {flat[bad][0]} at index {int(np.argmax(bad))}")
        peak = float(np.abs(flat).max())
        if peak > max_abs:
            raise OutOfRange(party, f"value magnitude {peak:g} exceeds {max_abs:g}, the largest this key's "
                                     f"encoding can hold; pre-weight or rescale the update")
    return flat


class _Role(ABC):
    """A party's handle on one key: its name, the key fingerprint and how many values one blob carries."""

    def __init__(self, party: str, km: KeyMaterial, values_per_blob: int):
        self.party = party
        self.scheme = km.scheme
        self.fingerprint = key_fingerprint(km.public)
        self.values_per_blob = values_per_blob

    def _unframe(self, blob: Any, what: str, verdict: str) -> bytes:
        return unframe(blob, self.fingerprint, self.party, what, verdict)


class Encryptor(_Role):
    """Client side: turns a flat vector into framed ciphertext blobs with public material only."""

    max_abs_value: float = math.inf

    def encrypt(self, values: np.ndarray) -> list[bytes]:
        flat = _as_vector(values, self.party, self.max_abs_value)
        step = self.values_per_blob
        return self._encrypt_chunks([flat[i:i + step] for i in range(0, flat.size, step)])

    def _encrypt_chunks(self, chunks: list[np.ndarray]) -> list[bytes]:
        """Framed blobs, one per chunk, in order; a scheme may spread them over processes."""
        return [frame(self.fingerprint, self._encrypt_chunk(chunk)) for chunk in chunks]

    @abstractmethod
    def _encrypt_chunk(self, chunk: np.ndarray) -> bytes: ...


class Aggregator(_Role):
    """Aggregation server: checks every blob, adds element-wise, never decrypts."""

    max_summands: float = math.inf   # the key's sum headroom: more uploads could overflow the encoding

    def add(self, uploads: list[list[bytes]], party_names: list[str] | None = None) -> list[bytes]:
        """The sum of every upload's blobs, each checked; the same bytes as folding them into `running()` in turn."""
        if not uploads:
            raise CryptoError(self.party, "received no uploads to add")
        names = list(party_names) if party_names is not None else [f"client-{i}" for i in range(len(uploads))]
        if len(names) != len(uploads):
            raise CryptoError(self.party, f"{len(uploads)} uploads but {len(names)} sender names")
        if len(uploads) > self.max_summands:
            raise CryptoError(self.party, _headroom(len(uploads), self.max_summands))
        for name, up in zip(names, uploads):
            if len(up) != len(uploads[0]):
                raise CryptoError(self.party, f"{name}'s upload has {len(up)} ciphertexts but {names[0]}'s has "
                                              f"{len(uploads[0])}; uploads must be equally long; {VERDICT}")
        total = self.running()
        for name, up in zip(names, uploads):
            total.fold(up, name)
        return total.blobs()

    def running(self) -> "RunningSum":
        """An empty sum that uploads are folded into one at a time."""
        return RunningSum(self)

    @abstractmethod
    def _load(self, payload: bytes, what: str, verdict: str) -> tuple[Any, int]:
        """Deserialized ciphertext and the number of values it holds; CryptoError if invalid."""

    @abstractmethod
    def _add(self, acc: Any, item: Any) -> Any: ...

    @abstractmethod
    def _dump(self, acc: Any) -> bytes: ...


VERDICT = "the upload is rejected"


def _headroom(count: int, limit: float) -> str:
    return (f"{count} uploads exceed this key's sum headroom of {limit:g} summands, so their sum could overflow "
            f"the encoding; provision the key for at least {count} summands")


class RunningSum:
    """A ciphertext sum built one upload at a time, so that a server holds the running total (one deserialized
    ciphertext per chunk, about one upload's size) and the upload being folded, never the whole round's. Each
    upload is checked against the first one folded; ciphertext addition is exact, so the bytes are the batch
    `Aggregator.add`'s. An upload refused part-way leaves the sum unusable (the round fails with it)."""

    def __init__(self, role: Aggregator):
        self.role, self.totals, self.sizes, self.first, self.count = role, [], [], None, 0

    def fold(self, blobs: list[bytes], name: str) -> None:
        role = self.role
        self._open()
        if self.count + 1 > role.max_summands:
            raise CryptoError(role.party, _headroom(self.count + 1, role.max_summands))
        if self.first is not None and len(blobs) != len(self.totals):
            raise CryptoError(role.party, f"{name}'s upload has {len(blobs)} ciphertexts but {self.first}'s has "
                                          f"{len(self.totals)}; uploads must be equally long; {VERDICT}")
        for i, blob in enumerate(blobs):
            what = f"ciphertext {i} of {name}'s upload"
            item, n = role._load(role._unframe(blob, what, VERDICT), what, VERDICT)
            if self.first is None:
                if i < len(blobs) - 1 and n != role.values_per_blob:
                    raise CryptoError(role.party, f"{what} holds {n} values; every ciphertext but the last must "
                                                  f"hold {role.values_per_blob}; {VERDICT}")
                self.totals.append(item)
                self.sizes.append(n)
            elif n != self.sizes[i]:
                raise CryptoError(role.party, f"{what} holds {n} values but {self.first}'s holds {self.sizes[i]}; "
                                              f"{VERDICT}")
            else:
                self.totals[i] = role._add(self.totals[i], item)
        self.first = self.first or name
        self.count += 1

    def blobs(self) -> list[bytes]:
        """The framed sum of every upload folded, handed over once: each chunk's running total is released as it is
        serialized, so the sum and its bytes are not both held whole."""
        if not self.count:
            raise CryptoError(self.role.party, "received no uploads to add")
        self._open()
        totals, self.totals = self.totals[::-1], None
        out = []
        while totals:
            out.append(frame(self.role.fingerprint, self.role._dump(totals.pop())))
        return out

    def _open(self) -> None:
        if self.totals is None:
            raise CryptoError(self.role.party, "this sum was already handed over; start another with running()")


class Decryptor(_Role):
    """Key holder: decrypts framed blobs back to exactly `length` float64 values."""

    def decrypt(self, blobs: list[bytes], length: int) -> np.ndarray:
        verdict = "the aggregate is rejected"
        expected = -(-length // self.values_per_blob)
        if len(blobs) != expected:
            raise CryptoError(self.party, f"{length} values need {expected} ciphertexts of {self.values_per_blob} "
                                          f"values, got {len(blobs)}; {verdict}")
        payloads = [self._unframe(blob, f"ciphertext {i} of the aggregate", verdict) for i, blob in enumerate(blobs)]
        parts = self._decrypt_chunks(payloads, verdict)
        values = np.concatenate(parts) if parts else np.zeros(0)
        if values.size != length:   # a shorter declared length would silently drop values
            raise CryptoError(self.party, f"the aggregate decrypts to {values.size} values but {length} were "
                                          f"declared; {verdict}")
        return values.astype(np.float64, copy=False)

    def _decrypt_chunks(self, payloads: list[bytes], verdict: str) -> list[np.ndarray]:
        """Plain values of each unframed payload, in order; a scheme may spread them over processes."""
        return [self._decrypt_chunk(p, f"ciphertext {i} of the aggregate", verdict) for i, p in enumerate(payloads)]

    @abstractmethod
    def _decrypt_chunk(self, payload: bytes, what: str, verdict: str) -> np.ndarray: ...
