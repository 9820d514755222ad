"""Privacy accounting for user-level DP: one RDP ledger per run, and noise calibration.

The ledger is the single source of the noise multiplier a mechanism may use, and it is
stepped once per released aggregate with the user-level sampling rate q = sampled
clients / total clients (not a record-level batch/data rate). It wraps Opacus'
RDPAccountant (Poisson subsampled Gaussian, add/remove-one adjacency); a run that
samples a fixed number of clients without replacement is accounted as Poisson sampling
at the same rate. Both facts are part of what `describe` records.

Calibrating a noise multiplier for a target epsilon is a bisection that takes seconds,
so results are cached in-process and in a small JSON file in the user cache. Opacus is imported
where a ledger is first used: importing it costs seconds (it pulls in torch.distributed), and loading
the registry (`leakbench list`, a dry run) imports this module without accounting anything.
"""
from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

ACCOUNTANT = "rdp"
# bisection stops within this fraction of the target epsilon, always on the private side
RELATIVE_TOLERANCE = 1e-3


def cache_file() -> Path:
    """Where calibrated noise multipliers persist between processes."""
    root = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    return root / "leakbench" / "noise.json"


class RdpLedger:
    """Privacy spent by a subsampled Gaussian mechanism released once per round."""

    def __init__(self, noise_multiplier: float, sample_rate: float) -> None:
        if not noise_multiplier > 0 or not math.isfinite(noise_multiplier):
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        from opacus.accountants import RDPAccountant

        self._accountant = RDPAccountant()

    def step(self) -> None:
        """Account one release of the mechanism (one round's aggregate)."""
        self._accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(noise multiplier, sample rate, steps) runs as the accountant recorded them."""
        return list(self._accountant.history)

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self._accountant.history)

    def epsilon(self, delta: float) -> float:
        """Epsilon spent so far at `delta`; 0 before the first step."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        return float(self._accountant.get_epsilon(delta=delta)) if self.steps else 0.0

    def describe(self, delta: float, sampling: str) -> dict[str, Any]:
        """What an epsilon means: accountant, the run's sampling against the bound's, adjacency, the inputs."""
        import opacus

        return {"accountant": f"opacus {opacus.__version__} {ACCOUNTANT}",
                "sampling": "Poisson at rate q" if sampling == "poisson"
                else f"{sampling} clients per round, accounted as Poisson at rate q",
                "adjacency": "add/remove one client (user-level)",
                "sample_rate": self.sample_rate, "steps": self.steps, "delta": delta,
                "noise_multiplier": self.noise_multiplier}


def noise_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    """Smallest noise multiplier (up to the bisection tolerance) spending at most target_epsilon in `rounds` steps."""
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon}")
    if not 0 < delta < 1 or not 0 < sample_rate <= 1 or rounds < 1:
        raise ValueError(f"need delta in (0, 1), sample_rate in (0, 1] and rounds >= 1; "
                         f"got {delta}, {sample_rate}, {rounds}")
    return _cached(float(target_epsilon), float(delta), float(sample_rate), int(rounds))


@functools.lru_cache(maxsize=64)
def _cached(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    import opacus
    from opacus.accountants.utils import get_noise_multiplier

    key = json.dumps([ACCOUNTANT, opacus.__version__, RELATIVE_TOLERANCE, target_epsilon, delta, sample_rate,
                      rounds])
    path = cache_file()
    stored = _read(path)
    if key in stored:
        return float(stored[key])
    # steps=, not epochs=: Opacus turns epochs into epochs/q steps, and each round is one step
    with warnings.catch_warnings():   # bisection probes of tiny noise hit the largest RDP order; not the answer
        warnings.simplefilter("ignore", UserWarning)
        z = float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                       steps=rounds, accountant=ACCOUNTANT,
                                       epsilon_tolerance=RELATIVE_TOLERANCE * target_epsilon))
    _write(path, _read(path) | {key: z})
    return z


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: Path, data: dict[str, float]) -> None:
    """Atomic replace, so concurrent runs never read a half-written file; a lost entry is only recomputed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".noise-", suffix=".json")
    except OSError:
        return   # a read-only cache only costs time
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
