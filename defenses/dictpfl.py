"""DictPFL (Xue et al., NeurIPS 2025) and the FedHE-Top2 baseline of its paper.

DePE (decompose-for-partial-encrypt). `adapt_model` rewrites every nn.Linear and nn.Conv2d
of the warm-started model (a conv weight read as (out, in*k*k)) into W = W0 + D T, the
paper's form (its demo's W = D T without W0 loses the truncated part of W0):
- W0 is the pretrained weight, frozen; T the trainable lookup table, zero at the start, so
  at any rank training starts from exactly the pretrained function.
- D comes from the truncated SVD W0 ~ U_r Sigma_r V_r^T, in float64 with each singular
  vector's sign fixed (largest entry positive), so every party derives the same D from the
  same weights on any LAPACK. Default `dictionary = "u"`: D = U_r. The paper's D = U_r Sigma_r
  (`"u-sigma"`) spans the same weight changes (T_paper = Sigma_r^-1 T) but under plain SGD
  scales the step along direction i by sigma_i^2; on the warm-started MNIST MLP (sigma_1 = 4.2)
  it produced NaN updates in round 0 at the scenario's lr 0.1. With D = U_r a table step is
  the full-model SGD step projected onto the dictionary's span, so one lr serves every defense.
- D never travels: every client computes it from the shared warm start (the server could
  too, the warm start being public here; privacy rests on encryption, not on D's secrecy).
- Rank `rank` (default 4, the paper's) or `full_rank` (r = min(out, in*k*k)); full rank lets
  T reach every weight change only when out <= in*k*k (else D spans W0's column space).
- Biases are frozen (the paper trains T only); `train_bias` makes them trainable and
  encrypted with T. Every other parameter (BatchNorm affine, embeddings) is frozen. BN
  running statistics stay in the update, as the engine defines it, and are encrypted with T:
  they move with the clients' data, so they must not travel in plaintext.
- The last linear layer stays an nn.Linear whose `weight` names its table, so the engine's
  classifier-head lookup points at the head's trainable entries.

Every update entry travels in one packed CKKS vector, pre-weighted so the server only adds;
nothing is in plaintext, so the server view is empty. Keys: shared-client-key as the paper
(clients decrypt the aggregate; the server never learns it) or `keys = "key-server"`, under
which the key server's plaintext result passes the server, which then also learns the
pruning history.

PrME (prune-for-minimum-encrypt), run identically at every client from what every client
decrypts (the aggregate δw_t, zero where nobody uploaded) and a seed shared by the clients:
- TIP: θ_t = the s-quantile of |δw_t| over all entries; an entry is inactive in round t when
  |δw_t| < θ_t. An entry inactive in τ consecutive rounds it was uploaded in is pruned.
  Unsent entries count as zero in θ_t, so new pruning stops once s of all entries are
  pruned: s acts as the pruning ratio.
- HRC: every entry has p (start 1); in each round an entry is uploaded, p <- p·β if
  inactive else min(p/β, 1). A pruned entry has no new aggregate, so its p is held (the
  review summary: p moves "after reactivation", by the accumulated gradient). Each round a
  pruned entry is reactivated when u < p, u drawn from the shared seed and round; it then
  uploads its update accumulated since pruning (per-client accumulators in
  `client.party.state`) and rejoins if that aggregate is active.
- The mask is never on the wire: the server learns only the ciphertext count. The cipher
  part's layout is the clients' own knowledge (the engine reads it to measure the encrypted
  fraction); the server's addition ignores it and the decoding client rebuilds it locally.
Defaults s = 0.7, τ = 3, β = 0.2 (the paper's).
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.crypto.keys import TOPOLOGIES, provision
from bench.protocol.defense import Defense
from bench.protocol.evidence import run_metric
from bench.protocol.payloads import encrypt_part, unpack
from bench.protocol.wire import CipherPart, Payload
from bench.registry import DEFENSES
from defenses.selective import SelectiveHE

# ------------------------------------------------------------------------------------ DePE

_DICTIONARIES: dict[tuple, torch.Tensor] = {}

run_metric("pruned_fraction", "", None, "cost", "mean fraction of update entries left off the wire per round (DictPFL "
           "encryption-aware pruning)")


def dictionary(weight: torch.Tensor, rank: int | None, scaled: bool = True) -> torch.Tensor:
    """D = U_r Sigma_r (or U_r when not scaled) of the weight read as (out, rest); rank None: full rank.

    A pure function of the weights, memoized because every model the engine builds is decomposed
    again. The float64 SVD runs on one thread: on these shared 2-core machines LAPACK took 6.5 s
    for a 256x784 matrix with two threads and 0.06 s with one."""
    key = (hashlib.sha256(weight.detach().cpu().numpy().tobytes()).hexdigest(), tuple(weight.shape), rank, scaled)
    if key not in _DICTIONARIES:
        _DICTIONARIES[key] = _svd_dictionary(weight.detach().cpu(), rank, scaled)
    return _DICTIONARIES[key].clone()


def _svd_dictionary(weight: torch.Tensor, rank: int | None, scaled: bool) -> torch.Tensor:
    matrix = weight.double().reshape(weight.shape[0], -1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        u, s, _ = torch.linalg.svd(matrix, full_matrices=False)
    finally:
        torch.set_num_threads(threads)
    r = min(matrix.shape) if rank is None else min(rank, *matrix.shape)
    u = u[:, :r]
    peak = u.gather(0, u.abs().argmax(dim=0, keepdim=True))
    u = u * torch.where(peak < 0, -1.0, 1.0)
    return (u * s[:r] if scaled else u).to(weight.dtype)


class _Table:
    """Shared part of both layers: frozen W0 and D as non-persistent buffers, trainable T."""

    def _decompose(self, weight: torch.Tensor, bias: torch.Tensor | None, rank: int | None, train_bias: bool,
                   scaled: bool):
        d = dictionary(weight, rank, scaled)
        self.register_buffer("base", weight.detach().clone(), persistent=False)
        self.register_buffer("dictionary", d, persistent=False)
        self.table = nn.Parameter(torch.zeros(d.shape[1], weight[0].numel(), dtype=weight.dtype))
        if bias is not None and train_bias:
            self.bias = nn.Parameter(bias.detach().clone())
        else:
            self.register_buffer("fixed_bias", None if bias is None else bias.detach().clone(), persistent=False)
            self.bias = None

    def effective_weight(self) -> torch.Tensor:
        return torch.addmm(self.base.reshape(self.base.shape[0], -1), self.dictionary, self.table).reshape(
            self.base.shape)

    def effective_bias(self) -> torch.Tensor | None:
        return self.bias if self.bias is not None else self.fixed_bias


class DictLinear(_Table, nn.Linear):
    """nn.Linear computing with W0 + D T; `weight` is the table so head lookups name it."""

    def __init__(self, layer: nn.Linear, rank: int | None, train_bias: bool, scaled: bool):
        nn.Module.__init__(self)
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self._decompose(layer.weight, layer.bias, rank, train_bias, scaled)

    weight = property(lambda self: self.table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight(), self.effective_bias())


class DictConv2d(_Table, nn.Module):
    """A frozen conv's geometry with weight W0 + D T."""

    def __init__(self, layer: nn.Conv2d, rank: int | None, train_bias: bool, scaled: bool):
        nn.Module.__init__(self)
        self._decompose(layer.weight, layer.bias, rank, train_bias, scaled)
        self.conv = layer.requires_grad_(False)
        self.conv.weight, self.conv.bias = None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv._conv_forward(x, self.effective_weight(), self.effective_bias())


