"""audit-one-run: which of the many canaries in the attacked upload are in it? One score per canary.

The one-run audit of Steinke, Nasr and Jagielski (NeurIPS 2023) in its white-box, gradient-canary form: the
auditor planted `canaries` gradient canaries in the attacked client's one upload, each on its own entries and
each included by its own fair coin (bench/federation/canary.py), so the server's knowledge holds them all.
Each canary's score is the server's estimate of the update (the visible entries; minus the known global weights
when the protocol uploads trained weights) projected on that canary's visible entries and divided by its norm
there: the likelihood-ratio statistic of "canary in" under Gaussian noise, as audit-canary's for one canary.
A canary with no visible entry scores NaN and is abstained on. metrics/audit.py turns the scores into the
paper's epsilon lower bound (one_run_epsilon), metrics/membership.py into an AUROC over the canaries.

Blocked by design when the view holds no entry of any canary.
"""
from __future__ import annotations

import numpy as np
import torch

from attacks.audit.canary import update_estimate
from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS


@ATTACKS.register("audit-one-run", "privacy audit in one run: guesses from the server's view which of the many "
                                   "canaries the attacked upload holds (Steinke et al. 2023)")
class AuditOneRun(Attack):
    family = "audit"
    links = {"paper": "https://arxiv.org/abs/2305.08846",
             "code": "https://github.com/google-deepmind/jax_privacy/blob/main/jax_privacy/auditing.py"}

    def applicable(self, setting: Setting) -> str | None:
        if setting.canary != "one-run":
            return "needs a one-run audit's canaries; set the scenario's canary = \"one-run\" (and canaries, " \
                   "attack_repeats = 1)"
        return None

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if view.visible_fraction() == 0.0:
            return "the server view is empty: every entry is encrypted or kept local"
        if not any(bool(view.visible[n].any()) for n in knowledge.canary.update):
            return "every entry the canaries move is hidden from the server"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        canary = knowledge.canary
        dot = torch.zeros(canary.count, dtype=torch.float64)
        norm = torch.zeros(canary.count, dtype=torch.float64)
        for name, direction in canary.update.items():
            update = update_estimate(view, knowledge, name)
            seen = view.visible[name] & ~torch.isnan(update)
            owner, c = canary.owner[name][seen], direction.double()[seen]
            dot.index_add_(0, owner, update[seen] * c)
            norm.index_add_(0, owner, c.pow(2))
        scores = torch.where(norm > 0, dot / norm.clamp_min(1e-300).sqrt(), torch.nan)
        return Reconstruction(scores=scores.numpy(), extra={"canaries_scored": int((norm > 0).sum())})
