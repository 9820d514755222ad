"""Secure aggregation (Bonawitz et al., CCS 2017; Flower's SecAgg+ without dropouts): pairwise additive masks.

Setup: every client sends an X25519 public key through the server, which forwards all of them; each pair
derives a shared mask key (bench/crypto/masking.py). Each round the server announces who takes part, each
client uploads its weighted update in fixed point plus the masks shared with higher-indexed participants
minus those with lower ones, and the server adds the uploads mod 2^64: the masks cancel and it learns the
weighted sum, hence the new global model, and nothing of any single upload.

Choices, stated: no dropout recovery (every announced participant uploads; Bonawitz's secret-shared seeds
and double masking handle dropouts and are out of scope here); the masked vectors travel as an opaque
ciphertext part, so the server view of one upload is empty and per-client attacks are blocked by design;
what remains is what the aggregate and the global model leak (model-based membership attacks still run).
Client masking time is reported as he_encrypt_s and the server's ring sum as he_aggregate_s.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.crypto import masking
from bench.crypto.clock import Spent, now, since
from bench.protocol.aggregation import Aggregation
from bench.protocol.defense import Defense
from bench.protocol.wire import CipherPart, Message, Payload, PlainPart, Upload, WireError
from bench.registry import DEFENSES

SCHEME = "pairwise-mask"


@DEFENSES.register("secagg", "secure aggregation: pairwise additive masks (X25519, ChaCha20), the server sees "
                             "only the sum")
class SecAgg(Defense):
    key_topology = "pairwise-masks"
    links = {"paper": "https://eprint.iacr.org/2017/281"}

    def setup(self, fed) -> None:
        publics = {}
        for client in fed.clients:
            secret, public = masking.keypair()
            client.party.state["secagg_secret"] = secret
            publics[client.index] = public
            fed.send(client.name, "server", "secagg public key", Message(public))
        directory = b"".join(publics[i] for i in sorted(publics))
        for client in fed.clients:
            fed.send("server", client.name, "secagg public keys", Message(directory))
            secret = client.party.state.pop("secagg_secret")
            client.party.state["secagg_keys"] = {i: masking.shared_key(secret, pub)
                                                 for i, pub in publics.items() if i != client.index}

    def round_start(self, fed, round: int, clients: list, updates) -> None:
        self.participants = sorted(c.index for c in clients)
        announcement = np.asarray(self.participants, dtype="<i4").tobytes()
        for client in clients:
            fed.send("server", client.name, "secagg participants", Message(announcement, "opaque"))

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        values = np.concatenate([update[n].detach().reshape(-1).double().numpy() * weight for n in fed.names])
        keys = {i: k for i, k in client.party.state["secagg_keys"].items() if i in self.participants}
        with fed.meter.time("he_encrypt_s"):
            blob = masking.masked(values, keys, client.index, fed.round).astype("<u8").tobytes()
        layout = tuple((n, np.ones(int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1, bool)) for n in fed.names)
        return Payload(cipher=(CipherPart(SCHEME, (blob,), layout, int(values.size)),))

    def start_aggregate(self, fed, server) -> Aggregation:
        """The ring sum as uploads arrive: one running vector mod 2^64, whatever the number of clients."""
        return _RingSum(self, fed)


class _RingSum(Aggregation):
    """The server's sum mod 2^64 (bench/crypto/masking.py's ring_sum), one upload at a time."""

    def __init__(self, defense: SecAgg, fed):
        self.defense, self.fed, self.total, self.senders, self.seconds = defense, fed, None, set(), Spent()

    def fold(self, up: Upload) -> None:
        if len(up.payload.cipher) != 1 or up.payload.cipher[0].scheme != SCHEME:
            raise WireError(up.sender, f"a secagg upload is one {SCHEME} part")
        part = up.payload.cipher[0]
        part.check(up.sender, self.fed.shapes)
        if len(part.blobs[0]) != 8 * part.length:
            raise WireError(up.sender, f"the masked vector has {len(part.blobs[0])} bytes for {part.length} values")
        vector = np.frombuffer(part.blobs[0], dtype="<u8")
        started = now()
        with np.errstate(over="ignore"):
            self.total = vector.astype(masking.RING) if self.total is None else self.total + vector
        self.seconds += since(started)
        self.senders.add(up.sender)

    def result(self) -> Payload:
        fed = self.fed
        if sorted(c.index for c in fed.clients if c.name in self.senders) != self.defense.participants:
            raise WireError("the aggregation server", "an announced participant sent no upload; without dropout "
                                                      "recovery the masks do not cancel")
        started = now()
        total = masking.decode(self.total)
        fed.meter.charge("he_aggregate_s", self.seconds + since(started))
        plain, offset = {}, 0
        for n in fed.names:
            size = int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1
            plain[n] = PlainPart.of(torch.from_numpy(total[offset:offset + size]).reshape(fed.shapes[n]))
            offset += size
        return Payload(plain=plain)
