"""The server view and the attacker's knowledge, derived generically from the wire.

The view of an upload is never written per defense: every parameter gets the value
the aggregation server saw (NaN where it saw nothing: encrypted or kept local) and a
visibility mask; ciphertexts appear as their sizes only; public metadata as sent.
NaN rather than zero makes an attack that ignores the mask fail loudly instead of
silently treating hidden entries as known zeros.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from bench.wire import Upload, WireError


@dataclass(frozen=True)
class ServerView:
    values: dict[str, torch.Tensor]       # full-shape, NaN where not visible
    visible: dict[str, torch.Tensor]      # bool, same shapes
    ciphertext_sizes: tuple[int, ...]
    meta: dict[str, bytes]
    weight: float

    @classmethod
    def of(cls, upload: Upload, shapes: dict[str, tuple[int, ...]]) -> "ServerView":
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
        return cls(values, visible, sizes, dict(upload.payload.meta), upload.weight)

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

    def knows_global_model(self) -> bool:
        return all(not torch.isnan(p).any() for p in self.global_params.values())

    def gradient(self, view: ServerView, name: str) -> torch.Tensor:
        """The client's gradient from its upload: update = -lr * grad for one SGD step."""
        scale = -1.0 / (self.lr * max(self.local_steps, 1))
        return view.values[name] * scale


def hidden_leak_free(view: ServerView) -> bool:
    """True when every hidden position is NaN: the property the wire tests check."""
    return all(bool(torch.isnan(view.values[n][~view.visible[n]]).all()) for n in view.values)


__all__ = ["ServerView", "Knowledge", "hidden_leak_free"]