def decompose(model: nn.Module, rank: int | None, train_bias: bool = False, scaled: bool = True) -> nn.Module:
    """Freeze everything, then swap each Linear/Conv2d for its dictionary form in place."""
    model.requires_grad_(False)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, DictLinear(child, rank, train_bias, scaled))
            elif type(child) is nn.Conv2d:
                setattr(parent, name, DictConv2d(child, rank, train_bias, scaled))
    return model


# ------------------------------------------------------------------------------------ PrME

class PrME:
    """Pruning state every client holds identically (aggregates and the shared seed only)."""

    def __init__(self, size: int, s: float, tau: int, beta: float, seed: int):
        self.s, self.tau, self.beta, self.seed = s, tau, beta, seed
        self.streak = np.zeros(size, np.int64)
        self.pruned = np.zeros(size, bool)
        self.p = np.ones(size)

    def active(self, round: int) -> np.ndarray:
        """Entries uploaded this round: unpruned ones plus the HRC draws among the pruned."""
        draw = np.random.default_rng([self.seed, round]).random(self.pruned.size)
        return ~self.pruned | (self.pruned & (draw < self.p))

    def observe(self, aggregate: np.ndarray, sent: np.ndarray) -> None:
        """TIP and HRC updates from one round's decrypted aggregate (zero where unsent)."""
        magnitude = np.abs(np.where(sent, aggregate, 0.0))
        inactive = magnitude < np.quantile(magnitude, self.s)
        self.streak = np.where(sent, np.where(inactive, self.streak + 1, 0), self.streak)
        self.p = np.where(sent, np.where(inactive, self.p * self.beta, np.minimum(self.p / self.beta, 1.0)), self.p)
        self.pruned = np.where(sent, self.streak >= self.tau, self.pruned)


