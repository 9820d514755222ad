"""The server view and the attacker's knowledge, derived generically from the wire.

The view of an upload is never written per defense: every parameter gets the value
the aggregation server saw (NaN where it saw nothing: encrypted or kept local) and a
visibility mask; ciphertexts appear as their sizes only; public metadata as sent: the
upload's own metadata under its keys, and every message the client sent the server in the
clear before this upload (negotiation: sensitivity vectors, masks, proposals) under
"sent/<round>/<what>", each with its public layout in `layouts` (round -1 is setup).
NaN rather than zero makes an attack that ignores the mask fail loudly instead of
silently treating hidden entries as known zeros. The membership pool (candidates, auxiliary
data, the final model the server can assemble) is part of what the server knows; it is drawn
by bench/federation/candidates.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from bench.protocol.wire import Message, Upload, WireError, entry_map


@dataclass(frozen=True)
class ServerView:
    values: dict[str, torch.Tensor]       # full-shape, NaN where not visible
    visible: dict[str, torch.Tensor]      # bool, same shapes
    ciphertext_sizes: tuple[int, ...]
    meta: dict[str, bytes]
    weight: float
    layouts: dict[str, str] = field(default_factory=dict)   # meta key -> public layout (bench.wire.LAYOUTS)

    @classmethod
    def of(cls, upload: Upload, shapes: dict[str, tuple[int, ...]],
           sent: list[tuple[int, str, Message]] = ()) -> "ServerView":
        """The view of `upload`, plus `sent`: (round, what, message) the client sent the server in the clear."""
        values, visible = {}, {}
        for name, shape in shapes.items():
            part = upload.payload.plain.get(name)
            if part is None:
                values[name] = torch.full(shape, float("nan"))
                visible[name] = torch.zeros(shape, dtype=torch.bool)
            else:
                part.check(upload.sender, name)
                if tuple(part.shape) != tuple(shape):
                    raise WireError(upload.sender, f"'{name}' has shape {tuple(part.shape)}, the model's is "
                                                   f"{tuple(shape)}")
                values[name] = part.dense(fill=float("nan"))
                visible[name] = torch.from_numpy(part.visible().copy()).reshape(shape)
        sizes = tuple(len(b) for c in upload.payload.cipher for b in c.blobs)
        meta = dict(upload.payload.meta)
        layouts = {k: upload.payload.layouts.get(k, "opaque") for k in meta}
        for round, what, message in sent:
            key = f"sent/{round}/{what}"
            meta[key], layouts[key] = message.data, message.layout
        return cls(values, visible, sizes, meta, upload.weight, layouts)

    def entry_maps(self) -> dict[str, np.ndarray]:
        """Every metadata entry with a per-entry layout, decoded over the flattened update (view order)."""
        size = sum(v.numel() for v in self.values.values())
        maps = {k: entry_map(self.meta[k], self.layouts.get(k, "opaque"), size) for k in self.meta}
        return {k: m for k, m in maps.items() if m is not None}

    def fully_visible(self, name: str) -> bool:
        return bool(self.visible[name].all())

    def visible_fraction(self) -> float:
        seen = sum(int(v.sum()) for v in self.visible.values())
        total = sum(v.numel() for v in self.visible.values())
        return seen / total if total else 0.0


@dataclass(frozen=True)
class Knowledge:
    """What the honest-but-curious server legitimately knows, and nothing else."""

    task: str                                  # classification | causal-lm
    model_name: str
    model_params: dict[str, Any]
    global_params: dict[str, torch.Tensor]     # the weights it sent; NaN where it does not know them
    num_classes: int
    input_shape: tuple[int, ...]
    batch_size: int                            # declared size of the attacked batch
    lr: float
    update_kind: str                           # gradient (one FedSGD step) | delta (local training)
    local_steps: int
    head: tuple[str, str | None]               # final linear layer's weight / bias names
    labels: list[int] | None = None            # only when the scenario grants them (labels_known)
    vocab_size: int | None = None
    tokenizer: Any = None
    build_model: Any = field(default=None, repr=False)   # () -> fresh module of the public architecture
    membership: "MembershipKnowledge | None" = None   # the membership pool, when an attack of the run scores one
    uploads_weights: bool = False              # the protocol uploads trained weights, not updates
    delta: float = 1e-5                        # the scenario's DP delta (public)
    canary: "Canary | None" = None             # the auditor's canary, in a scenario that runs canary trials
    public_x: torch.Tensor | None = field(default=None, repr=False)   # public inputs of the task's distribution
    # (held-out images), given only to a malicious-model attack's modify_model to tune what it sends
    local_batch_size: int | None = None        # the clients' local mini-batch size (FedAvg: the server sets it)
    # values the server computed itself from the public parts of the aggregates it built, for global entries it
    # does not know (Defense.server_estimate, e.g. SHE-LoRA's plaintext columns of Delta W): an estimate, not the
    # weights the client started from
    estimate: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def knows_global_model(self) -> bool:
        return all(not torch.isnan(p).any() for p in self.global_params.values())

    def gradient(self, view: ServerView, name: str) -> torch.Tensor:
        """The client's gradient from its upload: update = -lr * grad for one SGD step; when the protocol
        uploads trained weights, the update is the upload minus the global weights (NaN where unknown)."""
        scale = -1.0 / (self.lr * max(self.local_steps, 1))
        update = view.values[name] - self.global_params[name] if self.uploads_weights else view.values[name]
        return update * scale


@dataclass(frozen=True)
class MembershipKnowledge:
    candidates_x: torch.Tensor
    candidates_y: torch.Tensor
    aux_x: torch.Tensor
    aux_y: torch.Tensor
    initial: dict[str, torch.Tensor]          # the model the server sent in round one
    final: dict[str, torch.Tensor]            # final global entries, NaN where the server does not know them
    last: dict[str, torch.Tensor]             # each entry's last value the server knew
    recipe: dict[str, Any]                    # the scenario's training recipe: epochs, batch_size, lr
    loss: Callable = field(repr=False, default=None)   # task loss (model, x, y) -> scalar

    def known_fraction(self) -> float:
        known = sum(int((~torch.isnan(v)).sum()) for v in self.final.values())
        total = sum(v.numel() for v in self.final.values())
        return known / total if total else 0.0

    def assemble(self, fill: str) -> dict[str, torch.Tensor]:
        """Final model entries: known values, hidden ones as zero or their last known value."""
        if fill not in ("zero", "last"):
            raise ValueError(f"fill '{fill}' must be 'zero' or 'last'")
        out = {}
        for name, value in self.final.items():
            other = torch.zeros_like(value) if fill == "zero" else self.last[name]
            out[name] = torch.where(torch.isnan(value), other, value)
        return out


def model_blocked(knowledge) -> str | None:
    """Shared view need of model-based membership attacks: some entry of the final model is known."""
    if knowledge.membership.known_fraction() == 0.0:
        return "the server knows no entry of the final model (every entry is encrypted or kept local)"
    return None


def load(knowledge, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A fresh module of the public architecture with the given entries, in eval mode."""
    model = knowledge.build_model()
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, value in params.items():
            state[name].copy_(value)
    return model.eval()


@dataclass(frozen=True)
class Canary:
    """What an auditor plants and therefore knows: a gradient canary (an update direction the canary client
    uploads, or not), a mislabeled record the attacked batch holds, or not, or a one-run audit's many gradient
    canaries, each on its own entries (bench/federation/canary.py)."""

    kind: str                                  # gradient | mislabeled | one-run
    update: dict[str, torch.Tensor] | None = None   # one-run: every canary's values, each on the entries it owns
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    owner: dict[str, torch.Tensor] | None = None    # one-run: which canary (0 .. count - 1) each entry belongs to
    count: int = 1


def hidden_leak_free(view: ServerView) -> bool:
    """True when every hidden position is NaN: the property the wire tests check."""
    return all(bool(torch.isnan(view.values[n][~view.visible[n]]).all()) for n in view.values)


__all__ = ["ServerView", "Knowledge", "MembershipKnowledge", "Canary", "hidden_leak_free", "load", "model_blocked"]
