"""Membership attacks on classifiers: LOSS, offline LiRA, offline RMIA, and update-based Grad-Cosine.

Sources and native signs (every score below is converted to "higher = member"):
- mia-loss (Yeom et al. 2018): per-sample cross-entropy, lower = member; score = -loss. For a
  causal LM the same attack scores the mean token log-likelihood (= -NLL, MIMIR's LOSS).
- mia-lira (Carlini et al. 2022, offline): phi = log p_y - log sum_{y'!=y} p_y' on the target
  model; K shadow models trained on random halves of the attacker's auxiliary data with the
  scenario's recipe are all OUT for every candidate. Offline LiRA is the one-sided test
  against N(mu_out, sigma_out^2); score = (phi - mu_out) / sigma_out, a monotone transform of
  that test's p-value (higher = member). `fixed_variance` pools sigma over all candidates, which
  the paper recommends with few shadows. The tensorflow/privacy reference averages phi over
  augmentations; here no augmentation is used (the scenarios train without any).
- mia-rmia (Zarifzadeh et al. 2024, offline, ML Privacy Meter's rule): signal = true-label
  probability; Pr(x) = ((1+a)/2) mean_OUT(x) + (1-a)/2 from reference models; score = fraction
  of population samples z with (p(x|target)/Pr(x)) / (p(z|target)/Pr(z)) > gamma. References
  train on random halves of the first part of the auxiliary data and the population z is the
  rest, so no z was seen by a reference. `a` is a parameter (Privacy Meter tunes it on a paired
  reference model; that tuning is not done here).
- mia-grad-cosine (FedMIA's Grad-Cosine baseline): cosine between a candidate's loss gradient at
  the attacked round's global model and the client's gradient direction (-upload), over the
  entries the server sees only; higher = member. Works on any non-empty view; entries of the
  global model the server does not know are filled as `fill` says (`last` uses the initial
  model, the last value the server surely knew).
"""
from __future__ import annotations

import numpy as np
import torch

from attacks.mia.common import ModelMIA, logit_confidence, logits_of, per_sample_loss, shadow_models
from bench.protocol.attack import Attack, Reconstruction
from bench.protocol.view import Knowledge, ServerView, load
from bench.registry import ATTACKS


@ATTACKS.register("mia-loss", "LOSS membership attack (Yeom et al.): -loss on the assembled final model")
class MIALoss(ModelMIA):
    links = {"paper": "https://arxiv.org/abs/1709.01604"}

    def score(self, knowledge: Knowledge, seed: int):
        mk = knowledge.membership
        if knowledge.task == "causal-lm":
            from attacks.mia.text import shared_stats
            return shared_stats(self, knowledge).mean_ll(), {"signal": "mean token log-likelihood"}
        model = self.target_model(knowledge)
        return -per_sample_loss(logits_of(model, mk.candidates_x), mk.candidates_y).numpy(), {"signal": "-CE"}


@ATTACKS.register("mia-lira", "offline LiRA (Carlini et al.): logit-scaled confidence vs K OUT shadow models")
class MIALiRA(ModelMIA):
    links = {
        "paper": "https://arxiv.org/abs/2112.03570",
        "code": "https://github.com/tensorflow/privacy/tree/master/research/mi_lira_2021",
    }
    tasks = ("classification",)

    def __init__(self, shadows: int = 8, fixed_variance: bool = True, fill: str = "last") -> None:
        if shadows < 2:
            raise ValueError("shadows must be >= 2 (a variance needs two OUT models)")
        super().__init__(fill=fill, shadows=shadows, fixed_variance=fixed_variance)
        self.shadows, self.fixed_variance = shadows, fixed_variance

    min_aux = 4   # shadow models' training data

    def score(self, knowledge: Knowledge, seed: int):
        mk = knowledge.membership
        x, y = mk.candidates_x, mk.candidates_y
        target = logit_confidence(logits_of(self.target_model(knowledge), x), y).numpy()
        models, _, seconds = shadow_models(knowledge, self.shadows, seed)
        outs = np.stack([logit_confidence(logits_of(m, x), y).numpy() for m in models])
        mu = outs.mean(0)
        sigma = np.full_like(mu, outs.std()) if self.fixed_variance else outs.std(0, ddof=1)
        return (target - mu) / (sigma + 1e-12), {"shadow_train_s": seconds, "shadows": self.shadows}


