"""The metric contract: what a metric may read (Evidence: an attack's outcome, the attacked upload's
ground truth, the view, the knowledge, the run's measurements) and one schema for every metric (name,
unit, direction, format, kind) that drives the leaderboard and is snapshotted into each record.

Direction is stated for the defended client: a privacy metric where a smaller number
means less leakage (PSNR of a reconstruction) is "lower is better". Metrics are pure
functions of an Evidence record; they return None when they do not apply to a cell
and a string "unavailable: <reason>" when they apply but cannot be computed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from bench.protocol.attack import Reconstruction
from bench.protocol.records import KINDS
from bench.protocol.view import Knowledge, ServerView
from bench.registry import METRICS



@dataclass
class Truth:
    """Ground truth of one attacked upload; never handed to an attack."""

    x: torch.Tensor
    y: torch.Tensor
    update: dict[str, torch.Tensor]
    member: np.ndarray | None = None     # membership label per candidate (1 = member), in candidate order
    client_y: torch.Tensor | None = None   # every label the attacked client holds (what negotiation may leak)
    trial: bool = False                  # one trial of a repeated experiment (a canary in or out): a cell's
                                         # metrics then score all its trials together


@dataclass(frozen=True)
class Evidence:
    """What a metric may look at: one attack outcome against its ground truth, and the run record."""

    reconstruction: Reconstruction | None = None
    truth: Truth | None = None
    view: ServerView | None = None
    knowledge: Knowledge | None = None
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
    flag_above: float | None = None   # a value above it is flagged on the page (a warning about the setting)

    @property
    def arrow(self) -> str:
        return "" if self.lower_is_better is None else ("↓" if self.lower_is_better else "↑")

    @property
    def title(self) -> str:
        return self.display or self.name

    def snapshot(self) -> dict[str, Any]:
        """What a page needs to show this metric, stored with each record that reports it."""
        out = {k: v for k, v in asdict(self).items() if k not in ("compute", "details", "name")}
        out["title"] = self.title
        return out

    def format(self, value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, str):
            return value
        return self.fmt.format(value)


def metric(name: str, unit: str, lower_is_better: bool | None, kind: str, description: str, *,
           fmt: str = "{:.3f}", per_target: bool = True, timing: bool = False,
           details: Callable[[Evidence], dict] | None = None, display: str = "", per_attack: bool | None = None,
           flag_above: float | None = None):
    """Register a metric function under the schema."""
    assert kind in KINDS, kind

    def decorate(fn: Callable[[Evidence], Any]) -> Callable[[Evidence], Any]:
        METRICS.add(name, Metric(name, unit, lower_is_better, kind, description, fn, fmt, per_target, timing,
                                 details, display, per_attack, flag_above), description)
        return fn

    return decorate


def run_value(key: str) -> Callable[[Evidence], Any]:
    """A run-record metric: the value the federation measured, None when the run has none. It computes
    nothing itself (`reads_run` says so): whatever reported the value did (bench/run/version.py)."""
    def read(ev: Evidence) -> Any:
        return ev.run.get(key)
    read.reads_run = key
    return read


def run_metric(name: str, unit: str, lower_is_better: bool | None, kind: str, description: str, *,
               fmt: str = "{:.3f}", timing: bool = False, display: str = "") -> None:
    """Register a property of the run that a defense reports from its `run_metrics` hook under `name`
    (shown once per defense); the defense's own module declares it."""
    metric(name, unit, lower_is_better, kind, description, fmt=fmt, per_target=False, timing=timing,
           display=display)(run_value(name))
