"""What a stored result was computed with: the package version and a fingerprint of the code.

The fingerprint hashes the source of every package that can change a number (harness,
defenses, attacks, metrics); the leaderboard renderer is left out, since re-rendering
never changes a result. A stored cell whose fingerprint differs from the running code's is
stale: `leakbench run` recomputes it instead of reusing it.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the folder holding bench/, defenses/, attacks/, metrics/
RESULT_PACKAGES = ("bench", "defenses", "attacks", "metrics")


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("leakbench")
    except PackageNotFoundError:  # run from a checkout without installing
        return "0+checkout"


@functools.lru_cache(maxsize=None)
def code_fingerprint(root: str = str(ROOT)) -> str:
    """sha256 over (relative path, content) of every .py file of the result packages, 16 hex digits."""
    digest = hashlib.sha256()
    for package in RESULT_PACKAGES:
        for path in sorted(Path(root, package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
