"""SPEAR (Dimitrov, Baader, Mueller, Vechev, NeurIPS 2024): the exact inputs of a whole batch from the gradient of
a linear layer followed by ReLU; the algebra is in attacks/gradient/spear_solve.py (factors, sampling, filter)
and attacks/gradient/spear_select.py (scales, greedy selection).

What it attacks: the first linear layer followed by ReLU whose weight gradient the server sees. On an MLP (the
seeds' `mlp` and `fcn`) that layer reads the flattened image, so SPEAR returns images; on a CNN it is the first
fully connected layer, whose input is the flattened convolutional features: SPEAR then recovers those feature
vectors exactly, not pixels, and says so (`extra["recovered"]`); no image metric is computed for them.

What it reads from the view, all of it: the layer's weight gradient on every visible entry (rows and columns with at
least B visible entries are completed to rank B by alternating least squares, the rest are left out: a row so
dropped is one constraint less, a column so dropped is a pixel it cannot return), the layer's bias gradient
(the scales; where it is hidden, each input's scale is the midpoint of what the ReLU pattern allows), the global
weights (the selection's sparsity matching and the estimate), and every other visible gradient (the estimate).

Sampling. The paper's sampling draws B - 1 rows uniformly (`samples` per round): enough up to B ~ 16 on a 256-wide
layer; the hit rate falls as 2^-B. For larger batches the paper samples among the rows an approximate
reconstruction (Geiping et al.'s) switches off. Here that estimate is Inverting Gradients' cosine matching on the
visible gradients with the inputs restricted to the row space of the layer's gradient, X = P R (exact for the true
batch by the theorem above), soft labels learnt with it, `prior_steps` Adam steps per round (twice that in the
first), warm-started; estimated samples whose predicted off-rows already match a found direction are left out of
the next round's sampling. Rounds stop once the selection's sparsity matching is exact. `prior_steps = 0` is the
paper's uniform sampling alone.

Filter. A proposal must leave B - 1 + `extra_zeros` rows at zero, more than uniform proposals reach by chance
(measured on 2,000 of them first, spear_solve.chance_zeros), and at least `min_sparsity` of the rows (the paper's
threshold tau* m). On a narrow layer (SenseCrypt's FCN: 64 neurons) uniform draws often hit a sample or a mix of
two, the chance measure counts them and its threshold passes the samples' own zero counts: `chance = False` keeps
the paper's threshold alone there. Two samples whose off-neurons overlap leave every mix of them nearly as sparse:
such mixes pass and are told apart by the selection's sparsity matching; the plane of a mix and a sample holds the
other sample (spear_solve.plane_directions), which is searched each round and, where the selection is still not
exact, once more at one shared row (spear_select.repair). Both are this implementation's additions to the paper's steps.

Completion (`complete`, on by default): where a round's selection is not exact and at most two of its columns are
in doubt, the missing samples' inputs lie on a known line or plane of the input space, and the cell of the ReLU
arrangement holding each gives its zero rows exactly (attacks/gradient/spear_complete.py); this implementation's
addition to the paper's steps. The search that proposes directions is `proposer`: SPEAR's sampling here (`Sampler`),
SPEAR++'s dictionary learning in attacks/gradient/spear_dictionary.py, everything after it shared.

Labels, from the view: the granted ones where a scenario grants them; otherwise, once the inputs are known, each
sample's label is the class whose single-sample gradient at the layer's output equals the recovered column
of dL/dZ (exact when the disaggregation is). The estimate optimizes soft labels jointly (as DLG does).

Blocked only when the view prevents it: every entry hidden, the global weights unknown, or no visible entry in any
linear layer followed by ReLU. A scenario whose model has no such layer (the sigmoid LeNet) is not applicable.
A FedAvg update of K local steps is read as one gradient (the paper's setting is FedSGD): its weight delta sums the
steps' gradients, of rank B where every step reads the same batch (B no larger than the local batch) and more where
steps read different images, and the ReLU pattern may move between steps; `extra["exact"]` says whether the
disaggregation was exact.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from attacks.gradient import spear_complete as sc
from attacks.gradient import spear_select as sp
from attacks.gradient import spear_solve as ss
from attacks.gradient.inversion import GradientTarget, head_rows_visible, idlg_labels
from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS


# ------------------------------------------------------------------------------------ the attacked layer

def relu_linears(model: torch.nn.Module) -> list[str]:
    """Module names of the linear layers a ReLU follows directly (in a Sequential), in forward order."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential):
            kids = list(module.named_children())
            for (a, first), (_, second) in zip(kids, kids[1:]):
                if isinstance(first, torch.nn.Linear) and isinstance(second, torch.nn.ReLU):
                    out.append(f"{name}.{a}" if name else a)
    return out


