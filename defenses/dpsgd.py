"""Record-level DP-SGD at each client (Abadi et al. 2016), the cross-silo setting, as a wrapper around any defense.

Every local step of a client (each batch of its local epochs, and a FedSGD upload's one step) takes its gradient
from `local_gradient`: each example's gradient of its own loss (torch.func: vmap of grad over the batch, the
per-sample machinery Opacus also offers as its functorch path; one backward pass per example for transformers'
models), clipped to L2 norm `clip` over every trainable
parameter, summed, plus N(0, (z * clip)^2) per entry, divided by the batch's size. The client's SGD step then
uses that gradient, so its update, and everything the wrapped `inner` defense encodes from it, is a
post-processing of noised steps: the guarantee holds whatever the inner defense sends of the update, but not for
what an inner defense derives from the client's data outside its training (e.g. SelectiveShield's Fisher mask,
MaskCrypt's proposal), which is sent as that defense sends it.

Accounting (bench/federation/accounting.py): one RDP ledger per client, stepped once per step the client ran
with q = batch_size / the client's data (a FedSGD step: its batch / the client's data), over the whole run,
counterfactual attacked batches included (the server saw them). The accountant (Opacus RDP) assumes each batch
is a Poisson sample at rate q; the engine runs shuffled batches of a fixed size, each record once per epoch
(what Opacus' own non-Poisson data loaders do too): the epsilon is the accountant's bound for the Poisson
mechanism at that rate, the common reading, not a bound proven for shuffling. Adjacency: adding or removing
one record of one client's data (record-level, a different unit from DP-FedAvg's client); the row's `epsilon`
is the attacked client's, `epsilon_other_clients` the most any other client spent. Client sampling across
rounds is not amplified (a client's ledger counts the steps it ran, and a round it sat out costs nothing).
`target_epsilon` calibrates z before training for the steps each client runs if it takes part in every round:
rounds x local_epochs x ceil(data / batch) at q; the attacked client, in the attack round, runs its
attack_repeats uploads instead: one FedSGD step each (`attack_update = "gradient"`) or local_epochs x
ceil(batch / batch_size) steps each (`"delta"`), every one counted, so every client stays within the target.

Canary audits: a gradient canary replaces the attacked client's update after training, and one-run canaries are
added to it, so DP-SGD's noise, inside training, never reaches them: such an audit would read a violation the
harness made. `applicable` refuses them; a mislabeled canary is a record trained on, and audits DP-SGD as it runs.

Models with BatchNorm are refused: a batch's statistics mix its examples, so an example's gradient is not its
own (Opacus refuses them too; use GroupNorm).
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from bench.federation.accounting import RdpLedger, noise_for_histories, report
from bench.protocol.aggregation import Aggregation
from bench.protocol.defense import Defense, Party, running_aggregate
from bench.protocol.wire import Payload, Upload
from bench.registry import DEFENSES

CHUNK = 32   # examples whose per-example gradients are held at once


def per_example_gradients(fed, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """({trainable name: (B, *shape) gradients}, (B,) losses): each example's gradient of the task's loss on it
    alone, where the model lives. torch.func's vmap of grad over the batch; a model built from transformers'
    modules, whose attention-mask checks branch on data (vmap cannot trace them), takes one backward pass per
    example instead (`looped`)."""
    if any(type(m).__module__.startswith("transformers.") for m in model.modules()):
        return looped(fed, model, x, y)
    from torch.func import functional_call, grad_and_value, vmap

    dev = next(model.parameters()).device
    trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    fixed = {n: t.detach() for n, t in list(model.named_parameters()) + list(model.named_buffers())
             if n not in trainable}

    def loss(params, xi, yi):
        def forward(inputs):
            return functional_call(model, {**params, **fixed}, (inputs,))
        return fed.task.loss(forward, xi.unsqueeze(0), yi.unsqueeze(0))

    return vmap(grad_and_value(loss), in_dims=(None, 0, 0), randomness="different")(trainable, x.to(dev), y.to(dev))


def looped(fed, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """per_example_gradients by one backward pass per example (the model's .grad is left zeroed)."""
    dev = next(model.parameters()).device
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads: dict[str, list[torch.Tensor]] = {n: [] for n, _ in trainable}
    losses = []
    for i in range(len(x)):
        model.zero_grad()
        loss = fed.task.loss(model, x[i:i + 1].to(dev), y[i:i + 1].to(dev))
        loss.backward()
        for n, p in trainable:
            grads[n].append(p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        losses.append(loss.detach())
    model.zero_grad()
    return {n: torch.stack(g) for n, g in grads.items()}, torch.stack(losses)


def clipped_sum(grads: dict[str, torch.Tensor], clip: float) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Sum over the batch of each example's gradient scaled to L2 norm at most `clip` (the norm over every
    parameter together); also the examples' norms before clipping."""
    norms = torch.sqrt(sum(g.reshape(len(g), -1).pow(2).sum(1) for g in grads.values()))
    scale = (clip / (norms + 1e-6)).clamp(max=1.0)   # Opacus' per-sample clip factor
    return {n: torch.einsum("b,b...->...", scale, g) for n, g in grads.items()}, norms


@DEFENSES.register("dp-sgd", "record-level DP-SGD at each client: per-example clipping and Gaussian noise in every "
                   "local step (Opacus RDP per client, q = batch / client data), around any defense's upload")
class DPSGD(Defense):
    """Record-level DP-SGD in each client's local training; the upload is the inner defense's of the noised update."""

    links = {"paper": "https://arxiv.org/abs/1607.00133", "code": "https://github.com/pytorch/opacus"}
    differentially_private: ClassVar[bool] = True

    def __init__(self, noise_multiplier: float | None = None, target_epsilon: float | None = None,
                 clip: float = 1.0, inner: str = "plaintext", inner_params: dict | None = None) -> None:
        super().__init__(noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, clip=clip, inner=inner,
                         inner_params=inner_params)
        if (noise_multiplier is None) == (target_epsilon is None):
            raise ValueError("dp-sgd: give exactly one of noise_multiplier or target_epsilon")
        if noise_multiplier is not None and not noise_multiplier > 0:
            raise ValueError(f"dp-sgd: noise_multiplier must be > 0 (clipping alone is not DP), got {noise_multiplier}")
        if target_epsilon is not None and not target_epsilon > 0:
            raise ValueError(f"dp-sgd: target_epsilon must be > 0, got {target_epsilon}")
        if not clip > 0:
            raise ValueError(f"dp-sgd: clip must be > 0, got {clip}")
        inner_cls = DEFENSES.get(inner)
        if getattr(inner_cls, "differentially_private", False):
            raise ValueError(f"dp-sgd: inner defense '{inner}' is itself DP; wrap a non-DP defense")
        self.inner: Defense = inner_cls(**(inner_params or {}))
        for flag in ("key_topology", "decodes_weighted_sum", "uploads_weights"):
            setattr(self, flag, getattr(self.inner, flag))
        self.clip = float(clip)
        self.z: float | None = None
        self.ledgers: dict[str, RdpLedger] = {}

    def applicable(self, setting) -> str | None:
        if setting.canary in ("gradient", "one-run"):
            return (f"a {setting.canary} canary is put into the update after local training, where DP-SGD's noise "
                    f"never reaches it: the audit would read a violation the harness made; audit DP-SGD with "
                    f"canary = \"mislabeled\" (a record it trains on)")
        norms = [type(m).__name__ for m in setting.model.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)
                 and not isinstance(m, torch.nn.modules.instancenorm._InstanceNorm)]
        if norms:
            return (f"model '{setting.knowledge.model_name}' has {norms[0]}: a batch's statistics mix its examples, "
                    f"so per-example clipping is undefined (Opacus refuses it too)")
        return self.inner.applicable(setting)

    # -- local training --------------------------------------------------------------------------
    def setup(self, fed) -> None:
        self.z = self.params["noise_multiplier"] or noise_for_histories(
            self.params["target_epsilon"], fed.scenario.delta, [self._plan(fed, c) for c in fed.clients])
        self.inner.setup(fed)

    def _plan(self, fed, client) -> list[tuple[float, int]]:
        """The steps the client runs if it takes part in every round: its local epochs each round, except that the
        attacked client runs its attack_repeats uploads of the attack round instead (engine._train): one FedSGD
        step on the attacked batch each, or local epochs over that batch in batches of batch_size."""
        sc, n = fed.scenario, client.num_samples
        attacked = client.index == sc.attack_client
        per_round = sc.local_epochs * math.ceil(n / sc.batch_size)
        plan = [(self._rate(fed, client, sc.batch_size), (sc.rounds - attacked) * per_round)]
        if attacked:
            batch = min(sc.attack_batch_size, n)
            if sc.attack_update == "gradient":
                plan.append((self._rate(fed, client, batch), sc.attack_repeats))
            else:
                plan.append((self._rate(fed, client, sc.batch_size),
                             sc.attack_repeats * sc.local_epochs * math.ceil(batch / sc.batch_size)))
        return plan

    @staticmethod
    def _rate(fed, client, batch: int) -> float:
        """q of a step on `batch` examples: at least the scenario's batch size (a short last batch of an epoch is
        accounted as a full one), over the client's data."""
        return min(1.0, max(batch, fed.scenario.batch_size) / max(client.num_samples, 1))

    def local_gradient(self, fed, client, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.z is None:
            raise RuntimeError("dp-sgd: a local step before setup calibrated the noise")
        ledger = self.ledgers.setdefault(client.name, RdpLedger(self.z, self._rate(fed, client, len(x))))
        ledger.step(self._rate(fed, client, len(x)))
        total, losses = None, []
        for start in range(0, len(x), CHUNK):
            grads, loss = per_example_gradients(fed, model, x[start:start + CHUNK], y[start:start + CHUNK])
            part, _ = clipped_sum(grads, self.clip)
            total = part if total is None else {n: total[n] + part[n] for n in total}
            losses.append(loss.detach())
        gen = client.party.state.setdefault(
            "dpsgd_noise", torch.Generator().manual_seed(fed.scenario.seed * 1_000_003 + 0xD5 * 7919 + client.index))
        params = dict(model.named_parameters())
        for name, value in total.items():   # noise drawn on the CPU on every device, so runs agree across devices
            noise = torch.randn(value.shape, generator=gen, dtype=value.dtype) * (self.z * self.clip)
            params[name].grad = (value + noise.to(value.device)) / len(x)
        return torch.cat(losses).mean()

    # -- the upload: the inner defense's -----------------------------------------------------------
    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.inner.adapt_model(model)

    def round_start(self, fed, round: int, clients: list, updates: dict[str, dict[str, torch.Tensor]]) -> None:
        self.inner.round_start(fed, round, clients, updates)

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        return self.inner.encode(fed, client, update, weight)

    def aggregate(self, fed, uploads: list[Upload], server: Party) -> Payload:
        return self.inner.aggregate(fed, uploads, server)

    def start_aggregate(self, fed, server: Party) -> Aggregation | None:
        return running_aggregate(self.inner, fed, server)

    def decoder(self, fed) -> Party:
        return self.inner.decoder(fed)

    def decode(self, fed, aggregate: Payload, party: Party) -> dict[str, torch.Tensor]:
        return self.inner.decode(fed, aggregate, party)

    def merge(self, fed, client, global_update: dict[str, torch.Tensor]) -> None:
        self.inner.merge(fed, client, global_update)

    def hidden_initial(self, fed) -> dict[str, torch.Tensor]:
        return self.inner.hidden_initial(fed)

    def server_estimate(self, fed) -> dict[str, torch.Tensor]:
        return self.inner.server_estimate(fed)

    def cipher_target(self) -> tuple[str, float] | None:
        return self.inner.cipher_target()

    def match_cipher_bytes(self, nbytes: float) -> None:
        self.inner.match_cipher_bytes(nbytes)

    def run_metrics(self, fed) -> dict[str, Any]:
        import opacus

        sc = fed.scenario
        attacked = fed.clients[sc.attack_client].name
        spent = {name: ledger.epsilon(sc.delta) for name, ledger in self.ledgers.items()}   # RDP: cheap to rank
        others = {name: e for name, e in spent.items() if name != attacked}
        worst = max(others, key=others.get) if others else None
        epsilons, details = report(
            sc.delta, self.ledgers[attacked].history if attacked in self.ledgers else [],
            self.ledgers[worst].history if worst else None, level="record",
            sensitivity="C = clip: one example's clipped gradient in a step's sum, against none",
            sampling=f"shuffled batches of {sc.batch_size} without replacement, each record once per local epoch (as "
                     "run); accounted as Poisson sampling at q = batch / client data",
            covers="every local step of the client; not what an inner defense derives from the data outside training")
        details |= {"attacked_client": attacked, "ledgers": f"opacus {opacus.__version__}, one per client",
                    "noise_multiplier": self.z, "clip": self.clip, "clipped": "per example, every step",
                    "clients": len(spent), "target_epsilon": self.params["target_epsilon"], "inner": self.params["inner"],
                    "steps": self.ledgers[attacked].steps if attacked in self.ledgers else 0,
                    "epsilon_median_rdp": float(np.median(list(spent.values()))) if spent else 0.0}
        if worst is not None:
            details["worst_other_client"] = worst
        return dict(self.inner.run_metrics(fed)) | epsilons | {
            "noise_multiplier": self.z, "clip": self.clip, "upload_noise_multiplier": self.z, "dp": details}
