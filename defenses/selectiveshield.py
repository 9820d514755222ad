"""SelectiveShield (Li, Yan, Liu 2025): Fisher masks, consensus, personalization, DP noise zone, two servers.

Followed section by section:
- 4.1 Fisher information per parameter (eq. 12): the squared gradient of the local loss
  over the client's whole local data, at its model after local training (Algorithm 1,
  line 6 builds the mask from this round's training); per-layer (per-tensor) min-max
  normalization (eq. 13); client mask M_n = {j : I~_j > tau} (eq. 14).
- 4.2 Negotiation: each sampled client sends M_n (bit-packed, counted on the wire) to
  the aggregation server, which broadcasts the consensus M_enc = {j : share >= rho}
  (eq. 16); M_pers(n) = M_n minus M_enc stays local, never uploaded (eq. 17); the rest
  is the noise zone (eq. 18).
- 4.3 The encrypted zone is packed into CKKS under the key server's public key.
- 4.4 Noise zone: clipped to L2 norm `clip` (eq. 20) and noised (eq. 21). Eq. 21 writes
  the variance as (C sigma)^2 |K|, but eq. 22 charges each client alpha / (2 sigma^2),
  which is the RDP of noise std C*sigma on a release of sensitivity C. We follow eq. 22
  and add N(0, (C sigma)^2) per entry on each client. Under this reading the accountant
  (Opacus RDP with sample rate 1, i.e. no subsampling amplification, T steps, converted as
  in Lemma 2 / Balle et al.) gives the paper's T-round per-client bound for the noise-zone
  releases only: the Fisher masks M_n sent in the clear during negotiation depend on the
  data and are not covered, and the bound rests on reading eq. 21's |K| factor as a typo.
  sigma comes from `noise_multiplier` or from `target_epsilon`. Adjacency: the paper's, a client's
  clipped noise-zone vector against none (a zero vector), sensitivity C: user-level add/remove, as
  DP-FedAvg's rows read. Replacing a client's data moves the clipped vector by 2 C: that reading
  (`epsilon_replace_one`, z / 2: 34.13 where add/remove reads 13.78 by RDP over 6 rounds at z = 1)
  is recorded beside it. Every client, the attacked one included, is accounted at q = 1 every round.
- 4.5 Two servers: the key server alone holds the secret key; clients and the
  aggregation server get public material only. The aggregation server sums ciphertexts
  (eq. 23) and the noise-zone plaintexts (eq. 24), the key server decrypts (eq. 25) and
  applies theta += eta_g * mean update (eq. 26; eta_g = 1 is FedAvg with our mean). The
  noise-zone mean divides each entry by the number of clients that uploaded it (the
  counts follow from public layouts): the paper's sum over K would shrink entries that
  some clients keep personal.
- Eq. 27: each client keeps its personalized entries of its locally trained model and
  takes the global model elsewhere. Client sampling is the scenario's (Poisson in the
  paper: set sampling = "poisson").
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from bench.crypto.keys import provision
from bench.federation.accounting import RdpLedger, noise_for_epsilon, report
from bench.protocol.aggregation import Aggregation, CipherSum
from bench.protocol.defense import Defense
from bench.protocol.evidence import run_metric
from bench.protocol.payloads import hybrid_payload
from bench.protocol.wire import Message, Payload, PlainPart, Upload
from bench.registry import DEFENSES

run_metric("enc_fraction", "", None, "cost", "SelectiveShield: fraction of a client's update in the encrypted zone")
run_metric("pers_fraction", "", None, "cost", "SelectiveShield: fraction kept local in the personalized zone")
run_metric("noise_fraction", "", None, "cost", "SelectiveShield: fraction in the DP-noised plaintext zone")


def normalized_fisher(grads: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Eqs. 12-13: squared gradient, min-max normalized within each parameter tensor."""
    out = {}
    for name, g in grads.items():
        f = g.detach().double().reshape(-1).pow(2).numpy()
        span = f.max() - f.min() if f.size else 0.0
        out[name] = (f - f.min()) / span if span > 0 else np.zeros_like(f)
    return out


@DEFENSES.register("selectiveshield", "SelectiveShield: Fisher masks, consensus-encrypted zone (CKKS, key server), "
                   "personalized zone kept local, DP-noised rest")
