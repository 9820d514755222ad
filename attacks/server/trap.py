"""Trap weights (Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov, Papernot, "When the Curious Abandon
Honesty: Federated Learning Is Not Private", EuroS&P 2023).

Each row of the block weighs a random half of the pixels by -a_j and the other half by s * a_j (a_j ~
|N(0, sigma)|, s < 1 the scale factor), with no bias: on non-negative inputs the negative half outweighs
the positive one for most images, so a row fires for few images of a batch, and a row that fires for one
image alone gives it back as weight gradient / bias gradient. The paper sets s by hand (breaching's config:
0.95); with `scale = 0` (the default) s is bisected on public inputs of the task (knowledge.public_x) so
that a row fires for 1/B of them, the rate at which a row most often fires for exactly one image of B.

Readout: every row with a non-zero bias gradient gives a candidate. Rows that fire for the same image alone
carry the same gradients, so candidates are grouped; a group whose gradients are the sum of two others' (a
row two images fired) is dropped; the B groups that the most rows produced (candidates inside the data box
[0, 1] first) are the reconstruction, and zeros fill a batch with fewer. Only rows the server sees whole are
read (the grouping compares whole rows); the imprint attack also reads partly hidden rows.
"""
from __future__ import annotations

import math

import torch

from attacks.server.block import (as_batch, block_blocked, block_gradients, block_rows, exposure, image_model_applicable,
                                  prepend, readable_rows)
from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS

TOL = 1e-4   # relative: candidates closer than this are one; float32 gradients agree to about 1e-6


def trap_halves(rows: int, size: int, sigma: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative part, positive part) of the rows before scaling: -a_j on one random half of the pixels,
    +a_j (to be scaled by s) on the other, the same magnitudes on both halves."""
    gen = torch.Generator().manual_seed(seed)
    half = size // 2
    negative, positive = torch.zeros(rows, size), torch.zeros(rows, size)
    for k in range(rows):
        order = torch.randperm(size, generator=gen)
        magnitude = (torch.randn(half, generator=gen) * sigma).abs()
        negative[k, order[:half]] = -magnitude
        positive[k, order[half:2 * half]] = magnitude
    return negative, positive


def calibrated_scale(negative: torch.Tensor, positive: torch.Tensor, public: torch.Tensor | None, rate: float) -> float:
    """s in [0, 4] such that the rows fire for `rate` of the public inputs on average (bisection); 0.95, the
    paper's choice in breaching, without public inputs."""
    if public is None or len(public) < 2:
        return 0.95
    x = public.flatten(1).double()
    neg, pos = x @ negative.double().T, x @ positive.double().T
    low, high = 0.0, 4.0
    for _ in range(40):
        mid = (low + high) / 2
        if float((neg + mid * pos > 0).double().mean()) < rate:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def trap_read(dw: torch.Tensor, db: torch.Tensor, readable: torch.Tensor, batch_size: int) -> tuple[list, int]:
    """Images from single-image rows (see the module docstring); also the number of distinct candidates."""
    rows = torch.nonzero(readable & (db.abs() > 0)).flatten()
    if len(rows) == 0:
        return [], 0
    if len(rows) > 1:
        rows = rows[db[rows].abs() > 1e-6 * db[rows].abs().max()]
    groups: list[list[int]] = []
    for k in rows[torch.argsort(db[rows])].tolist():
        for group in groups:
            first = group[0]
            if abs(db[k] - db[first]) <= TOL * abs(db[first]) and \
                    (dw[k] - dw[first]).abs().max() <= TOL * dw[first].abs().max():
                group.append(k)
                break
        else:
            groups.append([k])
    heads = torch.tensor([g[0] for g in groups])
    gw, gb = dw[heads], db[heads]
    single = [i for i in range(len(groups)) if not _is_pair_sum(i, gw, gb)]
    images = {i: gw[i] / gb[i] for i in single}
    inside = {i: bool(((images[i] >= -0.01) & (images[i] <= 1.01)).all()) for i in single}
    ranked = sorted(single, key=lambda i: (not inside[i], -len(groups[i])))
    return [images[i] for i in ranked[:batch_size]], len(groups)


def _is_pair_sum(i: int, gw: torch.Tensor, gb: torch.Tensor) -> bool:
    """Whether group i's gradients are those of two other groups together (a row that two images fired)."""
    sums = gb[:, None] + gb[None, :]
    close = (sums - gb[i]).abs() <= TOL * gb[i].abs()
    close[i, :] = False
    close[:, i] = False
    close.fill_diagonal_(False)
    scale = gw[i].abs().max()
    for u, w in torch.nonzero(close).tolist():
        if u < w and (gw[u] + gw[w] - gw[i]).abs().max() <= TOL * scale:
            return True
    return False


@ATTACKS.register("trap-weights", "trap weights (malicious server): a first layer whose rows each fire for few "
                                  "images; single images as weight / bias gradient of rows one image fired")
class TrapWeights(Attack):
    """Boenisch et al.'s trap weights in a block prepended to the attacked client's model (malicious server)."""

    family = "image"
    threat_model = "malicious-model"
    links = {"paper": "https://arxiv.org/abs/2112.02918", "code": "https://github.com/JonasGeiping/breaching"}

    def __init__(self, rows: int = 0, per_image: int = 8, scale: float = 0.0, sigma: float = 0.5,
                 seed: int = 0) -> None:
        if rows < 0 or per_image < 1 or scale < 0 or not sigma > 0:
            raise ValueError(f"rows must be >= 0 (0: per_image rows per image of the batch), per_image >= 1, "
                             f"scale >= 0 (0: calibrated) and sigma > 0, got rows={rows}, per_image={per_image}, "
                             f"scale={scale}, sigma={sigma}")
        super().__init__(rows=rows, per_image=per_image, scale=scale, sigma=sigma, seed=seed)
        self.rows, self.per_image, self.scale, self.sigma, self.seed = rows, per_image, scale, sigma, seed

    def applicable(self, setting: Setting) -> str | None:
        return image_model_applicable(setting) or super().applicable(setting)

    def modify_model(self, model: torch.nn.Module, knowledge: Knowledge) -> torch.nn.Module:
        rows = block_rows(knowledge, self.per_image, self.rows)
        negative, positive = trap_halves(rows, math.prod(knowledge.input_shape), self.sigma, self.seed)
        scale = self.scale or calibrated_scale(negative, positive, knowledge.public_x, 1.0 / knowledge.batch_size)
        return prepend(model, knowledge, negative + scale * positive, torch.zeros(rows))

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        return block_blocked(view, knowledge, whole=True)

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        dw, db = block_gradients(view, knowledge)
        images, candidates = trap_read(dw, db, readable_rows(view, whole=True), knowledge.batch_size)
        return Reconstruction(images=as_batch(images, knowledge),
                              extra={"candidates": candidates, "rows": int(db.numel()), "recovered_rows": len(images),
                                     **exposure(view, whole=True)})
