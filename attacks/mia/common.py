"""Shared pieces of the membership attacks: the base class, signals, shadow training.

Every attack returns `Reconstruction.scores`, one per candidate, oriented "higher = member";
each attack's docstring states its native sign and the conversion.
"""
from __future__ import annotations

import hashlib
import time
from abc import abstractmethod

import numpy as np
import torch
import torch.nn.functional as F

from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView, load, model_blocked


class ModelMIA(Attack):
    """Scores candidates on the final model the server can assemble (`fill` for hidden entries)."""

    family = "membership"
    needs_membership = True
    tasks: tuple[str, ...] = ("classification", "causal-lm")
    min_aux = 0                                  # auxiliary samples the attack needs (shadow data, prefixes)

    def __init__(self, fill: str = "last", **params) -> None:
        if fill not in ("zero", "last"):
            raise ValueError(f"fill '{fill}' must be 'zero' or 'last'")
        super().__init__(fill=fill, **params)
        self.fill = fill

    def applicable(self, setting: Setting) -> str | None:
        if setting.knowledge.task not in self.tasks:
            return f"needs a {' or '.join(self.tasks)} task, this scenario is {setting.knowledge.task}"
        if setting.mia_aux < self.aux_needed():
            return f"needs at least {self.aux_needed()} auxiliary samples, the scenario sets mia_aux = {setting.mia_aux}"
        return super().applicable(setting)

    def aux_needed(self) -> int:
        return self.min_aux

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        return model_blocked(knowledge)

    def target_model(self, knowledge: Knowledge) -> torch.nn.Module:
        return load(knowledge, knowledge.membership.assemble(self.fill))

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        torch.manual_seed(seed)
        scores, details = self.score(knowledge, seed)
        scores = np.asarray(scores, dtype=np.float64)
        return Reconstruction(scores=scores, extra={"details": {"attack_details": details}})

    @abstractmethod
    def score(self, knowledge: Knowledge, seed: int) -> tuple[np.ndarray, dict]:
        """(one "higher = member" score per candidate, details): each membership attack's own signal."""


@torch.no_grad()
def logits_of(model: torch.nn.Module, x: torch.Tensor, batch: int = 512) -> torch.Tensor:
    model.eval()
    return torch.cat([model(xb) for xb in x.split(batch)])


def logit_confidence(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """LiRA's phi = log p_y - log sum_{y' != y} p_y', computed stably from logits."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.clone()
    others.scatter_(1, y[:, None], float("-inf"))
    return true - torch.logsumexp(others, dim=1)


def train_shadow(knowledge: Knowledge, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.nn.Module:
    """A shadow/reference model: the server's initial model trained centrally on (x, y) with the
    scenario's recipe (rounds x local epochs of SGD at its lr and batch size)."""
    mk = knowledge.membership
    model = load(knowledge, mk.initial).train()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=mk.recipe["lr"])
    for _ in range(mk.recipe["epochs"]):
        for batch in torch.randperm(len(y), generator=gen).split(mk.recipe["batch_size"]):
            opt.zero_grad()
            mk.loss(model, x[batch], y[batch]).backward()
            opt.step()
    return model.eval()


_SHADOWS: dict[str, tuple] = {}   # attacker-side reuse: the same knowledge and recipe give the same shadows


def _shadow_key(knowledge: Knowledge, k: int, seed: int, pool: np.ndarray) -> str:
    """Everything shadow training depends on: architecture, initial model, auxiliary data, recipe, K, seed."""
    mk = knowledge.membership
    h = hashlib.sha256(repr((knowledge.model_name, sorted(knowledge.model_params.items()), sorted(mk.recipe.items()),
                             k, seed)).encode())
    for name in sorted(mk.initial):
        h.update(name.encode())
        h.update(mk.initial[name].detach().cpu().numpy().tobytes())
    for t in (mk.aux_x, mk.aux_y, torch.from_numpy(pool)):
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def shadow_models(knowledge: Knowledge, k: int, seed: int, pool: np.ndarray | None = None):
    """K shadows, each on a seeded random half of the auxiliary pool (LiRA's 50% sampling).
    Returns the models, their training masks over the pool, and the seconds their training took.
    Shadows depend only on what the attacker knows, so cells of one suite run that share that
    knowledge (every defense of a scenario starts from the same model) reuse them; the seconds
    reported are those of the one training."""
    mk = knowledge.membership
    pool = np.arange(len(mk.aux_y)) if pool is None else pool
    key = _shadow_key(knowledge, k, seed, pool)
    if key not in _SHADOWS:
        while len(_SHADOWS) >= 4:   # a few sets: a suite runs a scenario's groups one after another
            _SHADOWS.pop(next(iter(_SHADOWS)))
        _SHADOWS[key] = _train_shadows(knowledge, k, seed, pool)
    return _SHADOWS[key]


def _train_shadows(knowledge: Knowledge, k: int, seed: int, pool: np.ndarray):
    mk = knowledge.membership
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    models, masks = [], []
    for i in range(k):
        keep = np.zeros(len(pool), bool)
        keep[rng.choice(len(pool), size=len(pool) // 2, replace=False)] = True
        idx = torch.from_numpy(pool[keep])
        models.append(train_shadow(knowledge, mk.aux_x[idx], mk.aux_y[idx], seed * 7919 + i))
        masks.append(keep)
    return models, np.array(masks), time.perf_counter() - start


def per_sample_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y, reduction="none")