def layer_input(model: torch.nn.Module, layer: str, x: torch.Tensor) -> torch.Tensor:
    """What `layer` receives when the model reads x."""
    seen = {}
    handle = model.get_submodule(layer).register_forward_pre_hook(lambda m, a: seen.setdefault("u", a[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return seen["u"]


def wide_relu_linears(model: torch.nn.Module, batch: int) -> list[str]:
    """The linear layers a ReLU follows with more units than the batch: SPEAR's rank-B factorization separates
    B samples only through more than B rows (at m <= B every subset of B - 1 rows has a kernel, none is sparse)."""
    return [n for n in relu_linears(model) if model.get_submodule(n).out_features > batch]


def attacked_layer(view: ServerView, knowledge: Knowledge) -> tuple[str | None, str]:
    """The first linear layer followed by ReLU, wider than the batch, with more than B rows of its weight
    gradient visible on at least B entries each; or None and why not."""
    batch = knowledge.batch_size
    layers = wide_relu_linears(knowledge.build_model(), batch)
    if not layers:
        return None, f"no linear layer followed by ReLU is wider than the batch (B = {batch})"
    for layer in layers:
        seen = view.visible[f"{layer}.weight"]
        if int((seen.sum(1) >= batch).sum()) > batch:
            return layer, ""
    return None, (f"every linear layer followed by ReLU and wider than the batch ({', '.join(layers)}) shows at "
                  f"most B = {batch} rows of its weight gradient with B visible entries")


# ------------------------------------------------------------------------------------------ the view

def complete(grad: torch.Tensor, seen: torch.Tensor, rank: int, iters: int = 300) -> tuple:
    """The weight gradient on its determinable rows and columns (>= rank visible entries each), hidden entries
    filled in by rank-`rank` alternating least squares. Returns (G, rows kept, columns kept, relative residual
    on the visible entries)."""
    rows = torch.nonzero(seen.sum(1) >= rank).flatten()
    cols = torch.nonzero(seen.sum(0) >= rank).flatten()
    g, v = grad.double()[rows][:, cols], seen[rows][:, cols]
    if bool(v.all()):
        return g, rows, cols, 0.0
    g0 = torch.where(v, g, torch.zeros((), dtype=g.dtype))
    u, s, vh = torch.linalg.svd(g0 / v.double().mean(), full_matrices=False)
    left, right = u[:, :rank] * s[:rank], vh[:rank].T        # g ~ left @ right.T
    scale = float(g0.norm()) or 1.0
    vd = v.double()
    for _ in range(iters):
        right = _ls(left, g0, vd)              # each column of g from the visible rows
        left = _ls(right, g0.T, vd.T)
        resid = float(((left @ right.T - g0) * vd).norm()) / scale
        if resid < 1e-9:
            break
    return torch.where(v, g, left @ right.T), rows, cols, resid


def _ls(basis: torch.Tensor, data: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per column k of data: argmin_c |mask_k * (basis c - data_k)|, batched."""
    gram = torch.einsum("jk,ja,jb->kab", mask, basis, basis) + 1e-12 * torch.eye(basis.shape[1], dtype=basis.dtype)
    rhs = torch.einsum("jk,ja,jk->ka", mask, basis, data)
    return torch.linalg.solve(gram, rhs)


# ---------------------------------------------------------------------------------------- the estimate

class Estimate:
    """Inverting Gradients' cosine matching with the layer's inputs confined to P R (P: B x B), on every visible
    gradient of the layer and those after it, the layer's input substituted through a forward pre-hook."""

    def __init__(self, view, knowledge, layer: str, f: ss.Factors, cols: torch.Tensor, width: int) -> None:
        self.target = GradientTarget(view, knowledge)
        names = [n for n, _ in self.target.model.named_parameters()]
        start = names.index(f"{layer}.weight")
        keep = [i for i, n in enumerate(self.target.names) if names.index(n) >= start]
        t = self.target
        t.names, t.params, t.masks, t.targets = ([getattr(t, a)[i] for i in keep]
                                                 for a in ("names", "params", "masks", "targets"))
        t.target_norm = torch.sqrt(sum(x.pow(2).sum() for x in t.targets))
        self.R, self.cols, self.width = f.R.float().to(t.device), cols.to(t.device), width
        self.layer, self.batch = t.model.get_submodule(layer), f.L.shape[1]
        self.shape = (self.batch, *knowledge.input_shape)
        self.labels = None if knowledge.labels is None else torch.tensor(knowledge.labels, device=t.device)
        self.logits = torch.zeros(self.batch, knowledge.num_classes)

    def run(self, p: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
        """`steps` Adam steps from P (and the soft labels where the labels are not granted, kept across calls);
        the new P."""
        t, dev = self.target, self.target.device
        p = p.float().to(dev).requires_grad_(True)
        logits = self.logits.to(dev).requires_grad_(self.labels is None)
        opt = torch.optim.Adam([p] + ([logits] if self.labels is None else []), lr=lr)
        dummy = torch.zeros(self.shape, device=dev)
        for _ in range(steps):
            opt.zero_grad()
            u = torch.zeros(self.batch, self.width, device=dev)
            u[:, self.cols] = p @ self.R
            handle = self.layer.register_forward_pre_hook(lambda m, a: (u,))
            try:
                y = self.labels if self.labels is not None else logits.softmax(dim=1)
                loss = t.distance(t.gradients(dummy, y), "cosine")
            finally:
                handle.remove()
            loss.backward()
            opt.step()
        self.logits = logits.detach().cpu()
        return p.detach().double().cpu()


def cover(p: torch.Tensor, f: ss.Factors, w: torch.Tensor, bias: torch.Tensor, pool: ss.Pool,
          trusted: list[int], agree: float = 0.97) -> dict[int, int]:
    """Trusted direction -> the estimated sample whose predicted off-rows match its zero rows best, where they agree
    on at least `agree` of the rows: that sample is found, and the next round leaves it be."""
    if not trusted:
        return {}
    off = (((p @ f.R) @ w.T + bias)[:, f.rows] <= 0)                          # (B, m')
    zero = (f.unit @ pool.q[trusted].T).abs() < f.tol[:, None]               # (m', T)
    match = (off[:, :, None] == zero[None, :, :]).double().mean(1)           # (B, T)
    out = {}
    for t, i in enumerate(trusted):
        k = int(match[:, t].argmax())
        if float(match[k, t]) >= agree and k not in out.values():
            out[i] = k
    return out


def knows_tail(knowledge: Knowledge, layer: str) -> bool:
    """The server knows the global weights of the layer and of every layer after it (what the estimate runs)."""
    names = [n for n, _ in knowledge.build_model().named_parameters()]
    start = names.index(f"{layer}.weight")
    return all(bool(torch.isfinite(knowledge.global_params[n]).all()) for n in names[start:]
               if n in knowledge.global_params)


# ------------------------------------------------------------------------------------------ labels

def read_labels(knowledge: Knowledge, layer: str, u: torch.Tensor, d: torch.Tensor, rows: torch.Tensor) -> list[int]:
    """Per recovered input u_i, the class whose single-sample dL/dZ at the layer (mean loss over the batch, so
    divided by B) matches the recovered column d_i (on the used rows)."""
    model = knowledge.build_model()
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, value in knowledge.global_params.items():
            state[name].copy_(value)
    model.train()
    batch, classes = u.shape[0], knowledge.num_classes
    sub = model.get_submodule(layer)
    rep = u.float().repeat_interleave(classes, 0)
    out = {}
    hooks = [sub.register_forward_pre_hook(lambda m, a: (rep,)),
             sub.register_forward_hook(lambda m, a, z: out.setdefault("z", z))]
    try:
        logits = model(torch.zeros(batch * classes, *knowledge.input_shape))
        y = torch.arange(classes).repeat(batch)
        dz = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum") / batch, out["z"])[0]
    finally:
        for h in hooks:
            h.remove()
    dz = dz.double()[:, rows].reshape(batch, classes, -1)
    err = (dz - d.T[:, None, :]).norm(dim=2)
    return [int(c) for c in err.argmin(dim=1)]


class Sampler:
    """SPEAR's proposals each round: `samples` uniform subsets of B - 1 rows, and where the estimate runs, its
    steps and the subsets among the rows it predicts off (samples it already covers left out); returns the
    estimate's directions for the selection to fill a short pool with. Never exhausted: the rounds bound it."""

    exhausted = False

    def __init__(self, attack: "SPEAR", f: ss.Factors, w: torch.Tensor, bias: torch.Tensor, est: Estimate | None,
                 gen: torch.Generator) -> None:
        self.attack, self.f, self.w, self.bias, self.est, self.gen = attack, f, w, bias, est, gen
        self.p = torch.randn(f.L.shape[1], f.L.shape[1], generator=gen, dtype=torch.float64) * 0.3

    def propose(self, pool: ss.Pool, round_: int) -> torch.Tensor | None:
        a, f, batch = self.attack, self.f, self.f.L.shape[1]
        if a.samples:
            pool.add(f, ss.uniform_subsets(len(f.rows), batch, a.samples, self.gen))
        if self.est is None:
            return None
        owner = cover(self.p, f, self.w, self.bias, pool, pool.trusted(f) if round_ > 1 else [])
        self.p = self.est.run(self.p, a.prior_steps * (2 if round_ == 1 else 1), a.prior_lr)
        if not torch.isfinite(self.p).all():
            self.p = torch.randn(batch, batch, generator=self.gen, dtype=torch.float64) * 0.3
        pre = ((self.p @ f.R) @ self.w.T + self.bias)[:, f.rows]
        pool.add(f, *ss.guided_subsets(pre, batch, a.per_row, self.gen, skip=set(owner.values())))
        return torch.linalg.pinv(self.p)


# ------------------------------------------------------------------------------------------ the attack

@ATTACKS.register("spear", "SPEAR: exact batch inputs from the low-rank, ReLU-sparse gradient of a linear layer "
                           "(sampling, sparsity filter, greedy selection)")
class SPEAR(Attack):
    links = {"paper": "https://arxiv.org/abs/2403.03945", "code": "https://github.com/eth-sri/SPEAR"}
    family = "image"

    # rounds: up to 30 sampling rounds, stopping once the selection is exact; at B = 32 on the digits MLP's 256
    # units, batches need 13-17 rounds, so 12 left the outcome to the gradient's last bits
    def __init__(self, samples: int = 2000, rounds: int = 30, prior_steps: int = 300, prior_lr: float = 0.05,
                 per_row: int = 64, extra_zeros: int = 4, min_sparsity: float = 0.25, chance: bool = True,
                 complete: bool = True) -> None:
        if samples < 0 or rounds < 1 or prior_steps < 0 or per_row < 0 or extra_zeros < 1 or not prior_lr > 0:
            raise ValueError("spear needs samples, prior_steps, per_row >= 0, rounds, extra_zeros >= 1, prior_lr > 0")
        if not 0 <= min_sparsity < 1:
            raise ValueError(f"spear min_sparsity is a fraction of the layer's rows in [0, 1), got {min_sparsity}")
        if samples == 0 and (prior_steps == 0 or per_row == 0):
            raise ValueError("spear draws no subset: set samples > 0, or prior_steps and per_row > 0")
        super().__init__(samples=samples, rounds=rounds, prior_steps=prior_steps, prior_lr=prior_lr,
                         per_row=per_row, extra_zeros=extra_zeros, min_sparsity=min_sparsity, chance=chance,
                         complete=complete)
        self.samples, self.rounds, self.prior_steps, self.prior_lr = samples, rounds, prior_steps, prior_lr
        self.per_row, self.extra_zeros, self.min_sparsity, self.chance = per_row, extra_zeros, min_sparsity, chance
        self.complete = complete

    def applicable(self, setting: Setting) -> str | None:
        if setting.knowledge.task != "classification":
            return f"needs a classification task, this scenario is {setting.knowledge.task}"
        if not relu_linears(setting.model):
            return (f"needs a linear layer followed by ReLU; model '{setting.knowledge.model_name}' has none "
                    f"(SPEAR's sparsity comes from the ReLU after the layer)")
        batch = setting.knowledge.batch_size
        if not wide_relu_linears(setting.model, batch):
            widths = [setting.model.get_submodule(n).out_features for n in relu_linears(setting.model)]
            return (f"needs a linear layer followed by ReLU with more units than the batch (B = {batch}); model "
                    f"'{setting.knowledge.model_name}' has at most {max(widths)} (SPEAR's rank-B factorization "
                    f"separates the samples only through more than B units)")
        return super().applicable(setting)

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if view.visible_fraction() == 0.0:
            return "the server view is empty: every entry is encrypted or kept local"
        layer, why = attacked_layer(view, knowledge)
        if layer is None:
            return why
        names = [f"{layer}.weight", f"{layer}.bias"]
        if any(torch.isnan(knowledge.global_params[n]).any() for n in names if n in knowledge.global_params):
            return f"the server does not know the global weights of layer '{layer}' (clients decrypt them)"
        return None

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        layer, _ = attacked_layer(view, knowledge)
        batch = knowledge.batch_size
        weight = knowledge.global_params[f"{layer}.weight"].double()
        bias = knowledge.global_params.get(f"{layer}.bias", torch.zeros(weight.shape[0])).double()
        g, rows, cols, resid = complete(knowledge.gradient(view, f"{layer}.weight"), view.visible[f"{layer}.weight"],
                                        batch)
        bias_grad = knowledge.gradient(view, f"{layer}.bias").double() if f"{layer}.bias" in view.values else \
            torch.full_like(bias, float("nan"))
        f = ss.decompose(g, batch, noise=resid)
        if len(f.rows) <= batch:
            raise RuntimeError(f"{type(self).__name__}: only {len(f.rows)} units of layer '{layer}' are active for "
                               f"this batch of {batch}; the rank-B factorization needs more than B")
        f = replace(f, rows=rows[f.rows])
        w = weight[:, cols]
        gen = torch.Generator().manual_seed(seed)
        extra = max(self.extra_zeros, ss.chance_zeros(f, batch, gen) + 2 if self.chance else 0)
        pool = ss.Pool(batch, max(batch - 1 + extra, int(np.ceil(self.min_sparsity * len(f.rows)))))
        proposer = self.proposer(view, knowledge, layer, f, cols, weight.shape[1], w, bias, gen)
        best, rounds = None, 0
        for rounds in range(1, self.rounds + 1):
            fill = proposer.propose(pool, rounds)
            pool.add_planes(f)
            pool.prune(f, spare=batch)
            best = sp.select(f, pool, bias_grad, w, bias, fill)
            if not sp.exact(f, best.score) and self.complete:
                best = sc.last_directions(f, pool, best, bias_grad, w, bias)
            if (sp.exact(f, best.score) and -1 not in best.chosen) or proposer.exhausted:
                break
        if not sp.exact(f, best.score):
            best = sp.repair(f, pool, best, bias_grad, w, bias)
        if not sp.exact(f, best.score) and self.complete:
            best = sc.last_directions(f, pool, best, bias_grad, w, bias, final=True)
        return self._result(view, knowledge, layer, f, cols, weight.shape[1], best, pool, rounds, resid)

    def proposer(self, view: ServerView, knowledge: Knowledge, layer: str, f: ss.Factors, cols: torch.Tensor,
                 width: int, w: torch.Tensor, bias: torch.Tensor, gen: torch.Generator) -> "Sampler":
        """What proposes candidate directions each round: SPEAR's sampling (SPEAR++ overrides it)."""
        est = Estimate(view, knowledge, layer, f, cols, width) \
            if self.prior_steps and self.per_row and knows_tail(knowledge, layer) else None
        return Sampler(self, f, w, bias, est, gen)

    def _result(self, view: ServerView, knowledge: Knowledge, layer: str, f: ss.Factors, cols: torch.Tensor, width: int,
                best: sp.Selection, pool: ss.Pool, rounds: int, resid: float) -> Reconstruction:
        batch = knowledge.batch_size
        u = torch.zeros(batch, width, dtype=torch.float64)
        u[:, cols] = torch.nan_to_num(best.x)
        d = f.L @ (best.q * best.s[None, :])
        if knowledge.labels is not None:
            labels = list(knowledge.labels)
        elif knows_tail(knowledge, layer):
            labels = read_labels(knowledge, layer, u, d, f.rows)
        elif head_rows_visible(view, knowledge):   # the rest of the model is unknown: the head's iDLG rule
            labels = idlg_labels(knowledge.gradient(view, knowledge.head[0]), batch)[1]
        else:
            labels = None
        probe = torch.rand(2, *knowledge.input_shape)
        reads_image = bool(torch.equal(layer_input(knowledge.build_model(), layer, probe), probe.flatten(1)))
        exact = sp.exact(f, best.score)
        extra = {"layer": layer, "recovered": "images" if reads_image else
                 f"the {width}-value input of layer '{layer}' (features, not pixels)",
                 "sparsity_matching": best.score, "exact": exact, "directions": len(pool.q),
                 "min_zeros": pool.min_zeros, "filled_in": best.chosen.count(-1), "proposals": pool.proposals,
                 "rounds": rounds, "rows_used": len(f.rows), "columns_unrecovered": width - len(cols), "completion_residual": resid,
                 "rank_tail": f.tail}
        images = u.float().reshape(batch, *knowledge.input_shape).clamp(0, 1) if reads_image else None
        if not reads_image:
            extra["features"] = u.float()
        counts = None if labels is None else np.bincount(labels, minlength=knowledge.num_classes)
        return Reconstruction(label_counts=counts, labels=labels, images=images, extra=extra)
