"""Image-reconstruction metrics: PSNR, SSIM and LPIPS after one-to-one matching.

Gradient-inversion attacks return a batch in arbitrary order, so each reconstruction is first paired with a
ground-truth image by Hungarian assignment (scipy `linear_sum_assignment`) on a pairwise distance matrix, as
breaching does. Inputs are float tensors of shape (B, C, H, W), C in {1, 3}, meant to lie in [0, 1]; both
sides are clamped to [0, 1] and non-finite pixels are mapped to 0 (NaN) or the range ends (+-inf), so a
diverged reconstruction scores badly instead of crashing the scorer.

Conventions, chosen to be explicit:
- PSNR: per image 10*log10(1/MSE) with data range 1, capped at `PSNR_CAP` = 100 dB (a perfect copy would
  otherwise be inf, as in breaching), then the mean over images.
- SSIM: standard single-scale SSIM (Wang et al. 2004; skimage, uniform window), NOT breaching's CW-SSIM.
  win_size = largest odd number <= min(7, H, W), so 8x8 digits use a 7x7 window.
- LPIPS: AlexNet backbone, v0.1 lin layers, inputs mapped [0,1] -> [-1,1] (lpips' normalize=True, breaching's
  convention). Grayscale is replicated to 3 channels. AlexNet's pooling needs spatial size, so images whose
  shorter side is below 64 px are bilinearly upsampled until it is 64 px (square images -> 64x64); values for
  32x32 CIFAR therefore differ from LPIPS computed at native resolution.
- Unequal batch sizes: only min(len(rec), len(truth)) pairs are matched and scored; the surplus images on the
  longer side are ignored.
- Recovered: the fraction of the ground-truth batch whose matched reconstruction reaches `RECOVERED_DB` = 30 dB
  PSNR (a truth image left unmatched is not recovered), a count that a mean PSNR hides when an attack gives
  some images back exactly and others not at all.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from metrics.lpips_alex import LpipsUnavailable, load_lpips_alex

__all__ = [
    "PSNR_CAP",
    "LPIPS_MIN_SIDE",
    "LpipsUnavailable",
    "pairwise_distances",
    "match_images",
    "psnr",
    "ssim",
    "lpips_distance",
    "score_images",
    "RECOVERED_DB",
]

PSNR_CAP = 100.0
RECOVERED_DB = 30.0
LPIPS_MIN_SIDE = 64


# ---------------------------------------------------------------- input handling

def _prep(x, name: str) -> torch.Tensor:
    x = torch.as_tensor(x).detach()
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"{name} must have shape (B, C, H, W) with C in (1, 3), got {tuple(x.shape)}")
    if not x.is_floating_point():  # uint8 0..255 would be silently clamped to {0, 1}
        raise ValueError(f"{name} must be a float tensor in [0, 1], got dtype {x.dtype}")
    x = x.to(device="cpu", dtype=torch.float32)
    return torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0).clamp_(0.0, 1.0)


def _prep_pair(rec, truth, *, aligned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rec, truth = _prep(rec, "rec"), _prep(truth, "truth")
    if rec.shape[1:] != truth.shape[1:]:
        raise ValueError(f"rec images {tuple(rec.shape[1:])} and truth images {tuple(truth.shape[1:])} differ")
    if aligned and len(rec) != len(truth):
        raise ValueError(f"aligned metrics need equal batch sizes, got {len(rec)} and {len(truth)}")
    if len(rec) == 0 or len(truth) == 0:
        raise ValueError("empty batch")
    return rec, truth


# ---------------------------------------------------------------- distances

def _mse_matrix(rec: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """(len(truth), len(rec)) per-pixel mean squared error, computed without the |a|^2+|b|^2-2ab shortcut."""
    t, r = truth.flatten(1).double(), rec.flatten(1).double()
    d = torch.cdist(t, r, compute_mode="donot_use_mm_for_euclid_dist")
    return (d * d / t.shape[1]).float()


def _lpips_input(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    h, w = x.shape[-2:]
    if min(h, w) < LPIPS_MIN_SIDE:
        s = LPIPS_MIN_SIDE / min(h, w)
        size = (max(LPIPS_MIN_SIDE, round(h * s)), max(LPIPS_MIN_SIDE, round(w * s)))
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return 2.0 * x - 1.0  # lpips' normalize=True


def _lpips_features(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Unit-normalised backbone activations, one tensor per LPIPS layer, each image passed through the net once."""
    outs = model.net(model.scaling_layer(_lpips_input(x)))
    return [o / (o.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10) for o in outs]  # lpips.normalize_tensor


