"""Privacy accounting: ledgers of subsampled Gaussian mechanisms, their epsilon by two accountants, noise calibration.

A ledger records a mechanism's releases as (noise multiplier, sample rate, steps) runs. User-level DP-FedAvg keeps
one for the attacked client and one for every other client, stepped once per released aggregate at
q = sampled clients / total clients, and at q = 1 for the attacked client in the round the engine forces it in
(`forced`, the rule of bench/federation/engine.py's sampler): its participation there is certain, not sampled. Record-level DP-SGD keeps
one per client, stepped once per local step with q = batch / the client's data (`step(sample_rate)`). Opacus reads
a history as Poisson subsampling at each rate; a run that samples a fixed number of clients, or shuffles a
client's data into fixed batches, is accounted as Poisson sampling at the same rate (`describe` says which).

Two accountants read every history (`report`): Opacus' RDPAccountant (Mironov et al. 2019, converted as Balle et
al. 2020) and its PRVAccountant (Gopi et al. 2021: the privacy loss composed numerically, returned as its upper
bound within eps_error 0.01). Both are valid upper bounds for add/remove adjacency, mixed rates included; the
headline `epsilon` is the smaller (PRV is usually tighter: 5.58 against RDP's 6.33 over 60 rounds at q = 0.1,
z = 1), and the record names which. Noise is calibrated with RDP, so a run planned for a target reaches at most it.
The replace-one reading (a client's, or a record's, data replaced: the clipped vector moves by 2 C) is the same
accountants at noise multiplier z / 2 where every release is unsubsampled (q = 1); Opacus accounts Poisson
subsampling under add/remove only, so a subsampled history has no replace-one reading here, and the record says so.

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

from bench.protocol.evidence import run_metric

ACCOUNTANT = "rdp"   # the accountant noise is calibrated with
PRV_EPS_ERROR = 0.01      # PRV's epsilon is its upper bound: the estimate plus at most this discretization error
PRV_POINTS = 4_000_000    # the most grid points a PRV reading may discretize (memory ~ 100 bytes a point)
LEVELS = {"user": "one client's whole data", "record": "one record of one client's data"}
# bisection stops within this fraction of the target epsilon, always on the private side
RELATIVE_TOLERANCE = 1e-3
CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]   # what computed a cached calibration


# `epsilon` itself (the headline) is in metrics/run.py; its readings are declared where they are computed
for _name, _what in (("epsilon_rdp", "the attacked client's epsilon by Opacus' RDP accountant (add/remove)"),
                     ("epsilon_prv", "the attacked client's epsilon by Opacus' PRV accountant (add/remove; its upper "
                                     "bound)"),
                     ("epsilon_replace_one", "the attacked client's epsilon under replace-one adjacency (the clipped "
                                             "contribution moves by 2 clip); only where no release is subsampled"),
                     ("epsilon_other_clients", "the most epsilon any client other than the attacked one spent "
                                               "(add/remove)")):
    run_metric(_name, "", True, "privacy", _what, fmt="{:.2f}")


def cache_file() -> Path:
    """Where calibrated noise multipliers persist between processes."""
    root = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    return root / "leakbench" / "noise.json"


class RdpLedger:
    """Releases of a subsampled Gaussian mechanism at one noise multiplier, as Opacus' RDP accountant records them;
    `epsilon` is its RDP reading, `readings(ledger.history, delta)` every accountant's."""

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
        """Epsilon spent so far at `delta` by RDP; 0 before the first step."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        return float(self._accountant.get_epsilon(delta=delta)) if self.steps else 0.0


History = list[tuple[float, float, int]]   # (noise multiplier, sample rate, steps) runs


def forced(scenario, round: int) -> tuple[int, ...]:
    """The clients the engine's sampler puts in `round` whatever its draw (bench/federation/engine.py, `_sample`):
    the attacked client in the attack round. Their participation there is certain, so a ledger counts that round
    at q = 1 for them (tests/test_dp_epsilon.py holds the sampler to it)."""
    return (scenario.attack_client,) if round == scenario.attack_round else ()


def readings(history: History, delta: float) -> dict[str, Any]:
    """Epsilon of `history` at `delta` by each accountant: {"rdp", "prv", "epsilon" (the smaller), "headline" (its
    accountant)}; "prv" is left out, with the reason under "prv_error", where Opacus' PRV cannot discretize the
    history (very little noise). 0 for an empty history."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return dict(_readings(_merged(history), float(delta)))


def _merged(history: History) -> tuple:
    """The history's runs with equal (z, q) added up, in a fixed order: composition does not depend on the order
    of the releases, and each distinct (z, q) costs both accountants the same work whatever its steps."""
    steps: dict[tuple[float, float], int] = {}
    for z, q, n in history:
        if n > 0:
            steps[(float(z), float(q))] = steps.get((float(z), float(q)), 0) + int(n)
    return tuple((z, q, n) for (z, q), n in sorted(steps.items()))


