"""Image metrics: conventions (caps, windows, matching) and proof that LPIPS runs on the real AlexNet weights."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from skimage import data
from skimage.filters import gaussian
from skimage.metrics import structural_similarity

from metrics import images as im
from metrics import lpips_alex
from metrics.lpips_alex import LpipsUnavailable, load_lpips_alex


@pytest.fixture(scope="module")
def astronaut() -> torch.Tensor:
    img = torch.from_numpy(data.astronaut()).permute(2, 0, 1)[None].float() / 255.0
    return F.interpolate(img, size=(64, 64), mode="bilinear", antialias=True, align_corners=False)


@pytest.fixture(scope="module")
def blurred(astronaut) -> torch.Tensor:
    hwc = gaussian(astronaut[0].permute(1, 2, 0).numpy(), sigma=0.7, channel_axis=-1)
    return torch.from_numpy(hwc).permute(2, 0, 1)[None].float()


@pytest.fixture(scope="module")
def noise() -> torch.Tensor:
    return torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def _batch(n: int, c: int, hw: int, seed: int) -> torch.Tensor:
    """Distinct smooth-ish images, so every pair is clearly different."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, c, 4, 4, generator=g)
    return F.interpolate(coarse, size=(hw, hw), mode="bilinear", align_corners=False)


# ---------------------------------------------------------------- PSNR / SSIM conventions

@pytest.mark.parametrize("shape", [(3, 3, 64, 64), (5, 1, 8, 8)])
def test_identical_images_are_perfect(shape):
    x = _batch(shape[0], shape[1], shape[2], seed=1)
    s = im.score_images(x, x)
    assert s["psnr"] == im.PSNR_CAP == 100.0
    assert s["ssim"] == pytest.approx(1.0, abs=1e-12)
    assert s["lpips"] == pytest.approx(0.0, abs=1e-7)
    assert s["match_on"] == "lpips"
    assert im.lpips_distance(x, x) == pytest.approx(0.0, abs=1e-7)


def test_known_mse_gives_known_psnr():
    truth = torch.full((2, 1, 8, 8), 0.5)
    rec = truth.clone()
    rec[0] += 0.1  # MSE 1e-2 -> 20 dB
    rec[1] += 0.01  # MSE 1e-4 -> 40 dB
    assert im.psnr(rec[:1], truth[:1]) == pytest.approx(20.0, abs=1e-5)
    assert im.psnr(rec, truth) == pytest.approx(30.0, abs=1e-4)  # mean of per-image PSNR, not PSNR of mean MSE


def test_psnr_clamps_reconstruction_and_caps():
    truth = torch.ones(1, 3, 8, 8)
    assert im.psnr(truth + 0.5, truth) == 100.0  # out-of-range pixels clamped to 1
    rec = truth.clone()
    rec[0, 0, 0, 0] = float("nan")  # diverged pixel counts as 0, no crash
    assert math.isfinite(im.psnr(rec, truth)) and im.psnr(rec, truth) < 100.0


def test_ssim_window_and_variant():
    x, y = _batch(2, 1, 8, seed=2), _batch(2, 1, 8, seed=3)
    expected = np.mean([
        structural_similarity(x[i, 0].double().numpy(), y[i, 0].double().numpy(), data_range=1.0, win_size=7)
        for i in range(2)
    ])
    assert im.ssim(y, x) == pytest.approx(expected, abs=1e-12)
    assert im._ssim_win(8, 8) == 7 and im._ssim_win(6, 6) == 5 and im._ssim_win(4, 5) == 3


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        im.psnr(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError):
        im.psnr(torch.zeros(2, 3, 8, 8), torch.zeros(3, 3, 8, 8))
    with pytest.raises(ValueError):
        im.match_images(torch.zeros(2, 3, 8, 8), torch.zeros(2, 3, 8, 8), distance="l1")


# ---------------------------------------------------------------- matching

def test_permuted_batch_is_matched_back():
    truth = _batch(16, 3, 32, seed=4)
    rec = (truth + 0.05 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(5))).clamp(0, 1)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(6))
    for distance in ("lpips", "mse"):
        assert torch.equal(im.match_images(rec[perm], truth, distance), torch.argsort(perm))
    assert im.score_images(rec[perm], truth) == im.score_images(rec, truth)
    # matched LPIPS equals lpips' own forward on the aligned pairs
    assert im.score_images(rec, truth)["lpips"] == pytest.approx(im.lpips_distance(rec, truth), rel=1e-5)


@settings(max_examples=20, deadline=None)
@given(st.permutations(list(range(6))))
def test_mse_matching_recovers_any_order(order):
    truth = _batch(6, 1, 8, seed=7)
    perm = torch.tensor(order)
    assert torch.equal(im.match_images(truth[perm], truth, "mse"), torch.argsort(perm))


def test_unequal_batch_sizes_match_min_len():
    truth = _batch(4, 3, 16, seed=8)
    extra = torch.cat([truth.flip(0), _batch(2, 3, 16, seed=9)])  # 6 reconstructions, 4 truths
    assert im.match_images(extra, truth, "mse").tolist() == [3, 2, 1, 0]
    short = im.match_images(truth[[2, 0]], truth, "mse")  # 2 reconstructions, 4 truths
    assert short.tolist() == [1, -1, 0, -1]
    assert im.score_images(extra, truth)["psnr"] == 100.0


