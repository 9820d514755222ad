"""Privacy accounting: RDP ledgers of subsampled Gaussian mechanisms, and noise calibration.

A ledger is the single source of the noise multiplier a mechanism may use. User-level DP-FedAvg keeps one per
run, stepped once per released aggregate with q = sampled clients / total clients; record-level DP-SGD keeps
one per client, stepped once per local step with q = batch / the client's data (`step(sample_rate)`). It wraps
Opacus' RDPAccountant (Poisson subsampled Gaussian, add/remove-one adjacency); a run that samples a fixed
number of clients, or shuffles a client's data into fixed batches, is accounted as Poisson sampling at the same
rate. `describe` records which.

Calibrating a noise multiplier for a target epsilon is a bisection that takes seconds,
so results are cached in-process and in a small JSON file in the user cache, keyed by the inputs, Opacus' version
and the source of this module (`CODE`), which computes them: an edit here never reads an older calibration. Opacus is imported
where a ledger is first used: importing it costs seconds (it pulls in torch.distributed), and loading
the registry (`leakbench list`, a dry run) imports this module without accounting anything.
"""
from __future__ import annotations

import functools
import hashlib
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
CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]   # what computed a cached calibration


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

    def step(self, sample_rate: float | None = None) -> None:
        """Account one release of the mechanism (one round's aggregate, one DP-SGD step) at `sample_rate`
        (default: the ledger's)."""
        q = self.sample_rate if sample_rate is None else float(sample_rate)
        if not 0 < q <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {q}")
        self._accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=q)

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


def noise_for_histories(target_epsilon: float, delta: float, histories: list[list[tuple[float, int]]]) -> float:
    """Smallest noise multiplier (up to the bisection tolerance) with which every history spends at most
    target_epsilon; a history is one party's planned releases as (sample rate, steps) runs, e.g. each client's
    DP-SGD steps. Bisection as Opacus' get_noise_multiplier does it, on the largest epsilon of the histories."""
    if not target_epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need target_epsilon > 0 and delta in (0, 1); got {target_epsilon}, {delta}")
    plans = tuple(sorted({tuple(sorted((float(q), int(n)) for q, n in h if n > 0)) for h in histories} - {()}))
    if any(not 0 < q <= 1 for plan in plans for q, _ in plan):
        raise ValueError("every sample rate must be in (0, 1]")
    if not plans:
        raise ValueError("no party plans a release: nothing to calibrate noise for")
    return _cached_histories(float(target_epsilon), float(delta), plans)


@functools.lru_cache(maxsize=64)
def _cached_histories(target_epsilon: float, delta: float, plans: tuple) -> float:
    import opacus
    from opacus.accountants import RDPAccountant

    key = json.dumps([ACCOUNTANT, opacus.__version__, CODE, RELATIVE_TOLERANCE, target_epsilon, delta, plans])
    stored = _read(cache_file())
    if key in stored:
        return float(stored[key])

    def worst(z: float) -> float:
        spent = 0.0
        for plan in plans:
            accountant = RDPAccountant()
            accountant.history = [(z, q, n) for q, n in plan]
            spent = max(spent, accountant.get_epsilon(delta=delta))
        return spent

    low, high, tolerance = 0.0, 10.0, RELATIVE_TOLERANCE * target_epsilon
    with warnings.catch_warnings():   # probes of tiny noise hit the largest RDP order; not the answer
        warnings.simplefilter("ignore", UserWarning)
        spent_high = worst(high)
        while spent_high > target_epsilon:
            low, high = high, 2 * high
            if high > 1e6:
                raise ValueError(f"no noise multiplier up to 1e6 reaches epsilon {target_epsilon}")
            spent_high = worst(high)
        while target_epsilon - spent_high > tolerance:
            mid = (low + high) / 2
            spent = worst(mid)
            if spent < target_epsilon:
                high, spent_high = mid, spent
            else:
                low = mid
    _write(cache_file(), _read(cache_file()) | {key: high})
    return high


@functools.lru_cache(maxsize=64)
def _cached(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    import opacus
    from opacus.accountants.utils import get_noise_multiplier

    key = json.dumps([ACCOUNTANT, opacus.__version__, CODE, RELATIVE_TOLERANCE, target_epsilon, delta, sample_rate,
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