def _lin_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [lin.model[-1].weight.flatten() for lin in model.lins]  # (1, C, 1, 1) 1x1 convs -> (C,)


def _lpips_cross(model: torch.nn.Module, ft: list[torch.Tensor], fr: list[torch.Tensor]) -> torch.Tensor:
    """(n_truth, n_rec) LPIPS for all pairs from precomputed features: one float64 GEMM per layer.

    Expands mean_hw sum_c w_c (a_c - b_c)^2 = A_i + B_j - 2 <w a_i, b_j> / HW; in float64 this agrees with
    lpips' own forward to ~1e-12, which is ample for ranking. Reported values use `_lpips_pairs` instead.
    """
    out = torch.zeros(len(ft[0]), len(fr[0]), dtype=torch.float64)
    for a, b, w in zip(ft, fr, _lin_weights(model)):
        hw = a.shape[2] * a.shape[3]
        a, b, w = a.double().flatten(2), b.double().flatten(2), w.double()[None, :, None]
        sq_a = (w * a * a).sum(dim=(1, 2)) / hw
        sq_b = (w * b * b).sum(dim=(1, 2)) / hw
        out += sq_a[:, None] + sq_b[None, :] - 2.0 * ((w * a).flatten(1) @ b.flatten(1).T) / hw
    return out.clamp_min_(0.0)


def _lpips_pairs(model: torch.nn.Module, ft: list[torch.Tensor], fr: list[torch.Tensor]) -> torch.Tensor:
    """LPIPS of aligned pairs (ft[k][i], fr[k][i]), with the same arithmetic as `LPIPS.forward`."""
    out = torch.zeros(len(ft[0]), dtype=torch.float64)
    for a, b, w in zip(ft, fr, _lin_weights(model)):
        out += ((a - b).pow(2) * w[None, :, None, None]).sum(dim=1).mean(dim=(1, 2)).double()
    return out


def pairwise_distances(rec, truth, distance: str = "lpips") -> torch.Tensor:
    """Matrix D with D[i, j] = distance(truth[i], rec[j]); "lpips" may raise `LpipsUnavailable`."""
    rec, truth = _prep_pair(rec, truth, aligned=False)
    with torch.no_grad():
        if distance == "mse":
            return _mse_matrix(rec, truth)
        if distance == "lpips":
            model = load_lpips_alex()
            feats = _lpips_features(model, torch.cat([truth, rec]))
            n = len(truth)
            return _lpips_cross(model, [f[:n] for f in feats], [f[n:] for f in feats]).float()
    raise ValueError(f"distance must be 'lpips' or 'mse', got {distance!r}")


