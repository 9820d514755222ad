"""iDLG (Zhao et al. 2020): the label analytically, then the image by gradient matching with L-BFGS.

Labels (`label_strategy`): "idlg" reads them from the head's weight gradient with the iDLG rule
(batch 1: argmin_i sum_j dW_ij, as the official code; larger batches: the "iDLG-extended" rule
of the iLRG paper, see attacks/gradient/inversion.py); "known" takes the labels a scenario grants;
"auto" (default) uses granted labels where there are any and the rule otherwise. With the
labels granted the attack needs no head: it matches the lower layers the server sees, which is
how a defense that encrypts only the last layers still leaks the input. Without labels and
without a visible head it is blocked; `dlg` and `inverting-gradients` optimize the labels.

Image (attacks/gradient/inversion.py): dummy inputs ~ N(0, 1), L-BFGS (lr 1, strong-Wolfe line search),
squared distance between dummy and uploaded gradient over the visible entries only, `steps`
outer steps (the official code: 300), stop once the distance is below `tol`, best iterate kept.
`reconstruct = false` runs the label rule alone.
"""
from __future__ import annotations

import numpy as np

from attacks.gradient.inversion import GradientInversion, Recipe, idlg_labels
from bench.protocol.attack import Reconstruction, Setting, head_applicable, head_blocked
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS

__all__ = ["IDLG", "idlg_labels"]


@ATTACKS.register("idlg", "iDLG: sign-rule (or granted) labels + L-BFGS gradient matching on the visible entries")
class IDLG(GradientInversion):
    links = {
        "paper": "https://arxiv.org/abs/2001.02610",
        "code": "https://github.com/PatrickZH/Improved-Deep-Leakage-from-Gradients",
    }
    strategies = ("auto", "idlg", "known")

    def __init__(self, steps: int = 300, tol: float = 1e-10, label_strategy: str = "auto",
                 reconstruct: bool = True) -> None:
        super().__init__(Recipe(objective="l2", optimizer="lbfgs", steps=steps, lr=1.0, tol=tol), label_strategy,
                         steps=steps, tol=tol, reconstruct=reconstruct)
        self.reconstruct = reconstruct

    def applicable(self, setting: Setting) -> str | None:
        if self.reconstruct:
            return super().applicable(setting)
        return head_applicable(setting.knowledge, need_bias=False)

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if self.reconstruct:
            return super().blocked(view, knowledge)
        return head_blocked(view, knowledge, need_bias=False) or self.labels_from(view, knowledge)[1]

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        if self.reconstruct:
            return super().run(view, knowledge, seed)
        source, _ = self.labels_from(view, knowledge)
        if source == "known":
            return Reconstruction(label_counts=np.bincount(knowledge.labels, minlength=knowledge.num_classes),
                                  labels=list(knowledge.labels))
        counts, labels = idlg_labels(knowledge.gradient(view, knowledge.head[0]), knowledge.batch_size)
        return Reconstruction(label_counts=counts, labels=labels)