class SelectiveShield(Defense):
    """A malicious server chooses the model the Fisher masks are computed on, and as aggregation server it
    forms the encrypted-zone consensus M_enc (eq. 16), which it can shrink to nothing for the attacked client;
    that client's own sensitive entries then stay local as M_pers, and only the key server decrypts."""

    links = {"paper": "https://arxiv.org/abs/2508.04265"}
    decodes_weighted_sum = False   # per-entry mean over the uploads that sent it, times server_lr (eqs. 23-26)
    key_topology = "key-server"
    differentially_private = True   # eq. 22's ledger; an instance with the noise module off is not

    def __init__(self, tau: float = 0.1, rho: float = 0.5, noise: bool = True, noise_multiplier: float | None = None,
                 target_epsilon: float | None = None, clip: float = 1.0, server_lr: float = 1.0) -> None:
        if not 0.0 <= tau <= 1.0 or not 0.0 <= rho <= 1.0:
            raise ValueError(f"tau and rho must be in [0, 1], got tau={tau}, rho={rho}")
        if noise and (noise_multiplier is None) == (target_epsilon is None):
            raise ValueError("with noise on, give exactly one of noise_multiplier or target_epsilon")
        if clip <= 0 or server_lr <= 0:
            raise ValueError("clip and server_lr must be > 0")
        super().__init__(tau=tau, rho=rho, noise=noise, noise_multiplier=noise_multiplier,
                         target_epsilon=target_epsilon, clip=clip, server_lr=server_lr)
        self.tau, self.rho, self.noise, self.clip, self.server_lr = tau, rho, noise, clip, server_lr
        self.differentially_private = bool(noise)
        self.noise_multiplier, self.target_epsilon = noise_multiplier, target_epsilon
        self.fractions: list[tuple[float, float, float]] = []

    def setup(self, fed) -> None:
        self.key = provision(fed, "key-server")
        self.ledger = None
        if self.noise:
            sigma = self.noise_multiplier or noise_for_epsilon(self.target_epsilon, fed.scenario.delta, 1.0,
                                                               fed.scenario.rounds)
            self.ledger = RdpLedger(sigma, sample_rate=1.0)

    def _client_mask(self, fed, client, update: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        model = fed.new_model()
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        current = client.merged(fed.params())   # the model local training started from
        trained = {n: current[n] + update[n] for n in fed.names}
        with torch.no_grad():
            for n, v in trained.items():
                state[n].copy_(v)
        client.party.state["trained"] = trained
        fisher = normalized_fisher(fed.gradient(client.x, client.y, model))
        return {n: fisher[n] > self.tau for n in fed.names}

    def round_start(self, fed, round: int, clients: list, updates: dict[str, dict[str, torch.Tensor]]) -> None:
        masks = {}
        for client in clients:
            masks[client.name] = self._client_mask(fed, client, updates[client.name])
            fed.send(client.name, "server", "sensitive mask", Message(np.packbits(np.concatenate(
                list(masks[client.name].values()))).tobytes(), "entries:bits"))
        votes = {n: sum(m[n].astype(np.int64) for m in masks.values()) for n in fed.names}
        self.enc = {n: votes[n] / len(clients) >= self.rho if self.rho > 0 else np.ones_like(votes[n], bool)
                    for n in fed.names}
        packed = np.packbits(np.concatenate(list(self.enc.values()))).tobytes()
        for client in clients:
            fed.send("server", client.name, "encrypted-zone consensus", packed)
            client.party.state["pers"] = {n: masks[client.name][n] & ~self.enc[n] for n in fed.names}
        if self.ledger is not None:
            self.ledger.step()
        self.round_clients = len(clients)

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        pers = client.party.state["pers"]
        noise_zone = {n: ~(self.enc[n] | pers[n]) for n in fed.names}
        sent = {n: update[n].detach().reshape(-1).double().clone() for n in fed.names}
        if self.noise:
            sent = self._clip_and_noise(fed, client, sent, noise_zone)
        enc = hybrid_payload(fed, client, {n: update[n] for n in fed.names}, 1.0 / self.round_clients, self.enc)
        plain = {n: PlainPart.of(sent[n].reshape(fed.shapes[n]).float(), noise_zone[n])
                 for n in fed.names if noise_zone[n].any()}
        total = sum(m.size for m in noise_zone.values())
        self.fractions.append((sum(int(m.sum()) for m in self.enc.values()) / total,
                               sum(int(m.sum()) for m in pers.values()) / total,
                               sum(int(m.sum()) for m in noise_zone.values()) / total))
        return Payload(plain=plain, cipher=enc.cipher)

    def _clip_and_noise(self, fed, client, values: dict[str, torch.Tensor], zone: dict[str, np.ndarray]):
        """Eqs. 20-21 on the noise-zone sub-vector only; std clip * sigma per entry (see module docstring)."""
        norm = math.sqrt(sum(float(values[n][torch.from_numpy(zone[n])].pow(2).sum()) for n in fed.names))
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        rng = client.party.state.setdefault("noise_rng", np.random.default_rng([fed.scenario.seed, client.index, 27]))
        std = self.clip * self.ledger.noise_multiplier
        out = {}
        for n in fed.names:
            z = torch.from_numpy(zone[n])
            noisy = values[n] * scale + torch.from_numpy(rng.normal(0.0, std, values[n].numel()))
            out[n] = torch.where(z, noisy, values[n])
        return out

    def start_aggregate(self, fed, server) -> Aggregation:
        """Eqs. 23-24 at the aggregation server as uploads arrive: ciphertext sum, per-entry mean of the noise zone."""
        return _ZoneMean(fed, server)

    def decode(self, fed, aggregate: Payload, party) -> dict[str, torch.Tensor]:
        """Eqs. 25-26 at the key server."""
        return {n: v * self.server_lr for n, v in super().decode(fed, aggregate, party).items()}

    def merge(self, fed, client, global_update: dict[str, torch.Tensor]) -> None:
        """Eq. 27: personalized entries of the locally trained model stay with the client."""
        pers, trained = client.party.state["pers"], client.party.state["trained"]
        client.local = {n: torch.where(torch.from_numpy(pers[n]).reshape(fed.shapes[n]), trained[n], torch.nan)
                        for n in fed.names if pers[n].any()}

    def run_metrics(self, fed) -> dict[str, Any]:
        enc, pers, noise = (float(np.mean(col)) for col in zip(*self.fractions)) if self.fractions else (0, 0, 0)
        out: dict[str, Any] = {"enc_fraction": enc, "pers_fraction": pers, "noise_fraction": noise,
                               "he_params": dict(self.key.params)}
        if self.ledger is not None:
            history = self.ledger.history   # every client's, the attacked one's too: q = 1 every round
            epsilons, details = report(
                fed.scenario.delta, history, history, level="user",
                sensitivity="C = clip: a client's clipped noise-zone vector against none (a zero vector), as eq. 22",
                sampling="none: every round accounted at q = 1 for every client (eq. 22)",
                covers="the noise-zone sub-vector of each upload (the aggregation server sees the encrypted zone as "
                       "ciphertext); not the Fisher masks sent in the clear nor the un-noised encrypted-zone sum in "
                       "the released model")
            out.update(epsilons, noise_multiplier=self.ledger.noise_multiplier, clip=self.clip,
                       upload_noise_multiplier=self.ledger.noise_multiplier,
                       dp=details | {"attacked_client": fed.clients[fed.scenario.attack_client].name,
                                     "noise_multiplier": self.ledger.noise_multiplier, "steps": self.ledger.steps,
                                     "target_epsilon": self.target_epsilon})
        return out


class _ZoneMean(Aggregation):
    """Running ciphertext sum, and per entry the running total and count of the noise-zone uploads that sent it."""

    def __init__(self, fed, server):
        self.fed, self.cipher = fed, CipherSum(fed, server)
        self.totals: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def fold(self, up: Upload) -> None:
        for n in self.fed.names:
            part = up.payload.plain.get(n)
            if part is not None:
                size = int(np.prod(self.fed.shapes[n])) if self.fed.shapes[n] else 1
                total, count = self.totals.setdefault(n, (np.zeros(size), np.zeros(size)))
                total[part.visible()] += part.values()
                count[part.visible()] += 1
        self.cipher.fold(up)

    def result(self) -> Payload:
        plain = {}
        for n in self.fed.names:
            if n not in self.totals:
                continue
            total, count = self.totals.pop(n)
            seen = count > 0
            if seen.any():
                mean = torch.from_numpy((total[seen] / count[seen]).astype(np.float32))
                dense = torch.zeros(total.size)
                dense[torch.from_numpy(seen)] = mean
                plain[n] = PlainPart.of(dense.reshape(self.fed.shapes[n]), seen)
        return Payload(plain=plain, cipher=self.cipher.result())
