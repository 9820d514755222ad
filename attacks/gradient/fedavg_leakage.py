"""Data leakage in federated averaging (Dimitrov, Balunovic, Konstantinov, Vechev, TMLR 2022).

A FedAvg upload is several local epochs of SGD on mini-batches the client reshuffles every epoch, so
it is not one gradient of one batch. The attack simulates that training on dummy data and matches the
update it produces, as the official code (eth-sri/fedavg_leakage, `--fedavg full_many`) does:

- One set of dummies per epoch (E x N images for a client of N images): each epoch's mini-batches
  (the protocol's local batch size, in order) then draw any order the client's shuffle chose, since the
  dummies are free variables. The simulated update is the sum of the step gradients, (w_0 - w_K) / lr,
  compared with the upload on the entries the server sees (hidden entries masked out).
- Objective (`--att_metric l2 --att_exp_layers`): squared distance per layer, layer l weighted by e^-l
  (the first layer weighs most), divided by the mini-batches of all epochs and scaled by a factor decaying
  geometrically from 4 to 2 over the first half of the run; plus total variation (squared neighbour
  differences, periodic, summed per image, as theirs), a box prior (squared distance outside [0, 1]) and
  the epoch order-invariant prior `l2_max_conv`: each epoch's dummies through one random 3x3
  convolution of 96 channels, the maximum over the epoch's images (a summary that does not depend on
  their order), squared differences of the summaries of every pair of epochs.
- Adam, lr 0.1 decaying x0.997 every 20 steps, 400 steps (`--att_epochs 200`, run for twice that),
  dummies from N(0, 1) (`optimizer = "lbfgs"`: L-BFGS with a strong-Wolfe line search on the same
  objective); the result matches every epoch's images to epoch 0's by PSNR (Hungarian assignment) and
  averages them.
- Distance (`metric`, the official `--att_metric`): "l2" above; "cos_sim" one minus the cosine per
  layer, layer-weighted; "cos_sim_global" one minus the layer-weighted dot product over the product of
  the two whole updates' (unweighted) norms. The cosines do not depend on the update's scale, so an
  upload rescaled by clipping is still read. Simulation and distances equal the official functions'
  on the same inputs (tests/test_fedavg_leakage.py, fixture written by their code).
- Labels (`label_strategy`, "auto" tries them in this order): granted ones where the scenario grants
  them (the official default uses the true labels); for a client of one image the iDLG rule (below),
  exact there when the head's inputs are non-negative, and blind to the update's scale where the
  counts are not (a clipped upload shrinks dW); "counts" from the upload by the rule of Geng et al.
  (the official `aaai_avg`), which needs the head's whole weight update: count_c = N (p_c - dW_c / O),
  with dW_c the head's weight-gradient row sum averaged over the steps, p_c the mean softmax and O the
  mean summed head input over `label_samples` random inputs, both interpolated linearly between the
  global model and the client's trained one over the steps and averaged; rounded to N by largest
  remainders. Where only part of the head is seen, "idlg" reads the labels from the visible entries
  of every head row; where a whole row is hidden, "optimize" learns soft labels jointly with the
  images, as DLG (one set for the client, shared by the epochs). Each epoch's dummies take the labels
  in the same order.

Deviations, stated: inputs here are pixels in [0, 1] (theirs are normalized by the dataset's mean and
std), so the priors act on the pixel scale and the random inputs of the label rule are uniform in the
box; a client of one image takes the iDLG rule's label, not the counts; with several restarts the
kept one is the best by the gradient distance (theirs picks by PSNR
against the true images, an oracle; their scripts run one restart).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from attacks.gradient.inversion import GradientInversion, GradientTarget, Recipe, label_source, read_labels
from bench.protocol.attack import Reconstruction
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS


def label_counts(target: GradientTarget, knowledge: Knowledge, update: dict[str, torch.Tensor], samples: int,
                 gen: torch.Generator) -> np.ndarray:
    """Geng et al.'s label counts for a client of N images: N (p - dW / O) averaged over the local steps
    (`update`: the client's trained weights minus the global ones, on the visible entries)."""
    head_w = knowledge.head[0]
    total = knowledge.local_steps
    dw = target.targets[target.names.index(head_w)].reshape(knowledge.num_classes, -1).sum(dim=1)
    x = torch.rand((samples, *knowledge.input_shape), generator=gen).to(target.device)
    stats = []
    for weights in (None, update):
        model = knowledge.build_model().to(target.device).eval()
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        features: list[torch.Tensor] = []
        head = dict(model.named_modules())[head_w.rsplit(".", 1)[0]]
        hook = head.register_forward_hook(lambda _m, inputs, _o: features.append(inputs[0].detach()))
        with torch.no_grad():
            for name, value in knowledge.global_params.items():
                state[name].copy_(value + (weights[name] if weights is not None and name in weights else 0))
            probs = model(x).softmax(dim=1).mean(dim=0)
        hook.remove()
        stats.append((probs, features[0].reshape(samples, -1).sum(dim=1).mean()))
    coefs = torch.arange(total, dtype=torch.float32, device=target.device) / total
    raw = torch.stack([knowledge.batch_size * ((1 - c) * stats[0][0] + c * stats[1][0]
                                               - dw / ((1 - c) * stats[0][1] + c * stats[1][1])) for c in coefs])
    return largest_remainder(raw.mean(dim=0).cpu().numpy(), knowledge.batch_size)


def largest_remainder(raw: np.ndarray, n: int) -> np.ndarray:
    """Non-negative integer counts summing to n, nearest to `raw` by largest remainders (the official rounding);
    a non-finite estimate (a noised update can give one) counts as zero."""
    raw = np.nan_to_num(np.asarray(raw, dtype=np.float64), nan=0.0, posinf=float(n), neginf=0.0).clip(0.0, n)
    counts = np.floor(raw).astype(np.int64)
    rest = raw - counts
    while counts.sum() < n:
        c = int(np.argmax(rest))
        counts[c] += 1
        rest[c] -= 1.0
    while counts.sum() > n:
        c = int(np.argmin(np.where(counts > 0, rest, np.inf)))
        counts[c] -= 1
        rest[c] += 1.0
    return counts


class Simulation:
    """The client's local training replayed on E sets of dummies, and the official objective."""

    def __init__(self, target: GradientTarget, knowledge: Knowledge, gen: torch.Generator, metric: str = "l2") -> None:
        self.t, self.n, self.metric = target, knowledge.batch_size, metric
        self.batch = knowledge.local_batch_size or knowledge.batch_size
        per_epoch = -(-self.n // self.batch)
        self.epochs = max(1, knowledge.local_steps // per_epoch) if knowledge.update_kind == "delta" else 1
        self.per_epoch = per_epoch if knowledge.update_kind == "delta" else 1
        self.scale = float(knowledge.local_steps if knowledge.update_kind == "delta" else 1)
        # the official divisor: mini-batches over all epochs' dummies, ceil(E N / b) (theirs in every mode)
        self.batches = -(-(self.epochs * self.n) // self.batch) if knowledge.update_kind == "delta" else 1
        layers = list(dict.fromkeys(name.rsplit(".", 1)[0] for name in target.names))
        self.layer_weights = [float(np.exp(-layers.index(name.rsplit(".", 1)[0]))) for name in target.names]
        channels = knowledge.input_shape[0]
        self.conv = torch.randn((96, channels, 3, 3), generator=gen).to(target.device) / np.sqrt(9 * channels)

    def update(self, x: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Sum of the step gradients, (w_0 - w_K) / lr, of local SGD over the epochs' dummies."""
        t = self.t
        if self.epochs == 1 and self.per_epoch == 1:
            loss = F.cross_entropy(t.model(x), labels)
            return list(torch.autograd.grad(loss, t.params, create_graph=True))
        start = {n: p for n, p in t.model.named_parameters() if p.requires_grad}
        weights = dict(start)
        buffers = {n: b.clone() for n, b in t.model.named_buffers()}
        for epoch in range(self.epochs):
            for i in range(self.per_epoch):
                part = slice(epoch * self.n + i * self.batch, epoch * self.n + min((i + 1) * self.batch, self.n))
                out = torch.func.functional_call(t.model, {**weights, **buffers}, (x[part],))
                grads = torch.autograd.grad(F.cross_entropy(out, labels[part]), list(weights.values()),
                                            create_graph=True, allow_unused=True)
                weights = {n: w if g is None else w - t.lr * g for (n, w), g in zip(weights.items(), grads)}
        return [(start[n] - weights[n]) / t.lr for n in t.names]

    def distance(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Layer-weighted distance (the `metric`) to the upload on the visible entries, per mini-batch."""
        t = self.t
        pairs = [(g * m, tg * self.scale, w) for g, tg, m, w in zip(grads, t.targets, t.masks, self.layer_weights)]
        if self.metric == "l2":
            total = sum(w * (g - tg).pow(2).sum() for g, tg, w in pairs)
        elif self.metric == "cos_sim":
            total = sum(w * cosine_distance([g], [tg]) for g, tg, w in pairs)
        else:       # theirs: the layer weights on the dot product only, the norms unweighted
            dot = sum(w * (g * tg).sum() for g, tg, w in pairs)
            norm_g = torch.sqrt(sum(g.pow(2).sum() for g, _, _ in pairs) + 1e-7)
            norm_t = torch.sqrt(sum(tg.pow(2).sum() for _, tg, _ in pairs) + 1e-7)
            total = 1 - dot / (norm_g * norm_t)
        return total / self.batches

    def order_prior(self, x: torch.Tensor) -> torch.Tensor:
        """l2_max_conv: the epochs' max-pooled random-convolution summaries should agree."""
        if self.epochs == 1:
            return torch.zeros((), device=x.device)
        feats = F.conv2d(x, self.conv, padding=1)
        summary = feats.reshape(self.epochs, self.n, *feats.shape[1:]).amax(dim=1)
        return (summary[:, None] - summary[None, :]).pow(2).mean()


def cosine_distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    """The official `cos_sim`: one minus the cosine of two lists of tensors taken as one vector each."""
    dot = sum((x * y).sum() for x, y in zip(a, b))
    norm_a = torch.sqrt(sum(x.pow(2).sum() for x in a) + 1e-7)
    norm_b = torch.sqrt(sum(y.pow(2).sum() for y in b) + 1e-7)
    return 1 - dot / (norm_a * norm_b)


def total_variation_sq(x: torch.Tensor) -> torch.Tensor:
    """The official TV: squared periodic neighbour differences, summed per image, mean over images."""
    dx = x - torch.roll(x, -1, dims=-1)
    dy = x - torch.roll(x, -1, dims=-2)
    return (dx.pow(2) + dy.pow(2) + 1e-7).sum(dim=(1, 2, 3)).mean()


def box_prior(x: torch.Tensor) -> torch.Tensor:
    """Squared distance outside the data box [0, 1], mean over images, summed over pixels."""
    return (x - x.clamp(0.0, 1.0)).pow(2).mean(dim=0).sum()


def psnr_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PSNR (data range 1) of every image of `a` against every image of `b`."""
    mse = ((a[:, None] - b[None, :]) ** 2).reshape(len(a), len(b), -1).mean(axis=2)
    return 10 * np.log10(1.0 / np.maximum(mse, 1e-12))


def merge_epochs(x: np.ndarray, epochs: int) -> np.ndarray:
    """Every epoch's images matched to epoch 0's by PSNR (Hungarian), then averaged."""
    sets = x.reshape(epochs, -1, *x.shape[1:])
    aligned = [sets[0]]
    for other in sets[1:]:
        rows, cols = linear_sum_assignment(-psnr_matrix(sets[0], other))
        aligned.append(other[cols[np.argsort(rows)]])
    return np.mean(aligned, axis=0)


@ATTACKS.register("fedavg-leakage", "FedAvg leakage: local epochs simulated on per-epoch dummies, order-invariant "
                                    "prior, label counts from the update")
class FedAvgLeakage(GradientInversion):
    links = {"paper": "https://openreview.net/forum?id=e7A0B99zJf", "code": "https://github.com/eth-sri/fedavg_leakage"}
    strategies = ("auto", "known", "counts", "idlg", "optimize")
    metrics = ("l2", "cos_sim", "cos_sim_global")

    def __init__(self, steps: int = 400, restarts: int = 1, lr: float = 0.1, tv: float = 2e-4, box: float = 10.0,
                 order: float = 6.075, factor_start: float = 4.0, factor_end: float = 2.0, label_samples: int = 3000,
                 optimizer: str = "adam", label_strategy: str = "auto", metric: str = "l2") -> None:
        if metric not in self.metrics:
            raise ValueError(f"metric '{metric}' must be one of {', '.join(self.metrics)}")
        if steps < 2 or label_samples < 1:
            raise ValueError(f"steps must be >= 2 and label_samples >= 1; got {steps}, {label_samples}")
        if not lr > 0 or min(tv, box, order) < 0 or not factor_start > 0 or not factor_end > 0:
            raise ValueError("lr, factor_start and factor_end must be > 0; tv, box and order >= 0")
        super().__init__(Recipe(objective="l2", optimizer=optimizer, steps=steps, lr=lr, restarts=restarts, tv=tv),
                         label_strategy, steps=steps, restarts=restarts, lr=lr, tv=tv, box=box, order=order,
                         factor_start=factor_start, factor_end=factor_end, label_samples=label_samples,
                         optimizer=optimizer, metric=metric)
        self.metric = metric
        self.steps, self.restarts, self.lr, self.optimizer = steps, restarts, lr, optimizer
        self.tv, self.box, self.order, self.label_samples = tv, box, order, label_samples
        self.factor_start, self.factor_end = factor_start, factor_end

    def labels_from(self, view: ServerView, knowledge: Knowledge) -> tuple[str | None, str | None]:
        """The counts where the whole head is seen and the batch holds several images; else the inversions' rule."""
        head = knowledge.head[0]
        whole_head = bool(head and head in view.visible and view.visible[head].all())
        if self.label_strategy == "counts":
            return ("counts", None) if whole_head else \
                (None, "the label counts need every entry of the classifier head's weight update (hidden here)")
        if self.label_strategy == "auto" and knowledge.labels is None and knowledge.batch_size > 1 and whole_head:
            return "counts", None
        return label_source(self.label_strategy, view, knowledge)   # one image: iDLG, exact and blind to clipping

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        source, _ = self.labels_from(view, knowledge)
        target = GradientTarget(view, knowledge)
        gen = torch.Generator().manual_seed(seed)
        labels = None
        if source == "counts":
            update = {n: -t.cpu() * knowledge.lr * knowledge.local_steps for n, t in zip(target.names, target.targets)}
            counts = label_counts(target, knowledge, update, self.label_samples, gen)
            labels = np.repeat(np.arange(knowledge.num_classes), counts)
            labels = labels[torch.randperm(len(labels), generator=gen).numpy()]
        elif source != "optimize":
            labels = np.asarray(read_labels(source, view, knowledge))
        sim = Simulation(target, knowledge, gen, self.metric)
        best = None
        for trial in range(self.restarts):
            x, found, dist, steps = self._trial(sim, labels, knowledge,
                                                torch.Generator().manual_seed(seed * 7919 + trial))
            if best is None or dist < best[2]:
                best = (x, found, dist, steps)
        x, labels, dist, steps = best
        counts = np.bincount(labels, minlength=knowledge.num_classes)
        images = merge_epochs(x.clamp(0, 1).cpu().numpy(), sim.epochs)
        return Reconstruction(label_counts=counts, labels=[int(c) for c in labels], images=torch.from_numpy(images),
                              extra={"grad_loss": dist, "steps": steps, "label_source": source,
                                     "matched_parameters": len(target.names), "replayed_steps": knowledge.local_steps,
                                     "epochs_simulated": sim.epochs})

    def _trial(self, sim: Simulation, labels: np.ndarray | None, knowledge: Knowledge, gen: torch.Generator):
        """One run of the optimizer from N(0, 1) dummies (and N(0, 1) label logits where `labels` is None): the last
        iterate, its labels, its update distance and the steps taken."""
        n = knowledge.batch_size
        x = torch.randn((n * sim.epochs, *knowledge.input_shape), generator=gen).to(sim.t.device).requires_grad_(True)
        logits = torch.randn((n, knowledge.num_classes), generator=gen).to(sim.t.device).requires_grad_(labels is None)
        fixed = None if labels is None else torch.tensor(np.tile(labels, sim.epochs), device=sim.t.device)

        def targets() -> torch.Tensor:
            return fixed if fixed is not None else logits.softmax(dim=1).repeat(sim.epochs, 1)

        variables = [x] + ([logits] if labels is None else [])
        half = self.steps // 2
        alpha = np.exp(np.log(self.factor_end / self.factor_start) / half)
        factor, steps = self.factor_start, 0

        def objective() -> torch.Tensor:
            return factor * sim.distance(sim.update(x, targets())) + self.tv * total_variation_sq(x) \
                + self.box * box_prior(x) + self.order * sim.order_prior(x)

        if self.optimizer == "lbfgs":
            opt = torch.optim.LBFGS(variables, lr=self.lr, line_search_fn="strong_wolfe")
            sched = None
        else:
            opt = torch.optim.Adam(variables, lr=self.lr)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.997 ** (i / 20))

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = objective()
            loss.backward()
            return loss

        for steps in range(1, self.steps + 1):
            factor = min(factor * alpha, self.factor_end) if alpha >= 1 else max(factor * alpha, self.factor_end)
            before = [v.detach().clone() for v in variables]
            loss = opt.step(closure)
            if not torch.isfinite(loss) or not all(torch.isfinite(v).all() for v in variables):
                with torch.no_grad():
                    for v, b in zip(variables, before):
                        v.copy_(b)
                break
            if sched is not None:
                sched.step()
        dist = float(sim.distance(sim.update(x, targets())).detach())
        found = labels if labels is not None else logits.detach().argmax(dim=1).cpu().numpy()
        return x.detach(), found, dist if np.isfinite(dist) else float("inf"), steps
