"""The defense contract: hooks the federation engine calls, with no defense-specific branches.

setup (keys, negotiation) -> round_start (per-round negotiation) -> encode (client:
update -> payload) -> aggregate (aggregation server, public material only) -> decode
(whoever holds the key) -> merge (client; personalized parts stay local).

Party separation is explicit: key material lives in the `keys` of the party that holds
it, and each hook receives only the party it runs at. The base class implements the
generic wire arithmetic: weighted plaintext sums, ciphertext sums of client-pre-weighted
values, decryption and unpacking into a dense update.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from bench.configurable import Configurable
from bench.wire import CipherPart, Payload, PlainPart, Upload, WireError, dense_payload

KEY_TOPOLOGIES = {
    "none": "nobody needs to: the upload is plaintext",
    "shared-client-key": "any one client colluding with the aggregation server",
    "key-server": "the key server colluding with the aggregation server",
}


@dataclass
class Party:
    """One protocol participant and what it holds."""

    name: str
    keys: dict[str, Any] = field(default_factory=dict)     # scheme -> KeyMaterial
    state: dict[str, Any] = field(default_factory=dict)    # defense state living at this party

    def holds_secret(self) -> bool:
        return any(getattr(k, "secret", None) is not None for k in self.keys.values())


class Defense(Configurable):
    """Base defense: plaintext FedAvg wire arithmetic; subclasses override hooks."""

    key_topology: ClassVar[str] = "none"
    # True when decode(aggregate(uploads)) is sum_k weight_k * update_k of the updates given to encode
    # (up to noise that does not depend on the data, which only adds privacy),
    # with the weights given to encode and carried by the uploads: what DP-FedAvg's noise calibration
    # (sum / W of clipped updates) relies on when it wraps this defense. Defenses whose aggregate is
    # anything else (per-cluster models, means over who sent an entry, carried-over residuals) say False.
    decodes_weighted_sum: ClassVar[bool] = True
    # True when an upload carries the client's trained weights (e.g. LoRA factors) instead of its update;
    # an attack then knows to subtract the global weights it sent (Knowledge.gradient)
    uploads_weights: ClassVar[bool] = False

    # -- hooks ---------------------------------------------------------------------------------
    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Reparameterize the (warm-started) model every party builds, e.g. into a frozen
        dictionary and a trainable table; the result is the public architecture."""
        return model

    def setup(self, fed) -> None:
        """Keys and one-off negotiation; send messages with fed.send(round=-1, ...)."""

    def round_start(self, fed, round: int, clients: list, updates: dict[str, dict[str, torch.Tensor]]) -> None:
        """Per-round negotiation after local training, before uploads (e.g. mask proposals).

        `updates` maps each sampled client's name to its trained update; only that client's
        own code may read its entry (messages it derives go through fed.send)."""

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        return dense_payload(update)

    def aggregate(self, fed, uploads: list[Upload], server: Party) -> Payload:
        return Payload(plain=sum_plain(uploads), cipher=sum_cipher(fed, uploads, server))

    def decoder(self, fed) -> Party:
        """The party that turns the aggregate into a plaintext update."""
        return fed.parties["key-server"] if self.key_topology == "key-server" else fed.clients[0].party

    def decode(self, fed, aggregate: Payload, party: Party) -> dict[str, torch.Tensor]:
        return unpack(aggregate, fed.shapes, party, fed)

    def merge(self, fed, client, global_update: dict[str, torch.Tensor]) -> None:
        """Client-side use of the new global update (personalized defenses override)."""

    def run_metrics(self, fed) -> dict[str, Any]:
        """Measured, defense-specific metrics of the run (fractions, epsilon, ...)."""
        return {}

    # -- budget matching (bench/budget.py) -------------------------------------------------------
    def cipher_target(self) -> tuple[str, float] | None:
        """(reference defense label, bytes ratio) when this defense's encrypted amount is matched."""
        return None

    def match_cipher_bytes(self, nbytes: float) -> None:
        """Before setup: encrypt as much as makes an upload's ciphertexts come to about `nbytes`."""
        raise ValueError(f"defense '{type(self).__name__}' has no encrypted amount to match to a byte budget")


# ----------------------------------------------------------------------- wire arithmetic

def sum_plain(uploads: list[Upload]) -> dict[str, PlainPart]:
    """Weighted sum of plaintext parts; every upload must use the first one's layout, position by position."""
    out: dict[str, PlainPart] = {}
    first = uploads[0].payload.plain
    for up in uploads:
        extra = sorted(set(up.payload.plain) - set(first))
        if extra:
            raise WireError(up.sender, f"sends plaintext '{extra[0]}' that {uploads[0].sender} does not; "
                                       f"clients must agree on one layout")
    for name, part in first.items():
        acc = np.zeros(part.values().shape, dtype=np.float64)
        for up in uploads:
            other = up.payload.plain.get(name)
            if other is None:
                raise WireError(up.sender, f"sends no plaintext '{name}' but {uploads[0].sender} does; "
                                           f"clients must agree on one layout")
            other.check(up.sender, name)
            if tuple(other.shape) != tuple(part.shape):
                raise WireError(up.sender, f"'{name}' has shape {tuple(other.shape)} but {uploads[0].sender}'s "
                                           f"has {tuple(part.shape)}")
            if not _same_mask(other.mask, part.mask):
                where = _first_difference(other.visible(), part.visible())
                raise WireError(up.sender, f"the plaintext mask of '{name}' differs from {uploads[0].sender}'s "
                                           f"at position {where}; clients must agree on one mask")
            acc += up.weight * other.values().astype(np.float64)
        out[name] = PlainPart(acc.astype("<f4").tobytes(), part.shape, part.mask)
    return out


