"""MaskCrypt (Hu & Li, TDSC 2024), with the mask selection of the authors' code.

Taken from Plato (TL-System/plato at 60d6779a0be16bd529f5f9d9cd34fd4d47f4e95a,
examples/secure_aggregation/maskcrypt; tests/fixtures/maskcrypt_plato.json checks parity):
- the proposal: each sampled client ranks entries by (w_exposed - w_latest) * g, where w_latest
  is its trained model and g the gradient of its local loss there, and proposes the top k;
- the estimate w_exposed (maskcrypt_utils.update_est), kept by each client: every global model it
  receives overwrites the entries that model carried in the clear, and so does its own upload;
  entries sent encrypted keep their last value, zeros if the client never saw them in the clear.
  The initial global is sent in the clear, so a client of round 0 starts from it;
- the consensus: proposals interleaved round-robin, first occurrences kept, not truncated (the
  encrypted fraction lies between rho and K*rho); masked entries go into one packed CKKS vector.

Differences, stated: k = max(1, round(rho * n)) (Plato: int(rho * n), which may be 0); proposal and
upload in one round (Plato proposes in odd rounds and uploads in even ones, the same clients: the same
information flow); updates are deltas, not weights: the estimate still counts an entry sent in the
clear as exposed, as Plato's does, though our server knows its value only where it knew it before;
under a key server (maskcrypt-paillier) every global reaches the clients decrypted, so in the clear;
CKKS parameters come from bench/crypto for the round's client count (Plato: N 8192, [60, 40, 40, 60],
scale 2^40); a proposal costs 4 bytes an index, and the index list rides with every upload, so it is
in the server view and in the upload's bytes. Default rho: 0.05 for MNIST-size inputs, 0.10 for
3-channel (CIFAR/ResNet) inputs, as in Plato's configs.

Budget matching (`match_bytes`, `bytes_ratio`; bench/federation/budget.py): rho is set so the packed vector
fills the whole ciphertexts that cost the target bytes (bytes per ciphertext measured on a real
encryption with this run's key), and the union is capped at that many entries, so the upload's
ciphertext bytes equal the target to within one ciphertext's rounding; a target above the cost
of encrypting every entry encrypts every entry.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.crypto import open_encryptor
from bench.crypto.keys import TOPOLOGIES, provision
from bench.federation.budget import check_target
from bench.protocol.defense import Defense
from bench.protocol.evidence import run_metric
from bench.protocol.payloads import hybrid_payload
from bench.protocol.wire import Message, Payload
from bench.registry import DEFENSES

run_metric("target_cipher_bytes", "B", None, "cost", "ciphertext bytes per upload that budget matching aimed at "
           "(the reference's bytes x bytes_ratio)", fmt="{:,.0f}")


def round_robin_union(proposals: list[np.ndarray]) -> np.ndarray:
    """p1[0], p2[0], ..., p1[1], ... with first occurrences kept."""
    seen: dict[int, None] = {}
    for i in range(max((len(p) for p in proposals), default=0)):
        for p in proposals:
            if i < len(p):
                seen.setdefault(int(p[i]), None)
    return np.fromiter(seen, dtype=np.int64, count=len(seen))


def refresh_exposed(state: dict, values: np.ndarray, hidden: np.ndarray | None) -> None:
    """Plato's update_est at one client: entries sent in the clear take `values`; `hidden` (encrypted) ones
    keep the last estimate, zeros before the first."""
    new = np.array(values, dtype=np.float64)
    if hidden is not None:
        old = state.get("exposed")
        new[hidden] = 0.0 if old is None else old[hidden]
    state["exposed"] = new


@DEFENSES.register("maskcrypt", "MaskCrypt: per-client gradient-guided top-rho proposals, ordered union, CKKS")
class MaskCrypt(Defense):
    """A malicious server influences the mask twice: each client ranks entries on the model the server sent
    (its proposal scores that model's gradients), and the server forms and broadcasts the consensus, so it can
    send the attacked client a union that leaves the entries it wants in plaintext; it cannot decrypt alone."""

    links = {"paper": "https://doi.org/10.1109/TDSC.2024.3392424", "code": "https://github.com/TL-System/plato"}
    key_topology = "shared-client-key"

    def __init__(self, rho: float | None = None, random_mask: bool = False, keys: str = "shared-client-key",
                 match_bytes: str | None = None, bytes_ratio: float = 1.0) -> None:
        if rho is not None and not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        if keys not in TOPOLOGIES:
            raise ValueError(f"keys '{keys}' must be one of {', '.join(TOPOLOGIES)}")
        check_target(match_bytes, bytes_ratio)
        if match_bytes is not None and rho is not None:
            raise ValueError("give rho or match_bytes, not both: a matched budget sets rho")
        super().__init__(rho=rho, random_mask=random_mask, keys=keys, match_bytes=match_bytes,
                         bytes_ratio=bytes_ratio)
        self.rho, self.random_mask, self.key_topology = rho, random_mask, keys
        self.target_bytes: float | None = None
        self.matched_cap: int | None = None
        self.last_union: tuple[int, np.ndarray] | None = None   # (round, encrypted entries of its aggregate)

    def cipher_target(self) -> tuple[str, float] | None:
        match = self.params.get("match_bytes")
        return None if match is None else (match, float(self.params.get("bytes_ratio", 1.0)))

    def match_cipher_bytes(self, nbytes: float) -> None:
        self.target_bytes = float(nbytes)

    def setup(self, fed) -> None:
        self.key = provision(fed, self.key_topology)
        self.sizes = [int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1 for n in fed.names]
        if self.target_bytes is not None:
            enc = open_encryptor(self.key.public_only(), "a client")
            self.per_ciphertext = len(enc.encrypt(np.zeros(enc.values_per_blob))[0])
            count = max(1, int(round(self.target_bytes / self.per_ciphertext)))
            self.matched_cap = min(sum(self.sizes), count * enc.values_per_blob)
            self.rho = self.matched_cap / sum(self.sizes)
        if self.rho is None:
            self.rho = 0.10 if fed.data.input_shape[0] == 3 else 0.05

    def _flat(self, tensors: dict[str, torch.Tensor], names) -> np.ndarray:
        return np.concatenate([tensors[n].detach().reshape(-1).double().numpy() for n in names])

    def _proposal(self, fed, client, update: dict[str, torch.Tensor]) -> np.ndarray:
        total = sum(self.sizes)
        k = max(1, int(round(self.rho * total)))
        current = fed.params()   # the global model this client received and trained from
        refresh_exposed(client.party.state, self._flat(current, fed.names), self._hidden_in_global(fed))
        latest = {n: current[n] + update[n] for n in fed.names}
        client.party.state["latest"] = self._flat(latest, fed.names)
        if self.random_mask:   # the client's own stream: never the engine's client-sampling generator
            rng = client.party.state.setdefault("mask_rng", np.random.default_rng([fed.scenario.seed, 0x4D43,
                                                                                   client.index]))
            return rng.choice(total, size=k, replace=False)
        model = fed.new_model()
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            for n, v in latest.items():
                state[n].copy_(v)
        grads = self._flat(fed.gradient(client.x, client.y, model), fed.names)
        score = (client.party.state["exposed"] - client.party.state["latest"]) * grads
        return np.argsort(-score, kind="stable")[:k]

    def _hidden_in_global(self, fed) -> np.ndarray | None:
        """Entries the current global model reached clients encrypted: the union of the round that made it,
        whose index list comes with it; none for the initial model or when a key server decrypts."""
        if self.last_union is None or self.last_union[0] != fed.round - 1 or self.decoder(fed).name == "key-server":
            return None
        return self.last_union[1]

    def round_start(self, fed, round: int, clients: list, updates: dict) -> None:
        proposals = [self._send_proposal(fed, round, c, updates[c.name]) for c in clients]
        self._set_consensus(fed, clients, self._limit(round_robin_union(proposals)))

    def _send_proposal(self, fed, round: int, client, update: dict[str, torch.Tensor]) -> np.ndarray:
        proposal = self._proposal(fed, client, update)
        fed.send(client.name, "server", "mask proposal", Message(proposal.astype("<i4").tobytes(), "entries:i4"))
        return proposal

    def _limit(self, union: np.ndarray) -> np.ndarray:
        """Plato keeps the whole ordered union; a matched budget caps it at the entries it pays for."""
        return union if self.matched_cap is None else union[: self.matched_cap]

    def _set_consensus(self, fed, clients: list, union: np.ndarray) -> None:
        self.indices = union.astype("<i4").tobytes()
        for client in clients:
            fed.send("server", client.name, "mask consensus", self.indices)
        flat = np.zeros(sum(self.sizes), bool)
        flat[union] = True
        self.mask = dict(zip(fed.names, np.split(flat, np.cumsum(self.sizes)[:-1])))
        self.last_union = (fed.round, flat)
        for client in clients:  # each client's upload shows its plaintext entries (Plato: after model_encrypt)
            latest = client.party.state.pop("latest", None)
            if latest is not None:
                refresh_exposed(client.party.state, latest, flat)

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        payload = hybrid_payload(fed, client, update, weight, self.mask)
        return Payload(plain=payload.plain, cipher=payload.cipher, meta={"indices": self.indices},
                       layouts={"indices": "entries:i4"})

    def run_metrics(self, fed) -> dict:
        out = {"he_params": dict(self.key.params)}
        if self.target_bytes is not None:
            out["target_cipher_bytes"] = self.target_bytes
        return out