def test_recovered_counts_the_batch_images_matched_at_30_db():
    """images_recovered: of the whole truth batch, the images whose matched reconstruction reaches 30 dB; a truth
    left unmatched (fewer reconstructions) counts as not recovered, so the mean PSNR of the matched pairs alone
    cannot hide it."""
    truth = _batch(4, 3, 16, seed=12)
    close = (truth[1] + 0.01).clamp(0, 1)            # 40 dB at most
    far = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(5))
    rec = torch.stack([truth[0], close, far, truth[3]])
    assert im.score_images(rec, truth)["recovered"] == pytest.approx(3 / 4)
    assert im.score_images(truth[[0, 3]], truth)["recovered"] == pytest.approx(2 / 4)
    assert im.score_images(truth, truth)["recovered"] == 1.0


def test_batch_recovered_is_one_only_when_every_image_of_the_batch_is():
    """batch_recovered: 1 for a batch whose every image reaches 30 dB, 0 for one image short (3 of 4 at 30 dB, or a
    truth left unmatched), so its mean over the attacked batches is the share of batches recovered whole."""
    from bench.protocol.attack import Reconstruction
    from bench.protocol.evidence import Evidence, Truth
    from metrics.vision import batch_recovered, images_recovered

    truth = _batch(4, 3, 16, seed=12)
    far = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(5))

    def scored(images):
        ev = Evidence(Reconstruction(images=images), Truth(truth, torch.zeros(4), {}))
        return batch_recovered(ev), images_recovered(ev)
    assert scored(truth.flip(0)) == (1.0, 1.0)
    assert scored(torch.stack([truth[0], truth[1], far, truth[3]])) == (0.0, pytest.approx(3 / 4))
    assert scored(truth[:3]) == (0.0, pytest.approx(3 / 4))


def test_lpips_matrix_agrees_with_lpips_forward():
    truth, rec = _batch(5, 3, 32, seed=10), _batch(4, 3, 32, seed=11)
    dist = im.pairwise_distances(rec, truth, "lpips")
    assert dist.shape == (5, 4)
    ti, rj = torch.meshgrid(torch.arange(5), torch.arange(4), indexing="ij")
    with torch.no_grad():  # lpips' own forward over all 20 pairs at once
        ref = load_lpips_alex()(im._lpips_input(rec[rj.flatten()]), im._lpips_input(truth[ti.flatten()]))
    torch.testing.assert_close(dist, ref.reshape(5, 4), atol=1e-5, rtol=0)
    assert im.lpips_distance(rec[:4], truth[:4]) == pytest.approx(dist.diagonal().mean().item(), abs=1e-5)


# ---------------------------------------------------------------- LPIPS is the real network

def test_loaded_weights_come_from_the_checkpoint():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_lpips_alex.cache_clear()
    model = load_lpips_alex()
    assert torch.equal(torch.rand(3), expected)  # loading leaves the global RNG stream alone
    assert model is load_lpips_alex() and not model.training
    with open(lpips_alex.default_ckpt_path(), "rb") as fh:
        params = pickle.load(fh)
    kernel = params["AlexNet_0"]["Conv_0"]["kernel"]  # HWIO
    assert torch.equal(model.net.slice1[0].weight, torch.from_numpy(kernel.transpose(3, 2, 0, 1).copy()))


def test_lpips_behaves_like_a_perceptual_metric(astronaut, blurred, noise):
    same = im.lpips_distance(astronaut, astronaut)
    blur = im.lpips_distance(blurred, astronaut)
    rand = im.lpips_distance(noise, astronaut)
    assert same == 0.0
    assert 0.02 < blur < 0.2
    assert rand > 0.4


def test_random_backbone_gives_different_values(astronaut, blurred, noise):
    import lpips

    torch.manual_seed(0)
    with warnings.catch_warnings():  # torchvision's 'pretrained' deprecation inside lpips
        warnings.simplefilter("ignore")
        random_net = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False).eval()
    with torch.no_grad():
        for x in (blurred, noise):
            real = im.lpips_distance(x, astronaut)
            unloaded = random_net(x, astronaut, normalize=True).item()
            assert abs(real - unloaded) > 0.5 * real


# ---------------------------------------------------------------- unavailable weights

def test_missing_weights_reported_not_faked(monkeypatch, tmp_path):
    missing = tmp_path / "alexnet.ckpt"
    monkeypatch.setattr(lpips_alex, "default_ckpt_path", lambda: missing)
    with pytest.raises(LpipsUnavailable, match="not found"):
        load_lpips_alex()
    truth = _batch(4, 3, 16, seed=12)
    perm = torch.tensor([2, 0, 3, 1])
    s = im.score_images(truth[perm], truth)
    assert s["lpips"].startswith("unavailable: ") and str(missing) in s["lpips"]
    assert s["match_on"] == "mse" and s["psnr"] == 100.0 and s["ssim"] == pytest.approx(1.0)
    with pytest.raises(LpipsUnavailable):
        im.lpips_distance(truth, truth)
    with pytest.raises(LpipsUnavailable):
        im.match_images(truth, truth, "lpips")


def test_bad_checkpoints_are_rejected(tmp_path):
    with open(lpips_alex.default_ckpt_path(), "rb") as fh:
        params = pickle.load(fh)
    params["AlexNet_0"]["Conv_1"]["kernel"] = params["AlexNet_0"]["Conv_1"]["kernel"][:3]
    wrong_shape = tmp_path / "wrong_shape.ckpt"
    wrong_shape.write_bytes(pickle.dumps(params))
    with pytest.raises(LpipsUnavailable, match="shape mismatch"):
        load_lpips_alex(wrong_shape)

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a pickle")
    with pytest.raises(LpipsUnavailable, match="cannot read"):
        load_lpips_alex(garbage)

    hostile = tmp_path / "hostile.ckpt"
    hostile.write_bytes(pickle.dumps({"AlexNet_0": print}))
    with pytest.raises(LpipsUnavailable, match="unexpected object"):
        load_lpips_alex(hostile)
