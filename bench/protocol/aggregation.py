"""Running aggregates: the aggregation server folds each upload into the round's aggregate as it arrives.

Why: a server that holds every upload of a round until it aggregates needs memory that grows with the clients
(ten 359 MB FedHE-Full uploads of a ResNet-18). A running aggregate holds its totals and the upload being folded.
The default one (`RunningSum`: weighted plaintext sums, homomorphic ciphertext sums) gives the list path's
aggregate bit for bit: plaintext totals are float64 sums in upload order, ciphertext additions are exact.
Every upload is checked against the first one folded, with the list path's one-line refusals.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable

import numpy as np

from bench.crypto.clock import Spent, now, since
from bench.protocol.wire import CipherPart, Party, Payload, PlainPart, Upload, WireError


class Aggregation(ABC):
    """One round's aggregate at the aggregation server, built one upload at a time (Defense.start_aggregate)."""

    @abstractmethod
    def fold(self, upload: Upload) -> None:
        """Add one upload; a WireError or CryptoError refuses one that does not fit the round's layout."""

    @abstractmethod
    def result(self) -> Payload:
        """The aggregate of every upload folded, asked once after the round's last upload."""

    def fold_all(self, uploads: Iterable[Upload]) -> Payload:
        """The aggregate of a whole list: what `aggregate` gives for the uploads of a round."""
        for upload in uploads:
            self.fold(upload)
        return self.result()


class PlainSum:
    """Weighted sum of plaintext parts; every upload must use the first one's layout, position by position."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.layout: dict[str, tuple[tuple, np.ndarray | None]] = {}
        self.totals: dict[str, np.ndarray] = {}

    def fold(self, up: Upload) -> None:
        plain = up.payload.plain
        if self.first is None:
            self.first = up.sender
            self.layout = {n: (tuple(p.shape), p.mask) for n, p in plain.items()}
            self.totals = {n: np.zeros(p.values().shape, dtype=np.float64) for n, p in plain.items()}
        extra = sorted(set(plain) - set(self.layout))
        if extra:
            raise WireError(up.sender, f"sends plaintext '{extra[0]}' that {self.first} does not; "
                                       f"clients must agree on one layout")
        for name, (shape, mask) in self.layout.items():
            other = plain.get(name)
            if other is None:
                raise WireError(up.sender, f"sends no plaintext '{name}' but {self.first} does; "
                                           f"clients must agree on one layout")
            other.check(up.sender, name)
            if tuple(other.shape) != shape:
                raise WireError(up.sender, f"'{name}' has shape {tuple(other.shape)} but {self.first}'s has {shape}")
            if not same_mask(other.mask, mask):
                where = _first_difference(other.visible(), PlainPart(b"", shape, mask).visible())
                raise WireError(up.sender, f"the plaintext mask of '{name}' differs from {self.first}'s "
                                           f"at position {where}; clients must agree on one mask")
            self.totals[name] += up.weight * other.values().astype(np.float64)

    def result(self) -> dict[str, PlainPart]:
        return {n: PlainPart(self.totals[n].astype("<f4").tobytes(), shape, mask)
                for n, (shape, mask) in self.layout.items()}


class CipherSum:
    """Homomorphic sum of client-pre-weighted ciphertext parts, part by part, with the server's public material.
    The seconds spent adding are charged to `he_aggregate_s` once per part and round, as one batch sum was."""

    def __init__(self, fed, server: Party):
        self.fed, self.server = fed, server
        self.first: str | None = None
        self.heads: tuple[CipherPart, ...] = ()
        self.totals: list = []
        self.seconds: list[Spent] = []

    def fold(self, up: Upload) -> None:
        cipher = up.payload.cipher
        if self.first is None:
            from bench.crypto import open_aggregator

            self.first = up.sender
            self.heads = tuple(CipherPart(p.scheme, (), p.layout, p.length) for p in cipher)
            self.totals = [open_aggregator(self.server.keys[p.scheme], self.server.name).running() for p in cipher]
            self.seconds = [Spent()] * len(cipher)
        for i, head in enumerate(self.heads):
            if len(cipher) <= i:
                raise WireError(up.sender, f"sends {len(cipher)} ciphertext parts but {self.first} sends "
                                           f"{len(self.heads)}")
            part = cipher[i]
            part.check(up.sender, self.fed.shapes)
            if part.length != head.length or not same_layout(part.layout, head.layout):
                raise WireError(up.sender, f"ciphertext part {i}'s layout ({part.length} values) differs from "
                                           f"{self.first}'s ({head.length} values); clients must agree on one layout")
            started = now()
            self.totals[i].fold(list(part.blobs), up.sender)
            self.seconds[i] += since(started)

    def result(self) -> tuple[CipherPart, ...]:
        parts = []
        for head, total, seconds in zip(self.heads, self.totals, self.seconds):
            started = now()
            blobs = total.blobs()
            self.fed.meter.charge("he_aggregate_s", seconds + since(started))
            parts.append(CipherPart(head.scheme, tuple(blobs), head.layout, head.length))
        return tuple(parts)


class RunningSum(Aggregation):
    """The default aggregate: plaintext parts weighted and summed, ciphertexts added homomorphically."""

    def __init__(self, fed, server: Party):
        self.plain, self.cipher = PlainSum(), CipherSum(fed, server)

    def fold(self, upload: Upload) -> None:
        self.plain.fold(upload)
        self.cipher.fold(upload)

    def result(self) -> Payload:
        if self.plain.first is None:
            raise WireError("the aggregation server", "received no uploads to aggregate")
        return Payload(plain=self.plain.result(), cipher=self.cipher.result())


def same_mask(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    if a.size != b.size:
        return int(min(a.size, b.size))
    return int(np.flatnonzero(a != b)[0]) if (a != b).any() else -1


def same_layout(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(na == nb and same_mask(np.asarray(ma, bool).reshape(-1),
                                                           np.asarray(mb, bool).reshape(-1))
                                    for (na, ma), (nb, mb) in zip(a, b))