@functools.lru_cache(maxsize=256)
def _readings(history: tuple, delta: float) -> tuple:
    if not history:
        return (("rdp", 0.0), ("prv", 0.0), ("epsilon", 0.0), ("headline", ACCOUNTANT))
    from opacus.accountants import RDPAccountant

    out: dict[str, Any] = {}
    rdp = RDPAccountant()
    rdp.history = list(history)
    with warnings.catch_warnings():   # the largest RDP order binding, PRV's log(1 - q) at q = 1: not errors
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        out["rdp"] = float(rdp.get_epsilon(delta=delta))
        prv = _bounded_prv()()
        prv.history = list(history)
        try:
            out["prv"] = float(prv.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))
        except (ValueError, RuntimeError, OverflowError) as err:   # its discretization has limits; RDP has none
            out["prv_error"] = f"Opacus' PRV accountant could not compute it: {err}"
    if not math.isfinite(out.get("prv", math.inf)):
        out.pop("prv", None)
        out.setdefault("prv_error", "Opacus' PRV accountant returned a non-finite epsilon")
    out["headline"] = "prv" if out.get("prv", math.inf) < out["rdp"] else ACCOUNTANT
    out["epsilon"] = out[out["headline"]]
    return tuple(out.items())


@functools.cache
def _bounded_prv() -> type:
    """Opacus' PRVAccountant that refuses, before allocating it, a grid of more than PRV_POINTS points."""
    from opacus.accountants import PRVAccountant

    class BoundedPRV(PRVAccountant):
        def _get_domain(self, *args, **kwargs):
            domain = super()._get_domain(*args, **kwargs)
            if domain.size > PRV_POINTS:
                raise ValueError(f"its grid would hold {domain.size:.3g} points (limit {PRV_POINTS:,}): too "
                                 "little noise")
            return domain

    return BoundedPRV


def replace_one(history: History, delta: float) -> dict[str, Any]:
    """The replace-one reading of `history` (sensitivity 2 C: noise multiplier z / 2): readings() of the halved
    history where every release is unsubsampled; {"reason": ...} where some release is subsampled (q < 1)."""
    if any(q < 1 for _, q, n in history if n > 0):
        return {"reason": "not computed: some releases are Poisson-subsampled (q < 1), and Opacus accounts "
                          "subsampling under add/remove adjacency only"}
    return readings([(z / 2, q, n) for z, q, n in history], delta)


def report(delta: float, attacked: History, others: History | None, *, level: str, sensitivity: str,
           sampling: str, covers: str | None = None,
           bounds: dict[str, tuple[float, float]] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """A DP row's run metrics and details.dp. `epsilon` is the attacked client's (the client whose upload is
    attacked), by the tighter of the accountants, at add/remove adjacency of `level` ("user": one client's whole
    data; "record": one record of one client's data); `epsilon_rdp` and `epsilon_prv` are the two readings,
    `epsilon_replace_one` the replace-one reading where there is one, `epsilon_other_clients` the most any other
    client spent. `bounds`: further valid bounds by name, as (add/remove, replace-one or inf), e.g. a closed-form
    Gaussian mechanism's; they join the minimum."""
    import opacus

    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    mine, swapped = readings(attacked, delta), replace_one(attacked, delta)
    headline, name = mine["epsilon"], mine["headline"]
    replaced = swapped.get("epsilon")
    for bound, (add_remove, swap) in (bounds or {}).items():
        if add_remove < headline:
            headline, name = add_remove, bound
        if replaced is not None and swap < replaced:
            replaced = swap
    metrics = {"epsilon": headline, "epsilon_rdp": mine["rdp"]}
    if "prv" in mine:
        metrics["epsilon_prv"] = mine["prv"]
    if replaced is not None:
        metrics["epsilon_replace_one"] = replaced
    if others is not None:
        metrics["epsilon_other_clients"] = readings(others, delta)["epsilon"]
    details = {
        "accountant": f"opacus {opacus.__version__} rdp and prv" + "".join(f", {b}" for b in bounds or {})
                      + "; epsilon is the smallest",
        "headline_accountant": name, "delta": delta, "level": level,
        "adjacency": f"{level}-level, add/remove ({LEVELS[level]})", "sensitivity": sensitivity,
        "epsilon_of": "the attacked client", "sampling": sampling,
        "history": [list(h) for h in attacked],
        "replace_one": "sensitivity 2 C: the same accountants at noise multiplier z / 2, the smallest"
                       if replaced is not None else swapped["reason"]}
    if others is not None:
        details["other_clients_history"] = [list(h) for h in others]
    if "prv_error" in mine:
        details["prv"] = mine["prv_error"]
    if covers:
        details["covers"] = covers
    return metrics, details


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
    plans = tuple(sorted({tuple((q, n) for _, q, n in _merged([(1.0, q, n) for q, n in h])) for h in histories}
                         - {()}))
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
