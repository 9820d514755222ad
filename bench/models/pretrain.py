"""Warm start: a model trained centrally on a public split held out from every client.

Defenses such as DictPFL start from a pretrained model. The public split is the first
`public_fraction` of a seeded, stratified permutation of the training set; clients get
only the rest. Its size and the epochs are part of the scenario, hence of the cell id.
"""
from __future__ import annotations

import numpy as np
import torch


def split_public(labels: torch.Tensor, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(public indices, client indices): a seeded per-class split, so both sides see every class."""
    rng = np.random.default_rng(seed + 7919)
    y = labels.numpy()
    public = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        public.append(idx[: int(round(fraction * len(idx)))])
    public = np.sort(np.concatenate(public)) if public else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(len(y)), public)
    return public, rest


def pretrain(model: torch.nn.Module, task, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
             lr: float, seed: int) -> dict[str, torch.Tensor]:
    """Central SGD on the public split; returns the trained state dict."""
    gen = torch.Generator().manual_seed(seed + 104729)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr, momentum=0.9)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=gen).split(batch_size):
            opt.zero_grad()
            task.loss(model, x[batch], y[batch]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
