"""Retake the README's picture of the front page: what a reader sees on opening it, 1440 x 900 in headless
Chromium (the summary of the standard evaluation), stored as a small palette PNG.

    python docs/screenshot.py leaderboards/results/index.html docs/front-page-summary.png   (make screenshot)

Run it after the front page is regenerated (`leakbench site leaderboards/results`). Needs chromium on PATH
(Debian: apt-get install chromium) and Pillow (installed with matplotlib).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WINDOW = "1440,900"
COLORS = 64   # the page's few flat colours and anti-aliased text read fine in a 64-colour palette


def take(page: Path, out: Path) -> Path:
    """Screenshot `page` with headless Chromium into `out`, quantized to a palette PNG."""
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("screenshot: no chromium on PATH; as root: apt-get install chromium")
    if not page.is_file():
        raise SystemExit(f"screenshot: {page} does not exist; build it first: leakbench site leaderboards/results")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        f"--screenshot={raw}", f"--window-size={WINDOW}", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
        image = Image.open(raw).convert("RGB")
        out.parent.mkdir(parents=True, exist_ok=True)
        image.quantize(COLORS, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python docs/screenshot.py FRONT_PAGE.html OUT.png")
    path = take(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"screenshot: {path} ({path.stat().st_size // 1000} kB)")
