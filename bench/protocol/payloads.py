"""Wire arithmetic every defense can use: weighted plaintext sums, ciphertext sums of client-pre-weighted
values (both built one upload at a time, bench/protocol/aggregation.py), packing masked entries into one
vector, encrypting it, and unpacking an aggregate into a dense update. Each party uses only the key material
it holds (bench/crypto)."""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.aggregation import CipherSum, PlainSum
from bench.protocol.wire import CipherPart, Party, Payload, PlainPart, Upload, WireError


def sum_plain(uploads: list[Upload]) -> dict[str, PlainPart]:
    """Weighted sum of plaintext parts; every upload must use the first one's layout, position by position."""
    total = PlainSum()
    for up in uploads:
        total.fold(up)
    return total.result()


def sum_cipher(fed, uploads: list[Upload], server: Party) -> tuple[CipherPart, ...]:
    """Add client-pre-weighted ciphertexts part by part with the server's public material."""
    total = CipherSum(fed, server)
    for up in uploads:
        total.fold(up)
    return total.result()


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
