"""Shared machinery of the gradient-inversion attacks (iDLG, DLG, Inverting Gradients).

All three optimize dummy inputs until the gradient they produce at the server's copy of the
global model matches the client's upload. What they share lives here, once:

- Target: the client's gradient (knowledge.gradient: -update / (lr * local steps)) on exactly
  the entries the server sees. On a FedAvg update (several local steps) a recipe with `unroll`
  replays the client's local SGD on the dummy batch, differentiably, and matches the update it
  produces (Geiping et al. 2020, section 6; inversefed's `loss_steps`): mini-batches of the
  protocol's local batch size in order, so one local epoch is matched exactly up to the order of
  the dummies, more epochs are matched as if the client did not reshuffle. Hidden entries are
  unknown; they are zero in the target, masked out of every distance and never read, so a view
  that hides the head still yields a loss over the lower layers. Only trainable parameters are matched (buffers drift, they have no gradient).
- Objectives: the squared Euclidean distance (DLG, iDLG) and one cosine distance over the
  concatenated visible entries, 1 - <g, t> / (|g| |t|) (Inverting Gradients; breaching's
  CosineSimilarity objective and inversefed's "sim" cost take one cosine over all layers too).
  Total variation as breaching defines it: mean |dx| + mean |dy| of neighbouring pixels.
- Labels (`label_strategy`): "known" uses the labels the scenario grants; "idlg" reads them with
  the iDLG rule from the head's weight-gradient rows (needs a visible entry in every row; the
  sign argument holds for any visible column); "optimize" learns soft labels jointly, as DLG
  does (free logits, softmax targets in the cross-entropy); "auto" takes the first of
  known > idlg > optimize that the view allows.
- The loop: `restarts` trials from N(0, 1) inputs (and N(0, 1) label logits), each keeping its
  best iterate by the objective; the best trial wins by its gradient distance (breaching's
  restart scoring). L-BFGS runs with lr 1 and a strong-Wolfe line search (plain L-BFGS diverges
  on some seeds); Adam can take the sign of the input gradient (breaching's signed "hard") and
  step decay x0.1 at 3/8, 5/8 and 7/8 of the run (breaching's "step-lr"). `boxed` projects the
  inputs into the data range [0, 1] after every step. Images are returned clamped to [0, 1].
- Device: the optimization runs on the run's device (bench/models/torch_device.py); dummy inputs and label
  logits are drawn on the CPU from the seeded generator and moved, so both devices start alike.

An attack is blocked only when it cannot run at all: an empty view, a server that does not know
the global weights, no visible trainable entry, non-image inputs, or labels it cannot obtain.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bench.models import torch_device
from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView

LABEL_STRATEGIES = ("auto", "known", "idlg", "optimize")
OBJECTIVES = ("l2", "cosine")
OPTIMIZERS = ("lbfgs", "adam")


# ------------------------------------------------------------------------------------- labels

def idlg_labels(grad_w: torch.Tensor, batch_size: int) -> tuple[np.ndarray, list[int]]:
    """iDLG rule on the head's weight gradient (NaN entries ignored): counts and per-image labels.

    Batch 1: argmin_i sum_j dW_ij, as the official code. Larger batches: the "iDLG-extended" rule
    of the iLRG paper, every class with a negative row sum exists once; images take them in turn."""
    row_sums = torch.nansum(grad_w.reshape(grad_w.shape[0], -1), dim=1)
    counts = np.zeros(grad_w.shape[0], dtype=np.int64)
    if batch_size == 1:
        label = int(torch.argmin(row_sums))
        counts[label] = 1
        return counts, [label]
    present = [int(i) for i in torch.nonzero(row_sums < 0).flatten()] or [int(torch.argmin(row_sums))]
    counts[present] = 1
    return counts, [present[i % len(present)] for i in range(batch_size)]


def head_rows_visible(view: ServerView, knowledge: Knowledge) -> bool:
    """Every row of the head's weight gradient has at least one entry the server sees."""
    if knowledge.task != "classification" or not knowledge.head[0]:
        return False
    vis = view.visible[knowledge.head[0]]
    return bool(vis.reshape(vis.shape[0], -1).any(dim=1).all())


