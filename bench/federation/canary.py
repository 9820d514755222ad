"""Canary trials: the attacked client's repeats in the attack round each hold a canary or not, by a fair
seeded coin, so that an auditor can turn the server's guesses into an empirical lower bound on epsilon
(Jagielski, Ullman, Oprea 2020; Nasr et al. 2021/2023). The auditor planted the canary, so the server's
knowledge includes it; which trials hold it is the ground truth (Truth.member, one label per trial).

- gradient: the canary client (Nasr et al. 2023's gradient canary, Andrew et al. 2024's canary clients):
  in a trial with the canary its update is a fixed random direction of norm `canary_norm` (above any clip,
  so a DP clip binds and the sensitivity is exactly the clip), without it the update is zero. This is the
  setting in which an audit of a per-upload DP mechanism can be tight.
- mislabeled: the attacked batch's first record is replaced by a held-out record (in no client's data)
  with a wrong label; the update is the client's real one on that batch.

Only the first repeat is aggregated (the engine's counterfactual uploads), so the trials measure the
upload under the defense's state of that round.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.view import Canary


def make_canary(fed) -> Canary | None:
    """The scenario's canary, drawn once per run from its seed; None without canary trials."""
    sc = fed.scenario
    if sc.canary == "none":
        return None
    if sc.canary == "gradient":
        gen = torch.Generator().manual_seed(sc.seed * 7919 + 0xCA)
        direction = {n: torch.randn(fed.shapes[n], generator=gen) for n in fed.names}
        norm = float(torch.sqrt(sum(v.pow(2).sum() for v in direction.values())))
        return Canary("gradient", update={n: v * (sc.canary_norm / norm) for n, v in direction.items()})
    pick = int(np.random.default_rng([sc.seed, 0xCA]).integers(len(fed.data.test_y)))
    x, y = fed.data.test_x[pick:pick + 1], fed.data.test_y[pick:pick + 1]
    return Canary("mislabeled", x=x, y=(y + 1) % fed.data.num_classes)


def coins(fed) -> np.random.Generator:
    """The fair coin deciding which trials hold the canary (seeded: reruns repeat the trials)."""
    return np.random.default_rng([fed.scenario.seed, 0xC0])


def trial_batch(canary: Canary, x: torch.Tensor, y: torch.Tensor, included: bool):
    """The attacked batch of a mislabeled-canary trial: its first record replaced by the canary when included."""
    if not included or canary.kind != "mislabeled":
        return x, y
    return torch.cat([canary.x, x[1:]]), torch.cat([canary.y, y[1:]])


def trial_update(canary: Canary, update: dict[str, torch.Tensor], included: bool) -> dict[str, torch.Tensor]:
    """A gradient-canary trial's upload: the canary or nothing; a mislabeled trial keeps the client's update."""
    if canary.kind != "gradient":
        return update
    return {n: canary.update[n].clone() if included else torch.zeros_like(v) for n, v in update.items()}
