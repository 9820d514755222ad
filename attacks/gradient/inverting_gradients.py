"""Inverting Gradients (Geiping, Bauermeister, Droege, Moeller, NeurIPS 2020).

Cosine distance between the dummy and the uploaded gradient plus total variation, minimized by
Adam on the sign of the input gradient, with the inputs projected into the data box [0, 1] after
every step and several restarts, the best kept by its gradient distance. Everything runs on the
entries the server sees (attacks/gradient/inversion.py): one cosine over the concatenated visible
entries, so a hidden head only removes terms.

Defaults follow breaching's invertinggradients.yaml: TV scale 0.2 (mean |dx| + mean |dy|),
Adam lr 0.1, signed ("hard") gradients, boxed, step decay x0.1 at 3/8, 5/8, 7/8 of the run,
cosine scoring of restarts. Its 24,000 iterations and one trial suit a GPU and ImageNet-size
inputs; the default here is `steps = 4000`, `restarts = 2` (the paper reports restarts as part
of the method), and suites that run on two CPU cores set fewer. Labels as in DLG: granted >
iDLG rule on a visible head > optimized jointly (`label_strategy`); the paper assumes the
iDLG-recovered label. On a FedAvg update (`attack_update = "delta"`) it replays the client's local
steps by default (`unroll`, the paper's section 6 "multiple local steps"); `unroll = False` matches
the update as one averaged gradient instead.
"""
from __future__ import annotations

from attacks.gradient.inversion import GradientInversion, Recipe
from bench.registry import ATTACKS


@ATTACKS.register("inverting-gradients", "Inverting Gradients: cosine distance + TV, signed Adam, box projection, "
                                         "restarts, on the visible entries")
class InvertingGradients(GradientInversion):
    links = {"paper": "https://arxiv.org/abs/2003.14053", "code": "https://github.com/JonasGeiping/invertinggradients"}

    def __init__(self, steps: int = 4000, restarts: int = 2, lr: float = 0.1, tv: float = 0.2,
                 label_strategy: str = "auto", unroll: bool = True) -> None:
        super().__init__(Recipe(objective="cosine", optimizer="adam", steps=steps, lr=lr, signed=True, boxed=True,
                                tv=tv, restarts=restarts, unroll=unroll), label_strategy,
                         steps=steps, restarts=restarts, lr=lr, tv=tv, unroll=unroll)
