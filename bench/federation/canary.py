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

- one-run (Steinke, Nasr, Jagielski 2023): `canaries` gradient canaries ride in the attacked client's one
  upload, each added to its real update or not by its own fair coin, so one run audits them all. Each owns
  a random share of the update's entries (disjoint, spread over every layer) and is a random direction there;
  together they have norm `canary_norm`, each canary_norm / sqrt(canaries). Disjoint, they do not cross-talk
  in the server's projection; dense, no selection by magnitude singles them out. Under a per-upload clip they
  share the clip: each canary then gets about clip / sqrt(canaries / 2) of it.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from bench.protocol.view import Canary


def make_canary(fed) -> Canary | None:
    """The scenario's canary, drawn once per run from its seed; None without canary trials."""
    sc = fed.scenario
    if sc.canary == "none":
        return None
    if sc.canary == "one-run":
        return _one_run(fed)
    if sc.canary == "gradient":
        gen = torch.Generator().manual_seed(sc.seed * 7919 + 0xCA)
        direction = {n: torch.randn(fed.shapes[n], generator=gen) for n in fed.names}
        norm = float(torch.sqrt(sum(v.pow(2).sum() for v in direction.values())))
        return Canary("gradient", update={n: v * (sc.canary_norm / norm) for n, v in direction.items()})
    pick = int(np.random.default_rng([sc.seed, 0xCA]).integers(len(fed.data.test_y)))
    x, y = fed.data.test_x[pick:pick + 1], fed.data.test_y[pick:pick + 1]
    return Canary("mislabeled", x=x, y=(y + 1) % fed.data.num_classes)


def _one_run(fed) -> Canary:
    """`canaries` random directions on disjoint random shares of the update's entries, norm canary_norm together."""
    sc = fed.scenario
    sizes = [math.prod(fed.shapes[n]) for n in fed.names]
    total = sum(sizes)
    if sc.canaries > total:
        raise ValueError(f"a one-run audit of {sc.canaries} canaries needs as many update entries; model "
                         f"'{sc.model}' has {total}: lower canaries")
    gen = torch.Generator().manual_seed(sc.seed * 7919 + 0xC1)
    owner = torch.randperm(total, generator=gen) % sc.canaries
    values = torch.randn(total, generator=gen, dtype=torch.float64)
    norms = torch.zeros(sc.canaries, dtype=torch.float64).index_add_(0, owner, values.pow(2)).sqrt()
    values = (values / norms[owner] * (sc.canary_norm / math.sqrt(sc.canaries))).float()
    update = dict(zip(fed.names, (v.reshape(fed.shapes[n]) for n, v in zip(fed.names, values.split(sizes)))))
    owners = dict(zip(fed.names, (o.reshape(fed.shapes[n]) for n, o in zip(fed.names, owner.split(sizes)))))
    return Canary("one-run", update=update, owner=owners, count=sc.canaries)


def coins(fed) -> np.random.Generator:
    """The fair coin deciding which trials hold the canary (seeded: reruns repeat the trials)."""
    return np.random.default_rng([fed.scenario.seed, 0xC0])


def flip(canary: Canary, flips: np.random.Generator) -> bool | np.ndarray:
    """One trial's coin, or, for a one-run audit, one coin per canary."""
    return flips.integers(2, size=canary.count).astype(bool) if canary.kind == "one-run" else bool(flips.integers(2))


def trial_batch(canary: Canary, x: torch.Tensor, y: torch.Tensor, included: bool):
    """The attacked batch of a mislabeled-canary trial: its first record replaced by the canary when included."""
    if canary.kind != "mislabeled" or not included:
        return x, y
    return torch.cat([canary.x, x[1:]]), torch.cat([canary.y, y[1:]])


def trial_update(canary: Canary, update: dict[str, torch.Tensor], included) -> dict[str, torch.Tensor]:
    """A gradient-canary trial's upload: the canary or nothing; a mislabeled trial keeps the client's update; a
    one-run upload is the client's update plus its included canaries."""
    if canary.kind == "one-run":
        inside = torch.from_numpy(np.asarray(included, dtype=np.float32))
        return {n: v + canary.update[n] * inside[canary.owner[n]] for n, v in update.items()}
    if canary.kind != "gradient":
        return update
    return {n: canary.update[n].clone() if included else torch.zeros_like(v) for n, v in update.items()}