def _assign(dist: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Hungarian assignment on a (truth, rec) cost matrix -> (truth_idx, rec_idx), min(shape) pairs."""
    from scipy.optimize import linear_sum_assignment   # scipy and skimage load where used: every command loads metrics

    cost = dist.double().numpy()
    cost = np.where(np.isfinite(cost), cost, np.finfo(np.float64).max / (cost.size + 1))
    return linear_sum_assignment(cost)


# ---------------------------------------------------------------- public metrics

def match_images(rec, truth, distance: str = "lpips") -> torch.Tensor:
    """Permutation `perm` (length len(truth)) such that rec[perm[i]] is the reconstruction matched to truth[i].

    Minimises the summed pairwise `distance` ("lpips" or "mse"). Extra reconstructions are left out. If there
    are fewer reconstructions than truths, only len(rec) truths are matched and the others get perm[i] = -1.
    """
    dist = pairwise_distances(rec, truth, distance)
    t_idx, r_idx = _assign(dist)
    perm = torch.full((dist.shape[0],), -1, dtype=torch.long)
    perm[torch.as_tensor(t_idx, dtype=torch.long)] = torch.as_tensor(r_idx, dtype=torch.long)
    return perm


def _psnr_values(rec: torch.Tensor, truth: torch.Tensor) -> np.ndarray:
    mse = (rec.double() - truth.double()).pow(2).flatten(1).mean(dim=1).numpy()
    with np.errstate(divide="ignore"):
        values = 10.0 * np.log10(1.0 / mse)
    return np.minimum(values, PSNR_CAP)


def psnr(rec, truth) -> float:
    """Mean over images of per-image PSNR (dB, data range 1), each capped at `PSNR_CAP`; inputs already aligned."""
    rec, truth = _prep_pair(rec, truth, aligned=True)
    return float(_psnr_values(rec, truth).mean())


def _ssim_win(h: int, w: int) -> int:
    win = min(7, h, w)
    return win if win % 2 == 1 else win - 1


def _ssim_values(rec: torch.Tensor, truth: torch.Tensor) -> np.ndarray:
    from skimage.metrics import structural_similarity

    h, w = rec.shape[-2:]
    win = _ssim_win(h, w)
    if win < 3:
        raise ValueError(f"images of {h}x{w} px are too small for SSIM (need at least 3x3)")
    r = rec.double().permute(0, 2, 3, 1).numpy()  # (B, H, W, C)
    t = truth.double().permute(0, 2, 3, 1).numpy()
    rgb = rec.shape[1] == 3
    out = []
    for ri, ti in zip(r, t):
        if rgb:
            out.append(structural_similarity(ti, ri, data_range=1.0, win_size=win, channel_axis=-1))
        else:
            out.append(structural_similarity(ti[..., 0], ri[..., 0], data_range=1.0, win_size=win))
    return np.asarray(out, dtype=np.float64)


def ssim(rec, truth) -> float:
    """Mean over images of standard SSIM (skimage, data range 1, odd window <= 7); inputs already aligned."""
    rec, truth = _prep_pair(rec, truth, aligned=True)
    return float(_ssim_values(rec, truth).mean())


def lpips_distance(rec, truth) -> float:
    """Mean LPIPS(alex, v0.1) over aligned pairs; raises `LpipsUnavailable` if the real weights cannot load."""
    rec, truth = _prep_pair(rec, truth, aligned=True)
    model = load_lpips_alex()
    with torch.no_grad():  # lpips' own forward: the reference that `_lpips_cross` and `_lpips_pairs` reproduce
        values = model(_lpips_input(rec), _lpips_input(truth), normalize=False)
    return float(values.double().mean())


def score_images(rec, truth) -> dict[str, float | str]:
    """Match one-to-one (on LPIPS, or on MSE if LPIPS is unavailable), then score the matched pairs.

    Returns {"psnr", "ssim", "lpips", "match_on", "recovered"}; "lpips" is the string "unavailable: <reason>" when the real
    weights cannot be loaded (PSNR/SSIM are still computed). The distance matrix is computed once.
    """
    rec, truth = _prep_pair(rec, truth, aligned=False)
    with torch.no_grad():
        try:
            model = load_lpips_alex()
        except LpipsUnavailable as exc:
            model, reason = None, str(exc)
        if model is not None:
            feats = _lpips_features(model, torch.cat([truth, rec]))  # every image through the net once
            ft, fr = [f[: len(truth)] for f in feats], [f[len(truth):] for f in feats]
            dist, match_on = _lpips_cross(model, ft, fr), "lpips"
        else:
            dist, match_on = _mse_matrix(rec, truth), "mse"
        t_idx, r_idx = _assign(dist)
        t_sel = torch.as_tensor(t_idx, dtype=torch.long)
        r_sel = torch.as_tensor(r_idx, dtype=torch.long)
        lpips_value: float | str = f"unavailable: {reason}" if model is None else float(
            _lpips_pairs(model, [f[t_sel] for f in ft], [f[r_sel] for f in fr]).mean()
        )
    rec_m, truth_m = rec[r_sel], truth[t_sel]
    each = _psnr_values(rec_m, truth_m)
    return {
        "psnr": float(each.mean()),
        "ssim": float(_ssim_values(rec_m, truth_m).mean()),
        "lpips": lpips_value,
        "match_on": match_on,
        "recovered": float((each >= RECOVERED_DB).sum() / len(truth)),
    }
