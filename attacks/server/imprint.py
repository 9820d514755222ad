"""Robbing the Fed (Fowl, Geiping, Czaja, Goldblum, Goldstein, ICLR 2022): the imprint block.

Every row of the block computes the same linear function of the input, h(x) = <q, x> (the mean brightness,
or a fixed random direction), against increasing thresholds t_0 < ... < t_{K-1}: row k fires for the images
with h(x) > t_k (cumulative bins). Row k minus row k+1 leaves the images with h in (t_k, t_{k+1}]; where
that bin holds one image, the weight-gradient difference over the bias-gradient difference is that image,
exactly. The thresholds sit at quantiles of h over public inputs of the task (knowledge.public_x), so each
bin holds about B/K of the batch; with K = 8 B about e^(-1/8), 88 %, of the images are alone in their bin.

The default query is a random direction: digits' brightness takes few values (64 pixels of 17 levels), so
two images of a batch often tie on it and share a bin; CIFAR's does not.

Compared with breaching (cases/malicious_modifications/imprint.py ImprintBlock, attacks/analytic_attack.py
ImprintAttacker): the same cumulative bins and readout (row differences, then weight over bias gradient),
except that breaching differences each row with the one below and keeps the first row as it is (the whole
batch's weighted mean, one wasted slot), so it never reads the top bin alone, which we do. Breaching puts
the thresholds at quantiles of a standard normal (a Laplace for its DCT query) because its data are
normalized to zero mean and unit variance, we at empirical quantiles of the query on public inputs in
[0, 1]. Its default connection back to the image is a linear layer (the addition is an option), ours the
addition. Both pad a batch with fewer hits than images with zeros; with more hits than images (noise)
breaching keeps the smallest mean weight gradients or bias gradients, we the largest bias-gradient
differences (the rows that carry a sample's signal rather than noise alone).
"""
from __future__ import annotations

import math

import torch

from attacks.server.block import (BIAS, as_batch, block_blocked, block_gradients, block_rows, exposure, image_model_applicable,
                                  prepend, readable_rows)
from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.view import Knowledge, ServerView
from bench.registry import ATTACKS

QUERIES = ("random", "mean")


def query_direction(kind: str, size: int, seed: int) -> torch.Tensor:
    """q of h(x) = <q, x>: the mean over pixels, or a seeded random unit direction."""
    if kind == "mean":
        return torch.full((size,), 1.0 / size, dtype=torch.float64)
    q = torch.randn(size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return q / q.norm()


def thresholds(q: torch.Tensor, rows: int, public: torch.Tensor | None) -> torch.Tensor:
    """t_0 below every input, then the 1/K, ..., (K-1)/K quantiles of h over the public inputs (without them:
    evenly over h's range on the data box [0, 1])."""
    if public is not None and len(public) > 1:
        h = public.flatten(1).double() @ q
        inner = torch.quantile(h, torch.arange(1, rows, dtype=torch.float64) / rows)
        low = h.min() - (h.max() - h.min()) - 1.0
    else:
        lo, hi = float(q.clamp(max=0).sum()), float(q.clamp(min=0).sum())
        inner = torch.linspace(lo, hi, rows + 1, dtype=torch.float64)[1:-1]
        low = torch.tensor(lo - 1.0, dtype=torch.float64)
    return torch.cat([low.reshape(1), inner])


def imprint_read(dw: torch.Tensor, db: torch.Tensor, bias: torch.Tensor, readable: torch.Tensor,
                 batch_size: int) -> tuple[list[torch.Tensor], int]:
    """Images of the bins one image fell in: (weight difference / bias difference) of neighbouring rows, the
    rows ordered by threshold; at most `batch_size`, those with the largest bias differences. Also the hits.
    A bin needs both rows' bias gradients (`readable`); a pixel hidden in either row stays NaN."""
    order = torch.argsort(-bias.double())             # threshold t_k = -b_k, ascending
    dw, db, ok = dw[order], db[order], readable[order]
    bin_w = dw - torch.cat([dw[1:], torch.zeros_like(dw[:1])])
    bin_b = db - torch.cat([db[1:], torch.zeros_like(db[:1])])
    ok = ok & torch.cat([ok[1:], torch.ones_like(ok[:1])])
    size = torch.where(ok, bin_b.abs(), torch.zeros_like(bin_b))
    if not bool((size > 0).any()):
        return [], 0
    hit = size > 1e-6 * size.max()
    picked = torch.nonzero(hit).flatten()
    picked = picked[torch.argsort(-size[picked])][:batch_size]
    return [bin_w[k] / bin_b[k] for k in picked], int(hit.sum())


@ATTACKS.register("imprint", "Robbing the Fed's imprint block (malicious server): cumulative bins over a linear "
                             "query, single images as weight / bias gradient differences")
class Imprint(Attack):
    """Robbing the Fed's imprint block, prepended to the attacked client's model (malicious server)."""

    family = "image"
    threat_model = "malicious-model"
    links = {"paper": "https://arxiv.org/abs/2110.13057", "code": "https://github.com/JonasGeiping/breaching"}

    def __init__(self, bins: int = 0, per_image: int = 8, query: str = "random", seed: int = 0) -> None:
        if bins < 0 or per_image < 1:
            raise ValueError(f"bins must be >= 0 (0: per_image bins per image of the batch) and per_image >= 1, "
                             f"got bins={bins}, per_image={per_image}")
        if query not in QUERIES:
            raise ValueError(f"query '{query}' must be one of {', '.join(QUERIES)}")
        super().__init__(bins=bins, per_image=per_image, query=query, seed=seed)
        self.bins, self.per_image, self.query, self.seed = bins, per_image, query, seed

    def applicable(self, setting: Setting) -> str | None:
        return image_model_applicable(setting) or super().applicable(setting)

    def modify_model(self, model: torch.nn.Module, knowledge: Knowledge) -> torch.nn.Module:
        rows = block_rows(knowledge, self.per_image, self.bins)
        q = query_direction(self.query, math.prod(knowledge.input_shape), self.seed)
        t = thresholds(q, rows, knowledge.public_x)
        return prepend(model, knowledge, q.float().expand(rows, -1).clone(), (-t).float())

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        return block_blocked(view, knowledge, whole=False)

    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        dw, db = block_gradients(view, knowledge)
        images, hits = imprint_read(dw, db, knowledge.global_params[BIAS], readable_rows(view, whole=False),
                                      knowledge.batch_size)
        return Reconstruction(images=as_batch(images, knowledge),
                              extra={"hits": hits, "rows": int(db.numel()), "recovered_rows": len(images),
                                     **exposure(view, whole=False)})
