"""The attack contract: a server view and the attacker's declared knowledge in, a reconstruction out.

An attack never sees ground truth. `blocked` returns the reason when the view or the
knowledge cannot meet the attack's needs; the cell is then recorded as "blocked by
design", neither a number nor an error.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.configurable import Configurable
from bench.view import Knowledge, ServerView


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


FAMILIES = ("label", "image", "text", "membership", "reference")


class Attack(Configurable, ABC):
    """Subclasses implement `blocked` and `run` and declare their `family` (one of FAMILIES).

    The family is what the leaderboard's strongest-attack columns group by: "blocked" counts as
    protection only when no attack of that family ran. Reference rows (random guessing) are
    floors to compare against, never an attack's worst case."""

    family: str = ""

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        return None

    @abstractmethod
    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        """Reconstruct what the view reveals; only visible entries may be used."""


def head_blocked(view: ServerView, knowledge: Knowledge, need_bias: bool = True,
                 need_visible_head: bool = True) -> str | None:
    """Shared needs of label attacks: a non-empty view, a classification task, a classifier head
    (with bias if asked) and, unless the attack can run on what else it sees, some visible head entry."""
    if view.visible_fraction() == 0.0:
        return "the server view is empty: every entry is encrypted or kept local"
    if knowledge.task != "classification":
        return f"needs a classification task, this scenario is {knowledge.task}"
    weight, bias = knowledge.head
    if need_bias and bias is None:
        return "needs a final linear layer with bias"
    names = [weight] + ([bias] if need_bias else [])
    if need_visible_head and all(not view.visible[n].any() for n in names):
        return "the classifier head is entirely hidden from the server"
    return None
