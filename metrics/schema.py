"""One schema for every metric: name, unit, direction, format, kind; it drives the leaderboard.

Direction is stated for the defended client: a privacy metric where a smaller number
means less leakage (PSNR of a reconstruction) is "lower is better". Metrics are pure
functions of an Evidence record; they return None when they do not apply to a cell
and a string "unavailable: <reason>" when they apply but cannot be computed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bench.registry import METRICS

KINDS = ("privacy", "utility", "cost")


@dataclass(frozen=True)
class Evidence:
    """What a metric may look at: one attack outcome against its ground truth, and the run record."""

    reconstruction: Any = None        # bench.attack.Reconstruction
    truth: Any = None                 # bench.federation.Truth
    view: Any = None                  # bench.view.ServerView
    knowledge: Any = None             # bench.view.Knowledge
    run: dict[str, Any] = field(default_factory=dict)   # measured run metrics


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    lower_is_better: bool | None      # None: informational, no ranking
    kind: str
    description: str
    compute: Callable[[Evidence], Any]
    fmt: str = "{:.3f}"
    per_target: bool = True           # averaged over attacked uploads; False: a property of the run
    timing: bool = False              # not reproducible run to run (wall clock, key sizes): excluded from determinism checks
    details: Callable[[Evidence], dict] | None = None   # extra evidence kept in the record (raw scores, CIs)
    display: str = ""                 # the leaderboard's header (default: the name)
    per_attack: bool | None = None    # varies with the attack (default: per-target privacy metrics do); False:
                                      # a property of the run or the view, shown once per defense

    @property
    def arrow(self) -> str:
        return "" if self.lower_is_better is None else ("↓" if self.lower_is_better else "↑")

    @property
    def title(self) -> str:
        return self.display or self.name

    def format(self, value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, str):
            return value
        return self.fmt.format(value)


def metric(name: str, unit: str, lower_is_better: bool | None, kind: str, description: str, *,
           fmt: str = "{:.3f}", per_target: bool = True, timing: bool = False,
           details: Callable[[Evidence], dict] | None = None, display: str = "", per_attack: bool | None = None):
    """Register a metric function under the schema."""
    assert kind in KINDS, kind

    def decorate(fn: Callable[[Evidence], Any]) -> Callable[[Evidence], Any]:
        METRICS.add(name, Metric(name, unit, lower_is_better, kind, description, fn, fmt, per_target, timing,
                                 details, display, per_attack), description)
        return fn

    return decorate


def run_value(key: str) -> Callable[[Evidence], Any]:
    """A run-record metric: the value the federation measured, None when the run has none."""
    return lambda ev: ev.run.get(key)
