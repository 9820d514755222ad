"""Generic selective HE: a mask from a selection rule over a per-parameter score, at a ratio.

Encrypted positions travel as one packed CKKS vector (pre-weighted so the server only
adds), the rest in plaintext. The mask is global, computed once before the first round:
each client scores its parameters on its local data, the score maps are summed under HE
(the server never sees a local map), the decrypting party thresholds the sum. This is
FedML-HE's aggregate-then-threshold protocol; FedML-HE and FedHE-Full are this defense
with their own score and ratio. Rules `max`, `min` and `random` serve the selection-
strategy study (`strategies` suite).
"""
from __future__ import annotations

import numpy as np
import torch

from bench.crypto.keys import TOPOLOGIES, provision
from bench.protocol.defense import Defense
from bench.protocol.payloads import encrypt_part, hybrid_payload, pack, unpack
from bench.protocol.wire import Payload, Upload
from bench.registry import DEFENSES
from defenses.scores import RULES, SCORES, select


@DEFENSES.register("selective", "selective CKKS over a score (|w*grad|, Fisher, ...) with rule max/min/random at a ratio")
class SelectiveHE(Defense):
    """The mask is fixed at setup on the model the server chose, from clients' score maps summed under HE and
    thresholded by the decrypting party, so a malicious aggregation server picks the model the scores are
    computed on, not the threshold; entries of a later model the mask does not cover would go in plaintext."""

    key_topology = "shared-client-key"

    def __init__(self, rule: str = "max", ratio: float = 0.1, score: str = "sensitivity",
                 keys: str = "shared-client-key") -> None:
        if rule not in RULES:
            raise ValueError(f"rule '{rule}' must be one of {', '.join(RULES)}")
        if score not in SCORES:
            raise ValueError(f"score '{score}' must be one of {', '.join(SCORES)}")
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1], got {ratio}")
        if keys not in TOPOLOGIES:
            raise ValueError(f"keys '{keys}' must be one of {', '.join(TOPOLOGIES)}")
        super().__init__(rule=rule, ratio=ratio, score=score, keys=keys)
        self.rule, self.ratio, self.score, self.key_topology = rule, ratio, score, keys
        self.mask: dict[str, np.ndarray] = {}

    def setup(self, fed) -> None:
        self.key = provision(fed, self.key_topology)
        fed.parties["server"].state["he_params"] = self.key.params
        self.mask = self.global_mask(fed)

    def global_mask(self, fed) -> dict[str, np.ndarray]:
        """Sum the clients' local score maps under HE, then select on the decrypted sum."""
        total = sum(c.num_samples for c in fed.clients)
        uploads = []
        for client in fed.clients:
            local = SCORES[self.score](fed, client.x, client.y)
            weight = client.num_samples / total
            vector, layout = pack({n: v * weight for n, v in local.items()},
                                  {n: np.ones(v.numel(), bool) for n, v in local.items()})
            part = encrypt_part(fed, client, "ckks", vector, layout)
            payload = Payload(cipher=(part,))
            fed.send(client.name, "server", "encrypted score map", payload)
            uploads.append(Upload(client.name, -1, weight, payload))
        summed = Defense.aggregate(self, fed, uploads, fed.parties["server"])
        decoder = self.decoder(fed)
        fed.send("server", decoder.name, "aggregated score map", summed)
        scores = unpack(summed, fed.shapes, decoder, fed)
        return select(scores, self.ratio, self.rule, np.random.default_rng(fed.scenario.seed))

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        return hybrid_payload(fed, client, update, weight, self.mask)

    def run_metrics(self, fed) -> dict:
        return {"he_params": dict(self.key.params)}


@DEFENSES.register("fedhe-full", "FedHE-Full: every parameter encrypted with CKKS; the server view is empty")
class FedHEFull(SelectiveHE):
    """Every entry of whatever model the client trains is encrypted: no model the server sends changes that."""

    links = {"paper": "https://arxiv.org/abs/2303.10837", "code": "https://github.com/FedML-AI/FedML"}

    def __init__(self, keys: str = "shared-client-key") -> None:
        super().__init__(rule="max", ratio=1.0, keys=keys)

    def global_mask(self, fed) -> dict[str, np.ndarray]:
        return {n: np.ones(int(np.prod(s)) if s else 1, bool) for n, s in fed.shapes.items()}


@DEFENSES.register("fedml-he", "FedML-HE: top-p of the HE-aggregated label-sensitivity map, one global mask")
class FedMLHE(SelectiveHE):
    """Jin et al.: sensitivity d(grad)/d(label) per parameter (exact per-sample-gradient form, see
    defenses/scores.py), local maps aggregated under HE, top-p (default 0.10) fixed after round one.

    A malicious server chooses the model the mask is fixed on at setup (it sends it); the threshold is the
    decrypting party's (a client under the shared key, the key server otherwise).

    Each client's local map is the mean over its first 32 samples (scores.label_sensitivity's cap),
    not over all its data: one backward pass per sample is the cost, and the paper does not fix the
    sample count. A client's later samples do not shape the mask."""
    links = {"paper": "https://arxiv.org/abs/2303.10837", "code": "https://github.com/FedML-AI/FedML"}

    def __init__(self, ratio: float = 0.10, keys: str = "shared-client-key") -> None:
        super().__init__(rule="max", ratio=ratio, score="label-sensitivity", keys=keys)
