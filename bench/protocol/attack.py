"""The attack contract: a server view and the attacker's declared knowledge in, a reconstruction out.

An attack never sees ground truth. Two questions keep a configuration gap apart from a protection:
- `applicable(setting)`, asked when the suite loads: can the attack run in this scenario at all
  (task, inputs, model layout, membership pool)? A reason there is the suite's fault: one line,
  exit 2, nothing run.
- `blocked(view, knowledge)`, asked per run: does the defense's view or protocol prevent it
  (everything hidden, global weights unknown to the server)? Only then is a cell "blocked by design".

The threat model is data: a "passive" attack (the default) is the honest-but-curious server, which reads what
clients upload for the model every client got; a "malicious-model" attack is a server that changes the model
it sends the attacked client in the attacked round (`modify_model`, called by the engine for that one client
and round only; bench/federation/exchange.py) and reads the upload that model produces.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.protocol.configurable import Configurable
from bench.protocol.view import Knowledge, ServerView


@dataclass(frozen=True)
class Setting:
    """What a scenario fixes before any defense runs: the server's knowledge of round one (the
    public model, every entry known; no membership pool yet) and the membership pool's sizes."""

    knowledge: Knowledge
    mia_size: int | None      # None: the default pool (bench/federation/candidates.py), 0: none
    mia_aux: int
    labels_known: bool        # the scenario grants the attacker the batch's labels
    model: torch.nn.Module    # the scenario's public model as built (read it, never train it)
    canary: str = "none"      # the scenario's canary trials: none, gradient or mislabeled
    clients_per_round: int | None = None   # the cohort: clients a round (expected, under Poisson sampling)


@dataclass
class Reconstruction:
    label_counts: np.ndarray | None = None   # length num_classes, recovered count per class
    labels: list[int] | None = None          # recovered label multiset (per sample where known)
    images: torch.Tensor | None = None       # (B, C, H, W) in [0, 1]
    texts: list[str] | None = None
    scores: np.ndarray | None = None         # membership score per candidate, higher = member
    client_classes: np.ndarray | None = None   # bool per class: the classes the attacked client holds at all
    read_meta: list[str] = field(default_factory=list)   # metadata keys of the view the attack used
    extra: dict[str, Any] = field(default_factory=dict)


FAMILIES = ("label", "image", "text", "membership", "audit", "reference")
THREAT_MODELS = ("passive", "malicious-model")


class Attack(Configurable, ABC):
    """Subclasses implement `blocked` and `run` and declare their `family` (one of FAMILIES).

    The family is what the leaderboard's strongest-attack columns group by: "blocked" counts as
    protection only when no attack of that family ran. Reference rows (random guessing) are
    floors to compare against, never an attack's worst case."""

    family: str = ""
    needs_membership: bool = False   # scores membership candidates: the run draws them (bench/federation/candidates.py)
    threat_model: str = "passive"    # or "malicious-model": the server modifies the model it sends (modify_model)

    def applicable(self, setting: Setting) -> str | None:
        """Why this attack cannot run in this scenario whatever the defense (checked at suite load), or None."""
        if self.needs_membership and setting.mia_size == 0:
            return "it scores membership candidates and the scenario sets mia_size = 0; leave mia_size out for the " \
                   "default pool"
        if self.needs_membership and setting.canary != "none":
            return "the scenario's attacked uploads are canary trials; score membership in a scenario without canary"
        if self.threat_model != "passive" and setting.canary != "none":
            return "the scenario's attacked uploads are canary trials of the honest model; run a malicious-model " \
                   "attack in a scenario without canary"
        return None

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        """Why the defense's view or protocol prevents this attack on this upload, or None."""
        return None

    def modify_model(self, model: torch.nn.Module, knowledge: Knowledge) -> torch.nn.Module:
        """Malicious-model attacks only: the model the server sends the attacked client in the attacked round.

        `model` is the global model as the server can send it: its entries hold the values the server knows
        and NaN elsewhere (the client fills those in from what it decrypts, keyed by the tensors themselves, so
        keep the model's own parameters, do not copy them). Return any module that takes the same inputs (e.g.
        a block prepended to `model`); its parameters are what the client trains and uploads.
        `knowledge.public_x` holds public inputs of the task's distribution to tune it on."""
        return model

    @abstractmethod
    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        """Reconstruct what the view reveals; only visible entries may be used."""


def head_applicable(knowledge: Knowledge, need_bias: bool = True) -> str | None:
    """Shared scenario needs of label attacks: a classification task with a classifier head (with bias if asked)."""
    if knowledge.task != "classification":
        return f"needs a classification task, this scenario is {knowledge.task}"
    if need_bias and knowledge.head[1] is None:
        return f"needs a final linear layer with bias, model '{knowledge.model_name}' has none"
    return None


def head_blocked(view: ServerView, knowledge: Knowledge, need_bias: bool = True,
                 need_visible_head: bool = True) -> str | None:
    """Shared view needs of label attacks: a non-empty view and, unless the attack can run on what else it
    sees, some visible head entry."""
    if view.visible_fraction() == 0.0:
        return "the server view is empty: every entry is encrypted or kept local"
    weight, bias = knowledge.head
    names = [weight] + ([bias] if need_bias else [])
    if need_visible_head and all(not view.visible[n].any() for n in names):
        return "the classifier head is entirely hidden from the server"
    return None
