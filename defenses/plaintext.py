"""Plaintext FedAvg: the reference row every defense is compared with; everything is visible."""
from __future__ import annotations

from bench.protocol.defense import Defense
from bench.registry import DEFENSES


@DEFENSES.register("plaintext", "plain FedAvg, no protection (reference row)")
class Plaintext(Defense):
    links = {"paper": "https://arxiv.org/abs/1602.05629"}
    key_topology = "none"
    reference_row = True
