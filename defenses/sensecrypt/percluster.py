"""Per-cluster FedAvg over uploads that each carry their own mask (section 3.3, Algorithm 3).

Every client encrypts each masked entry as its own Paillier ciphertext (one value per framed
blob, as the paper encrypts per parameter), pre-weighted by its FedAvg share within its
cluster; the rest travels in plaintext, unweighted, with the packed mask in the upload's
meta. The aggregation server, per cluster, adds at each entry of the union mask the
ciphertexts of the clients that encrypted it and, where others sent that entry in
plaintext, the encryption under the public key of their weighted plaintext sum: it learns
nothing it had not seen and needs no secret. Entries outside the union are summed in
plaintext. The key server decrypts the union entries only.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from bench.crypto import open_aggregator, open_decryptor, open_encryptor
from bench.protocol.wire import CipherPart, Payload, PlainPart, Upload

SCHEME = "paillier"


def split(flat: np.ndarray, names: list[str], sizes: list[int]) -> dict[str, np.ndarray]:
    return dict(zip(names, np.split(flat, np.cumsum(sizes)[:-1])))


def flatten(tensors: dict[str, torch.Tensor], names: list[str]) -> np.ndarray:
    return np.concatenate([tensors[n].detach().reshape(-1).double().cpu().numpy() for n in names])


def pack_mask(mask: np.ndarray) -> bytes:
    return np.packbits(mask.astype(bool)).tobytes()


def unpack_mask(blob: bytes, size: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(blob, np.uint8), count=size).astype(bool)


def encrypt_each(party, values: np.ndarray) -> list[bytes]:
    """One framed ciphertext per value, with `party`'s public material."""
    enc = open_encryptor(party.keys[SCHEME], party.name)
    return [enc.encrypt(values[i:i + 1])[0] for i in range(values.size)]


def masked_payload(fed, client, update: dict[str, torch.Tensor], mask: np.ndarray, share: float,
                   sizes: list[int]) -> Payload:
    """The client's upload: masked entries encrypted (times its cluster share), the rest plain, the mask in meta."""
    masks = split(mask, fed.names, sizes)
    plain = {n: PlainPart.of(update[n], None if not m.any() else ~m) for n, m in masks.items() if not m.all()}
    values = flatten(update, fed.names)[mask] * share
    with fed.meter.time("he_encrypt_s"):
        blobs = encrypt_each(client.party, values)
    layout = tuple((n, m) for n, m in masks.items() if m.any())
    cipher = (CipherPart(SCHEME, tuple(blobs), layout, int(values.size)),) if values.size else ()
    return Payload(plain=plain, cipher=cipher, meta={"mask": pack_mask(mask)}, layouts={"mask": "entries:bits"})


def _plain_flat(upload: Upload, names: list[str], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Dense values and visibility of an upload's plaintext parts."""
    values, seen = np.zeros(sum(sizes)), np.zeros(sum(sizes), bool)
    offset = 0
    for name, size in zip(names, sizes):
        part = upload.payload.plain.get(name)
        if part is not None:
            vis = part.visible()
            values[offset:offset + size][vis] = part.values()
            seen[offset:offset + size] = vis
        offset += size
    return values, seen


def aggregate_cluster(fed, cluster: int, uploads: list[Upload], shares: dict[str, float], server,
                      sizes: list[int]) -> tuple[dict[str, PlainPart], CipherPart | None, np.ndarray]:
    """Plaintext parts, one ciphertext part over the union mask, and the union, of one cluster's FedAvg."""
    total = sum(sizes)
    masks = [unpack_mask(u.payload.meta["mask"], total) for u in uploads]
    union = np.logical_or.reduce(masks)
    plain_sum, plain_count = np.zeros(total), np.zeros(total, int)
    for up, mask in zip(uploads, masks):
        values, seen = _plain_flat(up, fed.names, sizes)
        if (seen & mask).any() or not (seen | mask).all():
            raise ValueError(f"aggregation server: {up.sender}'s plaintext and mask do not partition the update")
        plain_sum += np.where(seen, values, 0.0) * shares[up.sender]
        plain_count += seen
    prefix = f"{cluster}/"
    plain = {prefix + n: PlainPart(v[~u].astype("<f4").tobytes(), fed.shapes[n], None if not u.any() else ~u)
             for (n, v), u in zip(split(plain_sum, fed.names, sizes).items(), split(union, fed.names, sizes).values())
             if not u.all()}
    if not union.any():
        return plain, None, union
    adder = open_aggregator(server.keys[SCHEME], server.name)
    ranks = [np.cumsum(m) - 1 for m in masks]  # position of entry k within each client's ciphertext list
    summed = []
    with fed.meter.time("he_aggregate_s"):
        for k in np.flatnonzero(union):
            blobs = [[up.payload.cipher[0].blobs[int(r[k])]] for up, m, r in zip(uploads, masks, ranks) if m[k]]
            names = [up.sender for up, m in zip(uploads, masks) if m[k]]
            if plain_count[k]:
                blobs.append(encrypt_each(server, plain_sum[k:k + 1]))
                names.append(server.name)
            summed.append(adder.add(blobs, names)[0])
    layout = tuple((prefix + n, u) for n, u in split(union, fed.names, sizes).items() if u.any())
    return plain, CipherPart(SCHEME, tuple(summed), layout, int(union.sum())), union


def aggregate(fed, uploads: list[Upload], labels: list[int], shares: dict[str, float], server,
              sizes: list[int]) -> Payload:
    """All clusters' aggregates in one message to the key server; names are prefixed '<cluster>/'."""
    index = {c.name: c.index for c in fed.clients}
    groups: dict[int, list[Upload]] = {}
    for up in uploads:
        groups.setdefault(labels[index[up.sender]], []).append(up)
    plain, cipher, meta = {}, [], {"clusters": json.dumps(sorted(groups)).encode()}
    for cluster in sorted(groups):
        p, c, union = aggregate_cluster(fed, cluster, groups[cluster], shares, server, sizes)
        plain.update(p)
        if c is not None:
            cipher.append(c)
        meta[f"union/{cluster}"] = pack_mask(union)
    return Payload(plain=plain, cipher=tuple(cipher), meta=meta)


def decode(fed, aggregate_payload: Payload, party, sizes: list[int]) -> dict[int, np.ndarray]:
    """Key server: each cluster's weighted-average update as a flat float64 vector."""
    clusters = json.loads(aggregate_payload.meta["clusters"])
    out = {c: np.zeros(sum(sizes)) for c in clusters}
    offsets = dict(zip(fed.names, np.concatenate([[0], np.cumsum(sizes)[:-1]])))
    for key, part in aggregate_payload.plain.items():
        cluster, name = key.split("/", 1)
        out[int(cluster)][offsets[name]:offsets[name] + part.visible().size][part.visible()] += part.values()
    dec = open_decryptor(party.keys[SCHEME], party.name)
    with fed.meter.time("he_decrypt_s"):
        for part in aggregate_payload.cipher:
            values = np.concatenate([dec.decrypt([blob], 1) for blob in part.blobs])
            at = 0
            for key, mask in part.layout:
                cluster, name = key.split("/", 1)
                count = int(mask.sum())
                out[int(cluster)][offsets[name]:offsets[name] + mask.size][mask] += values[at:at + count]
                at += count
    return out
