"""DLG (Zhu, Liu, Han, NeurIPS 2019): dummy inputs and dummy labels optimized jointly by L-BFGS.

The paper's attack needs nothing but the shared gradient and the model: it learns soft labels
(softmax of free logits, the official code's dummy label) together with the inputs, so it runs
on any view whose visible entries include trainable parameters, head or no head. Shared
machinery in attacks/gradient/inversion.py: squared gradient distance over the visible entries only,
L-BFGS lr 1 with a strong-Wolfe line search (the official code uses plain L-BFGS, which
diverges on some seeds), N(0, 1) inits, best iterate kept, output clamped to [0, 1].

Choices, stated:
- `label_strategy = "auto"` (default) takes labels the scenario grants, else the iDLG rule when
  every head row is visible (iDLG showed it is exact where DLG's joint labels are not), else
  optimizes them; "optimize" is the paper's joint optimization everywhere.
- `steps = 300` outer L-BFGS steps as the official code (breaching's deepleakage.yaml: 1200),
  `restarts = 1` as both.
"""
from __future__ import annotations

from attacks.gradient.inversion import GradientInversion, Recipe
from bench.registry import ATTACKS


@ATTACKS.register("dlg", "DLG: joint L-BFGS optimization of dummy inputs and soft labels on the visible entries")
class DLG(GradientInversion):
    links = {"paper": "https://arxiv.org/abs/1906.08935", "code": "https://github.com/mit-han-lab/dlg"}

    def __init__(self, steps: int = 300, restarts: int = 1, tol: float = 1e-10, label_strategy: str = "auto") -> None:
        super().__init__(Recipe(objective="l2", optimizer="lbfgs", steps=steps, lr=1.0, restarts=restarts, tol=tol),
                         label_strategy, steps=steps, restarts=restarts, tol=tol)
