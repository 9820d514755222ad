"""Membership-inference setting: candidates, the attacker's auxiliary data, the model it can assemble.

Threat model (README): the attacker is the aggregation server.
- Members are the federation's training data (scenario `mia_members = "all"`) or only the
  attacked client's (`"client"`); `mia_size` of them are drawn, seeded. Left unset, a run
  with a membership attack draws DEFAULT_SIZE, or as many as the data holds (members, and
  held-out samples after the auxiliary ones), whichever is fewer.
- Non-members are as many held-out test samples of the same distribution, which no client
  trained on. Token sequences are matched on length (each member gets a held-out sequence of its
  own token count, the nearest count when those run out): a split whose test side differs in
  length (SST-2's train phrases vs its dev sentences) would otherwise hand every attack, even on
  an untrained model, a signal that has nothing to do with training. The auxiliary data (`mia_aux` samples, for shadow and reference models, population
  samples and prefixes) is drawn from the rest of the test split, disjoint from both.
- Candidates are members and non-members shuffled together; the attacker gets them without
  labels. The labels stay in the ground truth.
- The model the server can assemble is the final global model: the entries it knows, plus
  each hidden entry filled with zero or with the last value it knew (the server built the
  initial model, so every entry starts known, except what a defense's clients draw themselves).
  Where the server can compute hidden entries from public parts of its own aggregates (a
  defense's `server_estimate`, e.g. SHE-LoRA's plaintext columns), it uses those values. Nothing
  known or computable means model-based attacks are blocked by design.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.view import MembershipKnowledge


def _length_matched(member_len: np.ndarray, pool_len: np.ndarray) -> np.ndarray:
    """Positions in the (already shuffled) pool: per member, the first unused one of its length, else the nearest."""
    free = np.ones(len(pool_len), bool)
    out = np.empty(len(member_len), np.int64)
    for i, length in enumerate(member_len):
        gap = np.where(free, np.abs(pool_len - length), np.iinfo(np.int64).max)
        out[i] = int(np.argmin(gap))   # first position among the nearest lengths
        free[out[i]] = False
    return out


DEFAULT_SIZE = 500   # members and as many non-members when a scenario leaves mia_size unset


def candidate_count(sc, members: int, held_out: int) -> int:
    """Members (= non-members) a run draws: mia_size, or the default bounded by what the data holds."""
    if sc.mia_size is not None:
        return min(sc.mia_size, members)
    return max(0, min(DEFAULT_SIZE, members, held_out - sc.mia_aux))


def check(sc, test_size: int) -> None:
    """Load-time: the held-out split can supply the non-members and the auxiliary samples."""
    need = (sc.mia_size or 0) + sc.mia_aux
    if need > test_size:
        raise ValueError(f"scenario '{sc.name}': {sc.mia_size or 0} non-members plus mia_aux={sc.mia_aux} auxiliary "
                         f"samples need {need} held-out test samples, the data has {test_size}; lower mia_size/"
                         "mia_aux or raise max_test")
    if sc.mia_size is None and test_size - sc.mia_aux < 1:
        raise ValueError(f"scenario '{sc.name}': mia_aux={sc.mia_aux} leaves no held-out test sample for "
                         f"non-members (the data has {test_size}); lower mia_aux or raise max_test")


def select(fed, known: dict[str, torch.Tensor], last: dict[str, torch.Tensor],
           initial: dict[str, torch.Tensor], wanted: bool = True,
           estimate: dict[str, torch.Tensor] | None = None) -> tuple[MembershipKnowledge, np.ndarray] | None:
    """Draw candidates and auxiliary data for the finished run; None when no attack of the run wants them.
    `estimate`: values the server computed itself for entries it does not know (Defense.server_estimate)."""
    sc = fed.scenario
    if not wanted or sc.mia_size == 0:
        return None
    rng = np.random.default_rng(sc.seed + 15485863)
    pool = [fed.clients[sc.attack_client]] if sc.mia_members == "client" else fed.clients
    mx = torch.cat([c.x for c in pool])
    my = torch.cat([c.y for c in pool])
    test_x, test_y = fed.data.test_x, fed.data.test_y
    check(sc, len(test_y))
    n = candidate_count(sc, len(my), len(test_y))
    members = rng.choice(len(my), size=n, replace=False)
    held = rng.permutation(len(test_y))
    pad = getattr(fed.data, "pad_id", None)
    if pad is not None and not mx.is_floating_point():
        non = _length_matched((mx[members] != pad).sum(1).numpy(), (test_x[held] != pad).sum(1).numpy())
        non = held[non]
        held = np.r_[non, held[~np.isin(held, non)]]   # the rest keeps its shuffled order
    non, aux = held[:n], held[n:n + sc.mia_aux]
    cx = torch.cat([mx[members], test_x[non]])
    cy = torch.cat([my[members], test_y[non]])
    labels = np.r_[np.ones(n, np.int64), np.zeros(n, np.int64)]
    order = rng.permutation(2 * n)
    params = fed.params()
    estimate = estimate or {}
    final = {k: torch.where(known[k], params[k], estimate[k] if k in estimate else torch.nan) for k in fed.names}
    recipe = {"epochs": sc.rounds * sc.local_epochs, "batch_size": sc.batch_size, "lr": sc.lr,
              "train_size": len(my) if sc.mia_members == "all" else len(pool[0].y)}
    mk = MembershipKnowledge(cx[order], cy[order], test_x[aux], test_y[aux], initial, final,
                             {k: v.clone() for k, v in last.items()}, recipe, fed.task.loss)
    return mk, labels[order]
