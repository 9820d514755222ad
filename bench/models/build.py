"""What the engine and the attacks need of any model: build it by name, find its classifier head,
list the entries a client's update covers."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from torch import nn

from bench.data.loading import Dataset
from bench.protocol.contracts import returned_model
from bench.registry import MODELS


_STRUCTURE_ONLY: ContextVar[bool] = ContextVar("structure_only", default=False)


@contextmanager
def structure_only() -> Iterator[None]:
    """Build models for checks that read shapes and layers only (a dry run's applicability checks): a factory
    that reads pretrained weights may skip them and leave its parameters on the meta device."""
    token = _STRUCTURE_ONLY.set(True)
    try:
        yield
    finally:
        _STRUCTURE_ONLY.reset(token)


def weights_wanted() -> bool:
    """False inside `structure_only`: the model being built is for its structure, its values are never read."""
    return not _STRUCTURE_ONLY.get()


def build_model(name: str, data: Dataset, **kwargs) -> nn.Module:
    factory = MODELS.get(name)
    return returned_model(factory, "the factory", factory(data, **kwargs))


def classifier_head(model: nn.Module) -> tuple[str, str | None]:
    """Names (as in named_parameters) of the last nn.Linear's weight and bias: the layer iLRG/iDLG read."""
    last = None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            last = module
    if last is None:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer, so it has no classifier head")
    names = {id(p): n for n, p in model.named_parameters()}   # by identity: tied weights keep their first name
    bias = names[id(last.bias)] if last.bias is not None else None
    return names[id(last.weight)], bias


def update_names(model: nn.Module) -> list[str]:
    """What a client's update covers: trainable parameters, then persistent floating buffers (BN stats)."""
    persistent = set(model.state_dict())
    params = [n for n, p in model.named_parameters() if p.requires_grad]
    buffers = [n for n, b in model.named_buffers() if b.is_floating_point() and n in persistent]
    return params + buffers
