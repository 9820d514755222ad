"""audit-canary: does the attacked upload hold the auditor's canary? One score per canary trial.

The server scores each trial with the best statistic its view allows (Nasr et al. 2023; Andrew et al.
2024), oriented "higher = canary in"; metrics/audit.py turns the scores of all trials into an audited
epsilon, metrics/membership.py into an AUROC.

- gradient canary: the inner product of the server's estimate of the update (the visible entries; minus
  the known global weights when the protocol uploads trained weights) with the canary direction on those
  entries, divided by the direction's norm there: under Gaussian noise this is the likelihood-ratio
  statistic of "canary in" against "nothing".
- mislabeled canary: the cosine between the visible update and minus the canary record's gradient at the
  global model the server sent (entries it does not know as zero), on the visible trainable entries:
  Grad-Cosine (FedMIA) on one record.

Blocked by design when the view holds no entry the statistic can use.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView, load
from bench.registry import ATTACKS


def update_estimate(view: ServerView, knowledge: Knowledge, name: str) -> torch.Tensor:
    """The update as the server reads it; when uploads carry weights, NaN where it does not know the start
    (a client-drawn LoRA A): taking that start as 0 would score the start as part of the update."""
    seen = view.values[name].double()
    if knowledge.uploads_weights:
        seen = seen - knowledge.global_params[name].double()
    return seen


@ATTACKS.register("audit-canary", "privacy audit: guesses from the server's view whether each canary trial's "
                                  "upload holds the auditor's canary")
class AuditCanary(Attack):
    family = "audit"
    links = {"paper": "https://arxiv.org/abs/2006.07709"}

    def applicable(self, setting: Setting) -> str | None:
        if setting.canary == "none":
            return "needs canary trials; set the scenario's canary to gradient or mislabeled and attack_repeats >= 40"
        if setting.canary == "one-run":
            return "the scenario plants many canaries in one upload, not one per trial; audit it with audit-one-run"
        if setting.canary == "mislabeled" and setting.knowledge.task != "classification":
            return f"a mislabeled canary needs a classification task, this scenario is {setting.knowledge.task}"
        return None

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if view.visible_fraction() == 0.0:
            return "the server view is empty: every entry is encrypted or kept local"
        canary = knowledge.canary
        if canary.kind == "gradient" and not any(bool((view.visible[n] & (canary.update[n] != 0)).any())
                                                  for n in canary.update):
            return "every entry the canary moves is hidden from the server"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        canary = knowledge.canary
        if canary.kind == "gradient":
            score = self._projection(view, knowledge)
        else:
            score = self._cosine(view, knowledge)
        return Reconstruction(scores=np.array([score]))

    @staticmethod
    def _projection(view: ServerView, knowledge: Knowledge) -> float:
        dot, norm = 0.0, 0.0
        for name, direction in knowledge.canary.update.items():
            update = update_estimate(view, knowledge, name)
            seen = view.visible[name] & ~torch.isnan(update)
            c = direction.double()[seen]
            dot += float((update[seen] * c).sum())
            norm += float(c.pow(2).sum())
        return dot / max(norm, 1e-30) ** 0.5

    @staticmethod
    def _cosine(view: ServerView, knowledge: Knowledge) -> float:
        canary = knowledge.canary
        model = load(knowledge, {n: torch.nan_to_num(v, nan=0.0) for n, v in knowledge.global_params.items()})
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(canary.x), canary.y).backward()
        params = dict(model.named_parameters())
        updates = {n: update_estimate(view, knowledge, n) for n in view.values if n in params}
        seen = {n: view.visible[n] & ~torch.isnan(u) for n, u in updates.items()}
        names = [n for n in updates if params[n].grad is not None and bool(seen[n].any())]
        if not names:
            return 0.0
        upload = torch.cat([updates[n][seen[n]] for n in names])
        grad = torch.cat([params[n].grad.double()[seen[n]] for n in names])
        return float(torch.nn.functional.cosine_similarity(upload, -grad, dim=0))