# ------------------------------------------------------------------------------------ defense

@DEFENSES.register("dictpfl", "DictPFL: frozen SVD dictionary, CKKS-encrypted lookup table, TIP+HRC pruning; "
                              "nothing in plaintext")
class DictPFL(Defense):
    """The frozen dictionary is the SVD of the warm start, the server's model: a malicious server chooses W0 and
    so the directions the table can move along; every uploaded entry, a layer it adds included, is encrypted."""

    links = {"paper": "https://arxiv.org/abs/2510.21086", "code": "https://github.com/UCF-ML-Research/DictPFL"}
    key_topology = "shared-client-key"
    decodes_weighted_sum = False   # pruned entries carry over to later rounds (accumulated residuals)

    def __init__(self, rank: int = 4, full_rank: bool = False, dictionary: str = "u", train_bias: bool = False,
                 prune: bool = True, s: float = 0.7, tau: int = 3, beta: float = 0.2,
                 keys: str = "shared-client-key") -> None:
        if rank < 1 or tau < 1:
            raise ValueError(f"rank and tau must be >= 1, got rank={rank}, tau={tau}")
        if not 0.0 < s < 1.0 or not 0.0 < beta < 1.0:
            raise ValueError(f"s and beta must be in (0, 1), got s={s}, beta={beta}")
        if keys not in TOPOLOGIES:
            raise ValueError(f"keys '{keys}' must be one of {', '.join(TOPOLOGIES)}")
        if dictionary not in ("u-sigma", "u"):
            raise ValueError(f"dictionary '{dictionary}' must be 'u-sigma' (D = U_r Sigma_r) or 'u' (D = U_r)")
        super().__init__(rank=rank, full_rank=full_rank, dictionary=dictionary, train_bias=train_bias, prune=prune,
                         s=s, tau=tau, beta=beta, keys=keys)
        self.rank, self.full_rank, self.train_bias, self.prune = rank, full_rank, train_bias, prune
        self.scaled = dictionary == "u-sigma"
        self.s, self.tau, self.beta, self.key_topology = s, tau, beta, keys
        self.pruned_by_round: dict[str, float] = {}

    def adapt_model(self, model: nn.Module) -> nn.Module:
        return decompose(model, None if self.full_rank else self.rank, self.train_bias, self.scaled)

    def setup(self, fed) -> None:
        self.key = provision(fed, self.key_topology)
        fed.parties["server"].state["he_params"] = self.key.params
        self.names = list(fed.names)
        self.sizes = [int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1 for n in fed.names]
        self.prme = PrME(sum(self.sizes), self.s, self.tau, self.beta, fed.scenario.seed)
        self.sent = np.ones(sum(self.sizes), bool)

    def _split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(self.names, np.split(flat, np.cumsum(self.sizes)[:-1])))

    def round_start(self, fed, round: int, clients: list, updates: dict) -> None:
        self.sent = self.prme.active(round) if self.prune else np.ones(sum(self.sizes), bool)
        self.pruned_by_round[str(round)] = float(1.0 - self.sent.mean())

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        """Accumulated-plus-new update at the round's active entries, pre-weighted, in one CKKS vector.

        The first upload of a round commits the accumulator; counterfactual re-encodes of the
        attacked client (attack_repeats) read the same starting point and change nothing."""
        state = client.party.state
        if state.get("round") != fed.round:
            state["round"] = fed.round
            state["start"] = state.get("accumulated", np.zeros(self.sent.size))
            commit = True
        else:
            commit = False
        total = state["start"] + np.concatenate([update[n].detach().reshape(-1).double().numpy() for n in fed.names])
        if commit:
            state["accumulated"] = np.where(self.sent, 0.0, total)
        if not self.sent.any():
            return Payload()
        layout = tuple((n, m) for n, m in self._split(self.sent).items() if m.any())
        return Payload(cipher=(encrypt_part(fed, client, "ckks", total[self.sent] * weight, layout),))

    def decode(self, fed, aggregate: Payload, party) -> dict[str, torch.Tensor]:
        """Decrypt with the layout the decoding client derives itself, then update the shared history."""
        layout = tuple((n, m) for n, m in self._split(self.sent).items() if m.any())
        parts = []
        for part in aggregate.cipher:
            if part.length != int(self.sent.sum()):
                raise ValueError(f"{party.name}: the aggregate holds {part.length} values but this round's "
                                 f"mask has {int(self.sent.sum())}; the clients' pruning state diverged")
            parts.append(CipherPart(part.scheme, part.blobs, layout, part.length))
        update = unpack(Payload(cipher=tuple(parts)), fed.shapes, party, fed)
        if self.prune:
            flat = np.concatenate([update[n].reshape(-1).double().numpy() for n in fed.names])
            self.prme.observe(flat, self.sent)
        return update

    def run_metrics(self, fed) -> dict:
        rounds = list(self.pruned_by_round.values())
        return {"pruned_fraction": float(np.mean(rounds)) if rounds else 0.0,
                "pruned_fraction_by_round": dict(self.pruned_by_round), "he_params": dict(self.key.params)}


