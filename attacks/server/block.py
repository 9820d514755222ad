"""What the malicious-model attacks share: a linear block prepended to any image model, and its gradients.

The server sends input -> block -> the original model. The block is one nn.Linear over the flattened
image, z = relu(W x + b), and hands the image on shifted by a per-image brightness, x + scale * mean_k z_k
(breaching's "addition" connection), so the model behind it still sees the image. What makes the block
leak is that the gradient reaching each row's output, dL/dz_k = scale / K * sum_pixels dL/dx', is the same
for every row a sample activates: a row's weight gradient is sum_n g_n x_n and its bias gradient sum_n g_n
over the samples n that activate it, so where one sample is alone, their ratio is that sample's input.

The attack reads the block back from what the server knows (knowledge.global_params: it sent those
weights) and from the upload, so nothing passes from modify_model to run but the model itself.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bench.protocol.attack import Setting
from bench.protocol.view import Knowledge, ServerView

WEIGHT, BIAS = "block.linear.weight", "block.linear.bias"


class LinearBlock(nn.Module):
    """x -> x + scale * mean_k relu(W flat(x) + b), back in the image's shape."""

    def __init__(self, shape: tuple[int, ...], rows: int, scale: float = 1.0):
        super().__init__()
        self.linear = nn.Linear(math.prod(shape), rows)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = F.relu(self.linear(x.flatten(1))).mean(dim=1)
        return x + self.scale * shift.view(-1, *([1] * (x.dim() - 1)))


class Prepended(nn.Module):
    """The block in front of the model; the model keeps its own tensors (under `model.`), so the entries the
    server does not know are filled in by the client (bench/federation/exchange.py)."""

    def __init__(self, block: LinearBlock, model: nn.Module):
        super().__init__()
        self.block = block
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.block(x))


def block_rows(knowledge: Knowledge, factor: int, rows: int) -> int:
    """`rows` when given, else `factor` rows per image of the declared batch."""
    return rows if rows > 0 else factor * knowledge.batch_size


def prepend(model: nn.Module, knowledge: Knowledge, weight: torch.Tensor, bias: torch.Tensor) -> Prepended:
    block = LinearBlock(tuple(knowledge.input_shape), weight.shape[0])
    with torch.no_grad():
        block.linear.weight.copy_(weight)
        block.linear.bias.copy_(bias)
    return Prepended(block, model)


def image_model_applicable(setting: Setting) -> str | None:
    """A block over the input needs image inputs (a classification task with (C, H, W) inputs)."""
    k = setting.knowledge
    if k.task != "classification" or len(k.input_shape) != 3:
        return (f"it prepends a block to an image model's input; model '{k.model_name}' of this {k.task} scenario "
                f"takes inputs of shape {tuple(k.input_shape)}, which it cannot modify")
    return None


def block_blocked(view: ServerView, knowledge: Knowledge, whole: bool) -> str | None:
    """Why no row of the block can be read from this view, or None (`whole`: a row needs every entry)."""
    if view.visible_fraction() == 0.0:
        return "the server view is empty: every entry is encrypted or kept local"
    if readable_rows(view, whole).any():
        return None
    if whole:
        return "no row of the block has its bias gradient and its whole weight-gradient row in the clear"
    return "no row of the block has its bias gradient and a weight-gradient entry in the clear"


def readable_rows(view: ServerView, whole: bool) -> torch.Tensor:
    """Rows whose bias gradient and whole weight-gradient row (`whole`) or some entry of it the server sees."""
    weight = view.visible[WEIGHT].all(dim=1) if whole else view.visible[WEIGHT].any(dim=1)
    return weight & view.visible[BIAS]


def exposure(view: ServerView, whole: bool) -> dict[str, float | int]:
    """What the defense left of the planted block in the clear (the record's details): the fraction of its
    entries hidden from the server and the number of rows it can read."""
    seen = int(view.visible[WEIGHT].sum()) + int(view.visible[BIAS].sum())
    total = view.visible[WEIGHT].numel() + view.visible[BIAS].numel()
    return {"block_hidden": 1.0 - seen / total, "readable_rows": int(readable_rows(view, whole).sum())}


def block_gradients(view: ServerView, knowledge: Knowledge) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's gradient of the block's weight (K, N) and bias (K,), in float64, NaN where hidden."""
    return knowledge.gradient(view, WEIGHT).double(), knowledge.gradient(view, BIAS).double()


def as_batch(images: list[torch.Tensor], knowledge: Knowledge) -> torch.Tensor:
    """B images in [0, 1] in the input's shape: the recovered ones, then zeros for the rest (a batch image the
    attack did not recover counts against it). A pixel the server did not see (NaN) takes the mean of the
    image's visible ones."""
    size = knowledge.batch_size
    shape = tuple(knowledge.input_shape)
    out = torch.zeros(size, *shape)
    for i, x in enumerate(images[:size]):
        x = x.double()
        seen = ~torch.isnan(x)
        fill = x[seen].mean() if seen.any() else torch.tensor(0.0, dtype=x.dtype)
        out[i] = torch.where(seen, x, fill).float().reshape(shape).clamp(0, 1)
    return out
