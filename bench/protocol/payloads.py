"""Wire arithmetic every defense can use: weighted plaintext sums, ciphertext sums of client-pre-weighted
values, packing masked entries into one vector, encrypting it, and unpacking an aggregate into a dense
update. Each party uses only the key material it holds (bench/crypto)."""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.wire import CipherPart, Party, Payload, PlainPart, Upload, WireError


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
