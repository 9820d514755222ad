"""Reference rows for the label leaderboard: the iDLG-extended rule and a random guess.

iDLG-extended (the iLRG paper's comparison baseline) marks every class whose weight-gradient
row sums to a negative value as present, once; it reads only the head's weight gradient
and reconstructs no images. The random guess draws the K labels uniformly from the C
classes: it uses no upload at all, so whatever it scores is the floor any attack must
beat. Beside iLRG it shows how much of LeAcc/LnAcc true negatives give away when K << C.
"""
from __future__ import annotations

import numpy as np

from attacks.gradient.inversion import idlg_labels
from bench.protocol.attack import Attack, Reconstruction, Setting, head_applicable, head_blocked
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS


@ATTACKS.register("idlg-extended", "iDLG-extended label rule: classes with a negative weight-gradient row sum")
class IDLGExtended(Attack):
    links = {"paper": "https://openreview.net/forum?id=FIrQfNSOoTr", "code": "https://github.com/BUAA-CST/iLRG"}
    family = "label"

    def applicable(self, setting: Setting) -> str | None:
        return head_applicable(setting.knowledge, need_bias=False)

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        return head_blocked(view, knowledge, need_bias=False)

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        grad_w = knowledge.gradient(view, knowledge.head[0])
        counts, labels = idlg_labels(grad_w.reshape(grad_w.shape[0], -1), knowledge.batch_size)
        return Reconstruction(label_counts=counts, labels=labels)


@ATTACKS.register("no-attack", "no attack: the cell records the run's utility, cost and run-level privacy metrics")
class NoAttack(Attack):
    """For suites that measure what a defense costs (bytes, time, accuracy, KDE MI) where no attack applies."""

    family = "reference"

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        return Reconstruction()


@ATTACKS.register("random-guess", "K labels drawn uniformly at random: the floor of the label metrics")
class RandomGuess(Attack):
    family = "reference"

    def applicable(self, setting: Setting) -> str | None:
        if setting.knowledge.task != "classification":
            return f"guesses class labels, this scenario is {setting.knowledge.task}"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        labels = np.random.default_rng(seed).integers(0, knowledge.num_classes, size=knowledge.batch_size)
        return Reconstruction(label_counts=np.bincount(labels, minlength=knowledge.num_classes),
                              labels=[int(c) for c in labels])
