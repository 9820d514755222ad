"""Gaussian gradient noise without clipping or accounting: DAGER's `--defense_noise` defense.

Each client adds N(0, sigma^2) to every entry of its gradient before upload. The engine
hands a defense the update (-lr * gradient for one FedSGD step), so the noise on the
update is lr * sigma: sigma is an absolute standard deviation on the gradient scale, as in
DAGER (sigma = 1e-3 there) and iLRG. No epsilon is claimed: without clipping the noise
has no sensitivity to be calibrated against (DP-FedAvg is `dp-fedavg-local`).
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from bench.protocol.defense import Defense
from bench.protocol.wire import Payload, dense_payload
from bench.registry import DEFENSES


@DEFENSES.register("gaussian-noise", "absolute Gaussian noise sigma on every gradient entry (DAGER's defense; no DP)")
class GaussianNoise(Defense):
    links = {
        "paper": "https://arxiv.org/abs/2405.15586",
        "code": "https://github.com/insait-institute/dager-gradient-inversion",
    }
    key_topology = "none"

    def __init__(self, sigma: float = 1e-3) -> None:
        if not sigma >= 0.0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        super().__init__(sigma=sigma)
        self.sigma = sigma

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        state = client.party.state
        if "noise_rng" not in state:   # the client's own stream, apart from the engine's
            state["noise_rng"] = np.random.default_rng([fed.scenario.seed, 0x5A, zlib.crc32(client.name.encode())])
        rng, std = state["noise_rng"], self.sigma * fed.scenario.lr
        return dense_payload({n: t + torch.from_numpy(rng.normal(0.0, std, tuple(t.shape))).to(t.dtype)
                              for n, t in update.items()})
