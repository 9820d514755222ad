"""Gradient pruning (Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019, section 5): each client zeroes
the fraction `p` of smallest-magnitude entries of every parameter of its upload before sending it.

The classic baseline of gradient-inversion benchmarks: the official iLRG code's `sparse` defense (copied
from GGL: entries below the p-th percentile of |g| per tensor set to zero) and GradAttack's GradPrune (the
per-tensor |g| quantile p). The threshold is per tensor, as there. Here exactly round(p * n) entries of a
tensor of n entries are zeroed (ties broken by position), where a percentile threshold may zero a few
fewer. The engine hands a defense the update (-lr * gradient for one FedSGD step, the weight delta for
FedAvg); scaling does not change which entries are smallest, so pruning the update is pruning the gradient.
The zeros travel as values: the server sees every entry, the pruned ones as 0 (no sparse encoding, so
the upload costs what plaintext's does).
"""
from __future__ import annotations

import torch

from bench.protocol.defense import Defense
from bench.protocol.wire import Payload, dense_payload
from bench.registry import DEFENSES


def prune(tensor: torch.Tensor, p: float) -> torch.Tensor:
    """`tensor` with its round(p * n) smallest-magnitude entries set to zero."""
    flat = tensor.reshape(-1)
    k = int(round(p * flat.numel()))
    if k == 0:
        return tensor.clone()
    order = torch.argsort(flat.abs(), stable=True)
    out = flat.clone()
    out[order[:k]] = 0
    return out.reshape(tensor.shape)


@DEFENSES.register("gradient-pruning", "zero the fraction p of smallest-magnitude entries of each parameter of every "
                                       "upload (DLG section 5; iLRG's sparse, GradAttack's GradPrune)")
class GradientPruning(Defense):
    key_topology = "none"
    # decode gives the weighted sum of the pruned updates, not of the updates handed to encode
    decodes_weighted_sum = False

    def __init__(self, p: float = 0.1) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        super().__init__(p=p)
        self.p = p

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        return dense_payload({name: prune(t, self.p) for name, t in update.items()})