def label_source(strategy: str, view: ServerView, knowledge: Knowledge) -> tuple[str | None, str | None]:
    """(source, None) with source in known/idlg/optimize, or (None, why the strategy cannot get labels)."""
    if strategy in ("auto", "known") and knowledge.labels is not None:
        return "known", None
    if strategy == "known":
        return None, "label_strategy 'known' needs a scenario that grants the attacker the labels"
    if strategy in ("auto", "idlg") and head_rows_visible(view, knowledge):
        return "idlg", None
    if strategy == "idlg":
        return None, "the iDLG label rule needs a visible entry in every row of the classifier head"
    return "optimize", None


def read_labels(source: str, view: ServerView, knowledge: Knowledge) -> list[int] | None:
    """The labels a source gives before optimization; None when they are to be optimized."""
    if source == "known":
        return list(knowledge.labels)
    if source == "idlg":
        return idlg_labels(knowledge.gradient(view, knowledge.head[0]), knowledge.batch_size)[1]
    return None


# --------------------------------------------------------------------------------- blocking

def image_applicable(knowledge: Knowledge) -> str | None:
    """Why no gradient-inversion attack can run in this scenario (task, inputs), or None."""
    if knowledge.task != "classification":
        return f"needs a classification task, this scenario is {knowledge.task}"
    if len(knowledge.input_shape) != 3:
        return f"image reconstruction needs image inputs, got input shape {knowledge.input_shape}"
    return None


def image_blocked(view: ServerView, knowledge: Knowledge) -> str | None:
    """Why no gradient-inversion attack can run on this view, or None."""
    if view.visible_fraction() == 0.0:
        return "the server view is empty: every entry is encrypted or kept local"
    if not knowledge.knows_global_model():
        return "the server does not know the current global weights (clients decrypt them)"
    model = knowledge.build_model()
    if not any(view.visible[n].any() for n, p in model.named_parameters() if p.requires_grad and n in view.visible):
        return "no trainable parameter has a visible entry (only buffers are seen)"
    return None


# ---------------------------------------------------------------------------------- target

