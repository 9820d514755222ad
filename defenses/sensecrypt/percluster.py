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

from bench.crypto import clock
from bench.crypto import open_aggregator, open_decryptor, open_encryptor
from bench.protocol.wire import CipherPart, Payload, PlainPart, Upload
from defenses.sensecrypt.slices import SliceCosts, prefix_mask, timed

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
                   sizes: list[int], costs: SliceCosts | None = None) -> tuple[Payload, float, float, float]:
    """The client's upload: masked entries encrypted (times its cluster share), the rest plain, the mask in meta;
    with the measured encryption seconds, and the encryption seconds and upload bytes of the whole mask
    (extrapolated from the slice when sliced, else the measured ones)."""
    masks = split(mask, fed.names, sizes)
    plain = {n: PlainPart.of(update[n], None if not m.any() else ~m) for n, m in masks.items() if not m.all()}
    values = flatten(update, fed.names)[mask] * share
    take = values.size if costs is None else costs.take(values.size)
    if costs is None:
        with fed.meter.time("he_encrypt_s"):
            blobs, measured = timed(encrypt_each, client.party, values)
    else:
        blobs, measured = timed(encrypt_each, client.party, values[:take])
        masks = split(prefix_mask(mask, take), fed.names, sizes)
    layout = tuple((n, m) for n, m in masks.items() if m.any())
    cipher = (CipherPart(SCHEME, tuple(blobs), layout, int(take)),) if take else ()
    payload = Payload(plain=plain, cipher=cipher, meta={"mask": pack_mask(mask)}, layouts={"mask": "entries:bits"})
    if costs is None:
        return payload, measured, measured, payload.nbytes
    real_bytes = sum(len(b) for b in blobs)
    seconds = costs.record("he_encrypt", measured, take, values.size) if take else 0.0
    cipher_bytes = costs.record("ciphertext_bytes", real_bytes, take, values.size) if take else 0.0
    upload = payload.nbytes - real_bytes + cipher_bytes
    if not take:
        costs.note("he_encrypt", 0.0)
        costs.note("ciphertext_bytes", 0.0)
    costs.note("upload_bytes", upload)
    if take:   # the simulation's channel: the key server gets what decrypting every value would give
        costs.withheld[blobs[0]] = (mask, values)
    return payload, measured, seconds, upload


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
                      sizes: list[int], costs: SliceCosts | None = None
                      ) -> tuple[dict[str, PlainPart], CipherPart | None, np.ndarray, float]:
    """Plaintext parts, one ciphertext part over the union mask (its first entries when sliced), the union,
    and the seconds of the homomorphic sum (extrapolated when sliced), of one cluster's FedAvg."""
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
        return plain, None, union, 0.0
    adder = open_aggregator(server.keys[SCHEME], server.name)
    ranks = [np.cumsum(m) - 1 for m in masks]  # position of entry k within each client's ciphertext list
    entries = np.flatnonzero(union)
    take = entries.size if costs is None else costs.take(entries.size)

    def add_entries() -> list[bytes]:
        summed = []
        for k in entries[:take]:   # sliced: k is among each sender's first `take` masked entries, so encrypted
            blobs = [[up.payload.cipher[0].blobs[int(r[k])]] for up, m, r in zip(uploads, masks, ranks) if m[k]]
            names = [up.sender for up, m in zip(uploads, masks) if m[k]]
            if plain_count[k]:
                blobs.append(encrypt_each(server, plain_sum[k:k + 1]))
                names.append(server.name)
            summed.append(adder.add(blobs, names)[0])
        return summed

    if costs is None:
        with fed.meter.time("he_aggregate_s"):
            summed, seconds = timed(add_entries)
        sent = union
    else:
        summed, seconds = timed(add_entries)
        seconds = costs.record("he_aggregate", seconds, take, entries.size, keep=False)
        sent = prefix_mask(union, take)
        exact = np.where(union, plain_sum, 0.0)   # the simulation: what decrypting every union entry gives
        for up in uploads:
            if up.payload.cipher:
                mask, values = costs.withheld.pop(up.payload.cipher[0].blobs[0])
                exact[mask] += values
        costs.simulated[cluster] = exact
    layout = tuple((prefix + n, u) for n, u in split(sent, fed.names, sizes).items() if u.any())
    return plain, CipherPart(SCHEME, tuple(summed), layout, int(take)), union, seconds


def aggregate(fed, uploads: list[Upload], labels: list[int], shares: dict[str, float], server,
              sizes: list[int], costs: SliceCosts | None = None) -> Payload:
    """All clusters' aggregates in one message to the key server; names are prefixed '<cluster>/'."""
    index = {c.name: c.index for c in fed.clients}
    groups: dict[int, list[Upload]] = {}
    for up in uploads:
        groups.setdefault(labels[index[up.sender]], []).append(up)
    plain, cipher, meta = {}, [], {"clusters": json.dumps(sorted(groups)).encode()}
    seconds = 0.0
    for cluster in sorted(groups):
        p, c, union, took = aggregate_cluster(fed, cluster, groups[cluster], shares, server, sizes, costs)
        seconds += took
        plain.update(p)
        if c is not None:
            cipher.append(c)
        meta[f"union/{cluster}"] = pack_mask(union)
    if costs is not None:
        costs.note("he_aggregate", seconds)
    return Payload(plain=plain, cipher=tuple(cipher), meta=meta)


def decode(fed, aggregate_payload: Payload, party, sizes: list[int], costs: SliceCosts | None = None
           ) -> dict[int, np.ndarray]:
    """Key server: each cluster's weighted-average update as a flat float64 vector."""
    clusters = json.loads(aggregate_payload.meta["clusters"])
    out = {c: np.zeros(sum(sizes)) for c in clusters}
    offsets = dict(zip(fed.names, np.concatenate([[0], np.cumsum(sizes)[:-1]])))
    for key, part in aggregate_payload.plain.items():
        cluster, name = key.split("/", 1)
        out[int(cluster)][offsets[name]:offsets[name] + part.visible().size][part.visible()] += part.values()
    dec = open_decryptor(party.keys[SCHEME], party.name)
    real = {c: np.zeros(sum(sizes)) for c in clusters}
    decrypted = {c: np.zeros(sum(sizes), bool) for c in clusters}
    seconds, started = 0.0, clock.now()
    for part in aggregate_payload.cipher:
        values, took = timed(lambda: np.concatenate([dec.decrypt([blob], 1) for blob in part.blobs]))
        at = 0
        for key, mask in part.layout:
            cluster, name = key.split("/", 1)
            count = int(mask.sum())
            real[int(cluster)][offsets[name]:offsets[name] + mask.size][mask] += values[at:at + count]
            decrypted[int(cluster)][offsets[name]:offsets[name] + mask.size] |= mask
            at += count
        if costs is not None:
            union = unpack_mask(aggregate_payload.meta[f"union/{cluster}"], sum(sizes))
            took = costs.record("he_decrypt", took, part.length, int(union.sum()), keep=False)
        seconds += took
    if costs is None:
        fed.meter.charge("he_decrypt_s", clock.since(started))
        return {c: out[c] + real[c] for c in clusters}
    costs.note("he_decrypt", seconds)
    simulated, costs.simulated = costs.simulated, {}
    for c in clusters:
        if c in simulated:
            costs.check(real[c][decrypted[c]], simulated[c][decrypted[c]], f"key server, cluster {c}")
            out[c] += simulated[c]
    return out
