"""A small PNG stored with an image-reconstruction cell: ground truth (top row) over the reconstruction
(bottom row), each reconstruction placed under the true image it matches best (Hungarian on MSE,
as the image metrics match before scoring), at most `limit` pairs, base64 so it lives in the record."""
from __future__ import annotations

import base64
import io

import numpy as np
import torch


def thumbnail(images: torch.Tensor, truth: torch.Tensor, limit: int = 8) -> str | None:
    if images is None or truth is None or images.dim() != 4 or truth.dim() != 4 or images.shape[1:] != truth.shape[1:]:
        return None
    from PIL import Image
    from scipy.optimize import linear_sum_assignment

    rec = images.detach().float().clamp(0, 1).cpu()
    true = truth.detach().float().clamp(0, 1).cpu()
    cost = ((true[:, None] - rec[None]) ** 2).flatten(2).mean(-1).numpy()
    t_idx, r_idx = linear_sum_assignment(cost)
    pairs = list(zip(t_idx, r_idx))[:limit]
    top = np.concatenate([true[t].permute(1, 2, 0).numpy() for t, _ in pairs], axis=1)
    bottom = np.concatenate([rec[r].permute(1, 2, 0).numpy() for _, r in pairs], axis=1)
    grid = (np.concatenate([top, bottom], axis=0) * 255).round().astype(np.uint8)
    image = Image.fromarray(grid[..., 0] if grid.shape[2] == 1 else grid)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode()