class GradientTarget:
    """The server's copy of the model and the client's gradient on the visible entries; with `unroll`, a
    FedAvg update is matched by replaying the client's local steps (`steps` > 1)."""

    def __init__(self, view: ServerView, knowledge: Knowledge, unroll: bool = False) -> None:
        self.model = knowledge.build_model()
        self.device = torch_device.device(self.model)
        state = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        with torch.no_grad():
            for name, value in knowledge.global_params.items():
                state[name].copy_(value)
        self.model.to(self.device).train()   # the client's step ran in training mode (batch statistics in BN)
        named = [(n, p) for n, p in self.model.named_parameters()
                 if p.requires_grad and n in view.visible and view.visible[n].any()]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.masks = [view.visible[n].to(self.device) for n in self.names]
        self.targets = [torch.where(m, knowledge.gradient(view, n).to(self.device), torch.zeros((), device=self.device))
                        for n, m in zip(self.names, self.masks)]
        self.target_norm = torch.sqrt(sum(t.pow(2).sum() for t in self.targets))
        self.steps = knowledge.local_steps if unroll and knowledge.update_kind == "delta" else 1
        self.lr, self.step_batch = knowledge.lr, knowledge.local_batch_size or knowledge.batch_size

    def gradients(self, x: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Gradients of the mean cross-entropy at the dummy batch (labels: indices or probabilities); over
        several local steps, the replayed update as a gradient, (w_0 - w_K) / (lr K), the scale of the target."""
        if self.steps == 1:
            loss = F.cross_entropy(self.model(x), labels)
            return list(torch.autograd.grad(loss, self.params, create_graph=True))
        start = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        weights = dict(start)
        buffers = {n: b.clone() for n, b in self.model.named_buffers()}
        chunks = -(-x.shape[0] // self.step_batch)
        for step in range(self.steps):
            part = slice((step % chunks) * self.step_batch, (step % chunks + 1) * self.step_batch)
            out = torch.func.functional_call(self.model, {**weights, **buffers}, (x[part],))
            grads = torch.autograd.grad(F.cross_entropy(out, labels[part]), list(weights.values()),
                                        create_graph=True, allow_unused=True)
            weights = {n: w if g is None else w - self.lr * g for (n, w), g in zip(weights.items(), grads)}
        return [(start[n] - weights[n]) / (self.lr * self.steps) for n in self.names]

    def distance(self, grads: list[torch.Tensor], objective: str) -> torch.Tensor:
        """Squared distance or cosine distance over the visible entries only."""
        if objective == "l2":
            return sum(((g - t) * m).pow(2).sum() for g, t, m in zip(grads, self.targets, self.masks))
        dot = sum((g * t).sum() for g, t in zip(grads, self.targets))    # t is zero where hidden
        norm = torch.sqrt(sum((g * m).pow(2).sum() for g, m in zip(grads, self.masks)))
        return 1.0 - dot / (norm * self.target_norm).clamp_min(1e-12)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of horizontally plus vertically neighbouring pixels."""
    return (x[..., :, 1:] - x[..., :, :-1]).abs().mean() + (x[..., 1:, :] - x[..., :-1, :]).abs().mean()


# ---------------------------------------------------------------------------- optimization

@dataclass(frozen=True)
class Recipe:
    """How one attack optimizes; each attack states its own defaults and their source."""

    objective: str = "l2"
    optimizer: str = "lbfgs"
    steps: int = 300
    lr: float = 1.0
    signed: bool = False
    boxed: bool = False
    tv: float = 0.0
    restarts: int = 1
    tol: float = 0.0
    unroll: bool = False      # match a FedAvg update by replaying the client's local steps

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES or self.optimizer not in OPTIMIZERS:
            raise ValueError(f"objective must be one of {OBJECTIVES}, optimizer one of {OPTIMIZERS}")
        if self.steps < 1 or self.restarts < 1:
            raise ValueError(f"steps and restarts must be >= 1, got steps={self.steps}, restarts={self.restarts}")
        if not self.lr > 0 or self.tv < 0 or self.tol < 0:
            raise ValueError("lr must be > 0, tv and tol >= 0")


@dataclass
class Inversion:
    images: torch.Tensor          # (B, C, H, W) in [0, 1]
    labels: list[int]             # given, or argmax of the optimized soft labels
    distance: float               # gradient distance of the chosen trial (objective without TV)
    steps: int                    # optimizer steps the chosen trial took


def invert(target: GradientTarget, recipe: Recipe, shape: tuple[int, ...], batch_size: int, num_classes: int,
           labels: list[int] | None, seed: int) -> Inversion:
    """Run the recipe's trials and keep the one whose gradients match best."""
    best: Inversion | None = None
    for trial in range(recipe.restarts):
        x, logits, steps = _trial(target, recipe, shape, batch_size, num_classes, labels, seed * 7919 + trial)
        y = torch.tensor(labels, device=target.device) if labels is not None else logits.softmax(dim=1)
        dist = float(target.distance(target.gradients(x, y), recipe.objective).detach())
        if not np.isfinite(dist):
            dist = float("inf")
        if best is None or dist < best.distance:
            found = labels if labels is not None else [int(c) for c in logits.argmax(dim=1)]
            best = Inversion(x.detach().clamp(0, 1).cpu(), found, dist, steps)
    return best


def _trial(target: GradientTarget, recipe: Recipe, shape, batch_size: int, num_classes: int,
           labels: list[int] | None, seed: int):
    gen = torch.Generator().manual_seed(seed)   # CPU draws on every device, then moved
    x = torch.randn((batch_size, *shape), generator=gen).to(target.device).requires_grad_(True)
    logits = torch.randn((batch_size, num_classes), generator=gen).to(target.device).requires_grad_(labels is None)
    fixed = torch.tensor(labels, device=target.device) if labels is not None else None
    variables = [x] + ([logits] if labels is None else [])
    if recipe.optimizer == "lbfgs":
        opt = torch.optim.LBFGS(variables, lr=recipe.lr, line_search_fn="strong_wolfe")
        sched = None
    else:
        opt = torch.optim.Adam(variables, lr=recipe.lr)
        marks = sorted({max(1, int(recipe.steps * f)) for f in (3 / 8, 5 / 8, 7 / 8)})
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=marks, gamma=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        y = fixed if fixed is not None else logits.softmax(dim=1)
        loss = target.distance(target.gradients(x, y), recipe.objective)
        if recipe.tv:
            loss = loss + recipe.tv * total_variation(x)
        loss.backward()
        if recipe.signed:
            for v in variables:
                v.grad.sign_()
        return loss

    best_x, best_logits, best_loss, steps = x.detach().clone(), logits.detach().clone(), float("inf"), 0
    for steps in range(1, recipe.steps + 1):
        before_x, before_logits = x.detach().clone(), logits.detach().clone()
        loss = float(opt.step(closure).detach())   # both optimizers return the loss at the point they left
        if sched is not None:
            sched.step()
        if recipe.boxed:
            with torch.no_grad():
                x.clamp_(0.0, 1.0)
        if not np.isfinite(loss):
            break
        if loss < best_loss:
            best_x, best_logits, best_loss = before_x, before_logits, loss
        if best_loss <= recipe.tol:
            break
    return best_x, best_logits, steps


# ---------------------------------------------------------------------------------- attack

class GradientInversion(Attack):
    """Base of the image attacks: labels by strategy, then `invert` with the attack's recipe.

    Subclasses set `strategies` (the label strategies they accept) and pass their Recipe."""

    family = "image"
    strategies: tuple[str, ...] = LABEL_STRATEGIES

    def __init__(self, recipe: Recipe, label_strategy: str, **params) -> None:
        if label_strategy not in self.strategies:
            raise ValueError(f"label_strategy '{label_strategy}' must be one of {', '.join(self.strategies)}")
        super().__init__(label_strategy=label_strategy, **params)
        self.recipe, self.label_strategy = recipe, label_strategy

    def labels_from(self, view: ServerView, knowledge: Knowledge) -> tuple[str | None, str | None]:
        """The label source this attack uses on this view, or None and why it has none."""
        source, reason = label_source(self.label_strategy, view, knowledge)
        if source == "optimize" and "optimize" not in self.strategies:
            return None, ("the labels are neither granted nor readable from the classifier head (hidden); "
                          "dlg and inverting-gradients optimize them")
        return source, reason

    def applicable(self, setting: Setting) -> str | None:
        if self.label_strategy == "known" and not setting.labels_known:
            return "label_strategy 'known' needs a scenario that grants the attacker the labels (labels_known)"
        return image_applicable(setting.knowledge)

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        return image_blocked(view, knowledge) or self.labels_from(view, knowledge)[1]

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        source, _ = self.labels_from(view, knowledge)
        labels = read_labels(source, view, knowledge)
        target = GradientTarget(view, knowledge, self.recipe.unroll)
        result = invert(target, self.recipe, tuple(knowledge.input_shape),
                        knowledge.batch_size, knowledge.num_classes, labels, seed)
        if source == "idlg":   # the rule recovers which classes exist, one each
            counts = idlg_labels(knowledge.gradient(view, knowledge.head[0]), knowledge.batch_size)[0]
        else:
            counts = np.bincount(result.labels, minlength=knowledge.num_classes)
        return Reconstruction(label_counts=counts, labels=result.labels, images=result.images,
                              extra={"grad_loss": result.distance, "steps": result.steps, "label_source": source,
                                     "matched_parameters": len(target.names), "replayed_steps": target.steps})


__all__ = ["GradientInversion", "GradientTarget", "Inversion", "Recipe", "idlg_labels", "image_applicable", "image_blocked", "invert", "label_source",
           "read_labels", "total_variation", "LABEL_STRATEGIES"]
