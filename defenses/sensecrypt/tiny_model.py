"""A tiny MLP so per-parameter Paillier (tens of ms per value at 2048 bits) fits a benchmark run."""
from __future__ import annotations

import math

from torch import nn

from bench.registry import MODELS


@MODELS.register("mlp-tiny", "tiny MLP for per-parameter Paillier: flatten, hidden (default 32, ReLU), classes")
def mlp_tiny(data, hidden: int = 32) -> nn.Module:
    """2,410 parameters on 8x8 digits at hidden=32 (610 at hidden=8), against 50k for the `mlp`."""
    if hidden < 1:
        raise ValueError(f"mlp-tiny hidden must be >= 1, got {hidden}")
    if data.task != "classification" or len(data.input_shape) != 3:
        raise ValueError(f"model 'mlp-tiny' needs image classification data (C,H,W); dataset '{data.name}' is "
                         f"{data.task} with input shape {data.input_shape}")
    shape = tuple(data.input_shape)
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, data.num_classes))