def _same_mask(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    if a.size != b.size:
        return int(min(a.size, b.size))
    return int(np.flatnonzero(a != b)[0]) if (a != b).any() else -1


def _same_layout(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(na == nb and _same_mask(np.asarray(ma, bool).reshape(-1),
                                                            np.asarray(mb, bool).reshape(-1))
                                    for (na, ma), (nb, mb) in zip(a, b))


def sum_cipher(fed, uploads: list[Upload], server: Party) -> tuple[CipherPart, ...]:
    """Add client-pre-weighted ciphertexts part by part with the server's public material."""
    if not uploads[0].payload.cipher:
        return ()
    from bench.crypto import open_aggregator

    parts = []
    for i, head in enumerate(uploads[0].payload.cipher):
        adder = open_aggregator(server.keys[head.scheme], server.name)
        blobs = []
        for up in uploads:
            if len(up.payload.cipher) <= i:
                raise WireError(up.sender, f"sends {len(up.payload.cipher)} ciphertext parts but "
                                           f"{uploads[0].sender} sends {len(uploads[0].payload.cipher)}")
            part = up.payload.cipher[i]
            part.check(up.sender, fed.shapes)
            if part.length != head.length or not _same_layout(part.layout, head.layout):
                raise WireError(up.sender, f"ciphertext part {i}'s layout ({part.length} values) differs from "
                                           f"{uploads[0].sender}'s ({head.length} values); clients must agree "
                                           f"on one layout")
            blobs.append(list(up.payload.cipher[i].blobs))
        with fed.meter.time("he_aggregate_s"):
            summed = adder.add(blobs, [up.sender for up in uploads])
        parts.append(CipherPart(head.scheme, tuple(summed), head.layout, head.length))
    return tuple(parts)


def pack(update: dict[str, torch.Tensor], masks: dict[str, np.ndarray]) -> tuple[np.ndarray, tuple]:
    """Flatten the masked entries of several parameters into one vector, in dict order."""
    layout, chunks = [], []
    for name, mask in masks.items():
        mask = np.asarray(mask, bool).reshape(-1)
        if not mask.any():
            continue
        flat = update[name].detach().reshape(-1).cpu().double().numpy()
        if mask.size != flat.size:
            raise ValueError(f"mask for '{name}' has {mask.size} entries, the parameter has {flat.size}")
        layout.append((name, mask))
        chunks.append(flat[mask])
    vector = np.concatenate(chunks) if chunks else np.zeros(0)
    return vector, tuple(layout)


def encrypt_part(fed, client, scheme: str, vector: np.ndarray, layout: tuple) -> CipherPart:
    """Client-side encryption of a packed vector with the client's public material, timed."""
    from bench.crypto import open_encryptor

    enc = open_encryptor(client.party.keys[scheme], client.party.name)
    with fed.meter.time("he_encrypt_s"):
        blobs = enc.encrypt(vector)
    return CipherPart(scheme, tuple(blobs), layout, int(vector.size))


def hybrid_payload(fed, client, update: dict[str, torch.Tensor], weight: float,
                   encrypt: dict[str, np.ndarray], scheme: str = "ckks") -> Payload:
    """Masked entries pre-weighted into one packed ciphertext vector, the rest in plaintext."""
    plain = {}
    for name, tensor in update.items():
        mask = np.asarray(encrypt.get(name, np.zeros(tensor.numel(), bool)), bool).reshape(-1)
        if not mask.all():
            plain[name] = PlainPart.of(tensor, None if not mask.any() else ~mask)
    weighted = {n: update[n] * weight for n in encrypt}
    vector, layout = pack(weighted, encrypt)
    cipher = (encrypt_part(fed, client, scheme, vector, layout),) if vector.size else ()
    return Payload(plain=plain, cipher=cipher)


def unpack(aggregate: Payload, shapes: dict[str, tuple[int, ...]], party: Party, fed) -> dict[str, torch.Tensor]:
    """Dense aggregated update from plaintext parts plus decrypted ciphertext parts."""
    flat = {n: np.zeros(int(np.prod(s)) if s else 1) for n, s in shapes.items()}
    for name, part in aggregate.plain.items():
        if name not in flat:
            raise WireError("the aggregate", f"carries plaintext '{name}', which the model does not have")
        part.check("the aggregate", name)
        flat[name][part.visible()] += part.values()
    for part in aggregate.cipher:
        from bench.crypto import open_decryptor
        part.check("the aggregate", shapes)
        dec = open_decryptor(party.keys[part.scheme], party.name)
        with fed.meter.time("he_decrypt_s"):
            values = dec.decrypt(list(part.blobs), part.length)
        offset = 0
        for name, mask in part.layout:
            count = int(mask.sum())
            flat[name][mask] += values[offset:offset + count]
            offset += count
    return {n: torch.from_numpy(v.astype(np.float32)).reshape(shapes[n]) for n, v in flat.items()}