# ------------------------------------------------------------------------------------ FedHE-Top2

def last_layers(model: nn.Module, count: int = 2) -> list[nn.Module]:
    """The last `count` modules that own trainable parameters directly (linear, conv, norm layers). Frozen
    ones are skipped: on a LoRA fine-tune the final norm and LM head never travel, and the top of what is
    shared is the last adapters."""
    owners = [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    return owners[-count:]


@DEFENSES.register("fedhe-top2", "FedHE-Top2: the last two parameterized layers encrypted with CKKS, "
                                 "the rest in plaintext (freeze_rest: only those two train)")
class FedHETop2(SelectiveHE):
    """The DictPFL paper's baseline trains only the last two layers and encrypts them (`freeze_rest`);
    by default the whole model trains and the earlier layers travel in plaintext, the partial-
    encryption reading that shows what the unencrypted layers expose. Weights, biases and the
    BN statistics of those two layers are encrypted; the mask is fixed by the architecture, so a
    malicious server that sends layers in front of them (or anywhere but the top) gets their gradients in
    plaintext."""
    links = {"paper": "https://arxiv.org/abs/2510.21086"}

    def __init__(self, freeze_rest: bool = False, keys: str = "shared-client-key") -> None:
        super().__init__(rule="max", ratio=1.0, keys=keys)
        self.params = {"freeze_rest": freeze_rest, "keys": keys}
        self.freeze_rest = freeze_rest

    def adapt_model(self, model: nn.Module) -> nn.Module:
        if self.freeze_rest:
            keep = {id(p) for m in last_layers(model) for p in m.parameters(recurse=False)}
            for p in model.parameters():
                p.requires_grad_(id(p) in keep)
        return model

    def global_mask(self, fed) -> dict[str, np.ndarray]:
        names = {id(m): n for n, m in fed.model.named_modules()}
        prefixes = [names[id(m)] + "." if names[id(m)] else "" for m in last_layers(fed.model)]
        return {n: np.full(int(np.prod(s)) if s else 1, self.freeze_rest or any(
                    n.startswith(p) and "." not in n[len(p):] for p in prefixes), bool)
                for n, s in fed.shapes.items()}
