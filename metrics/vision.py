"""Image-reconstruction metrics: PSNR, SSIM, LPIPS after one-to-one Hungarian matching."""
from __future__ import annotations

from bench.protocol.evidence import Evidence, metric


def _scores(ev: Evidence) -> dict | None:
    rec = ev.reconstruction
    if rec is None or rec.images is None or ev.truth is None:
        return None
    if "image_scores" not in rec.extra:  # one matching and one LPIPS pass serve all three metrics
        from metrics.images import score_images
        rec.extra["image_scores"] = score_images(rec.images, ev.truth.x)
    return rec.extra["image_scores"]


@metric("psnr", "dB", True, "privacy", "PSNR of the matched reconstruction (data range 1), mean over images",
        fmt="{:.2f}", display="PSNR")
def psnr(ev: Evidence):
    s = _scores(ev)
    return None if s is None else s["psnr"]


@metric("ssim", "", True, "privacy", "SSIM (scikit-image, window min(7, H, W)) of the matched reconstruction, mean over images", display="SSIM")
def ssim(ev: Evidence):
    s = _scores(ev)
    return None if s is None else s["ssim"]


@metric("lpips", "", False, "privacy", "LPIPS v0.1 AlexNet distance of the matched reconstruction (higher = less similar)", display="LPIPS")
def lpips(ev: Evidence):
    s = _scores(ev)
    return None if s is None else s["lpips"]


@metric("images_recovered", "", True, "privacy", "fraction of the batch's images whose matched reconstruction reaches "
        "30 dB PSNR", display="recovered")
def images_recovered(ev: Evidence):
    s = _scores(ev)
    return None if s is None else s["recovered"]


@metric("batch_recovered", "", True, "privacy", "1 when every image of the batch reaches 30 dB PSNR after matching, "
        "else 0: over the attacked batches, the share of batches recovered whole (an exact batch inversion reads "
        "about 100 dB)", display="batch recovered")
def batch_recovered(ev: Evidence):
    s = _scores(ev)
    return None if s is None else float(s["recovered"] >= 1.0)