@ATTACKS.register("mia-rmia", "offline RMIA (Zarifzadeh et al.): likelihood ratio vs population samples, gamma")
class MIARMIA(ModelMIA):
    links = {"paper": "https://arxiv.org/abs/2312.03262", "code": "https://github.com/privacytrustlab/ml_privacy_meter"}
    tasks = ("classification",)

    def __init__(self, references: int = 4, gamma: float = 1.0, a: float = 0.3, population: int = 500,
                 fill: str = "last") -> None:
        if references < 1 or population < 1 or gamma <= 0 or not 0.0 <= a <= 1.0:
            raise ValueError("references, population >= 1, gamma > 0 and a in [0, 1] are required")
        super().__init__(fill=fill, references=references, gamma=gamma, a=a, population=population)
        self.references, self.gamma, self.a, self.population = references, gamma, a, population

    def aux_needed(self) -> int:
        return self.population + 4   # population samples plus reference models' training data

    def score(self, knowledge: Knowledge, seed: int):
        mk = knowledge.membership
        n_ref = len(mk.aux_y) - self.population
        models, _, seconds = shadow_models(knowledge, self.references, seed, pool=np.arange(n_ref))
        z = torch.arange(n_ref, len(mk.aux_y))

        def prob(model, x, y):
            return torch.softmax(logits_of(model, x), 1).gather(1, y[:, None]).squeeze(1).double().numpy()

        def ratio(x, y):
            p_ref = np.mean([prob(m, x, y) for m in models], axis=0)
            marginal = (1 + self.a) / 2 * p_ref + (1 - self.a) / 2
            return prob(target, x, y) / marginal

        target = self.target_model(knowledge)
        rx = ratio(mk.candidates_x, mk.candidates_y)
        rz = np.sort(ratio(mk.aux_x[z], mk.aux_y[z]))
        # fraction of z with rx / rz > gamma  <=>  rz < rx / gamma
        scores = np.searchsorted(rz, rx / self.gamma, side="left") / len(rz)
        return scores, {"shadow_train_s": seconds, "references": self.references, "population": len(rz)}


@ATTACKS.register("mia-grad-cosine", "update-based (FedMIA Grad-Cosine): cosine of a candidate's gradient "
                  "with the visible upload")
class MIAGradCosine(Attack):
    links = {"paper": "https://arxiv.org/abs/2402.06289", "code": "https://github.com/Liar-Mask/FedMIA"}
    family = "membership"
    needs_membership = True

    def __init__(self, fill: str = "last") -> None:
        if fill not in ("zero", "last"):
            raise ValueError(f"fill '{fill}' must be 'zero' or 'last'")
        super().__init__(fill=fill)
        self.fill = fill

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if view.visible_fraction() == 0.0:
            return "the server sees no entry of the attacked upload"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        mk = knowledge.membership
        params = {n: torch.where(torch.isnan(v), torch.zeros_like(v) if self.fill == "zero" else mk.initial[n], v)
                  for n, v in knowledge.global_params.items()}
        model = load(knowledge, params)
        state = dict(model.named_parameters())
        names = [n for n in view.values if n in state and state[n].requires_grad and view.visible[n].any()]
        direction = torch.cat([torch.nan_to_num(-view.values[n])[view.visible[n]] for n in names])
        scores = np.empty(len(mk.candidates_y))
        for i in range(len(mk.candidates_y)):
            model.zero_grad()
            mk.loss(model, mk.candidates_x[i:i + 1], mk.candidates_y[i:i + 1]).backward()
            grad = torch.cat([state[n].grad[view.visible[n]] if state[n].grad is not None
                              else torch.zeros(int(view.visible[n].sum())) for n in names])
            scores[i] = float(torch.nn.functional.cosine_similarity(grad, direction, dim=0))
        return Reconstruction(scores=scores, extra={"details": {"attack_details": {
            "visible_fraction": view.visible_fraction(), "entries_used": int(direction.numel())}}})
