"""The server view and the attacker's knowledge, derived generically from the wire.

The view of an upload is never written per defense: every parameter gets the value
the aggregation server saw (NaN where it saw nothing: encrypted or kept local) and a
visibility mask; ciphertexts appear as their sizes only; public metadata as sent: the
upload's own metadata under its keys, and every message the client sent the server in the
clear before this upload (negotiation: sensitivity vectors, masks, proposals) under
"sent/<round>/<what>", each with its public layout in `layouts` (round -1 is setup).
NaN rather than zero makes an attack that ignores the mask fail loudly instead of
silently treating hidden entries as known zeros.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.wire import Message, Upload, WireError, entry_map


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
    membership: Any = None                     # bench.membership.MembershipKnowledge, when the scenario has one
    uploads_weights: bool = False              # the protocol uploads trained weights, not updates

    def knows_global_model(self) -> bool:
        return all(not torch.isnan(p).any() for p in self.global_params.values())

    def gradient(self, view: ServerView, name: str) -> torch.Tensor:
        """The client's gradient from its upload: update = -lr * grad for one SGD step; when the protocol
        uploads trained weights, the update is the upload minus the global weights (NaN where unknown)."""
        scale = -1.0 / (self.lr * max(self.local_steps, 1))
        update = view.values[name] - self.global_params[name] if self.uploads_weights else view.values[name]
        return update * scale


def hidden_leak_free(view: ServerView) -> bool:
    """True when every hidden position is NaN: the property the wire tests check."""
    return all(bool(torch.isnan(view.values[n][~view.visible[n]]).all()) for n in view.values)


__all__ = ["ServerView", "Knowledge", "hidden_leak_free"]
