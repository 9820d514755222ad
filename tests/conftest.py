"""Shared helpers: tiny inline suites that run in seconds on the embedded digits data; and, at the end of a run,
how many tests skipped for want of something the reader can provide (the data root, a browser), with the line
that provides it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.run.spec import parse_suite

TINY_SCENARIO = {"name": "tiny", "dataset": "digits", "model": "mlp", "num_clients": 2, "clients_per_round": 2,
                 "rounds": 1, "max_train": 120, "max_test": 60, "seed": 0}


# plaintext and FedHE-Full against two cheap label attacks: the grid the executor tests run on tiny scenarios
EXECUTOR_GRID = """
[[defenses]]
name = "plaintext"
[[defenses]]
name = "fedhe-full"
[[attacks]]
name = "idlg-extended"
[[attacks]]
name = "random-guess"
"""


def tiny_scenarios_toml(seeds: int = 3, prefix: str = "tiny", dataset: str = "digits", model: str = "mlp") -> str:
    """[[scenarios]] tables {prefix}-0 .. {prefix}-{seeds-1}: independent groups for the runner's concurrency tests."""
    return "".join(f"""
[[scenarios]]
name = "{prefix}-{seed}"
dataset = "{dataset}"
model = "{model}"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 60
max_test = 30
seed = {seed}
""" for seed in range(seeds))


def tiny_suite(defenses, attacks, name: str = "tiny", **scenario):
    """An inline suite: defenses/attacks as names or (name, params) pairs."""
    def tables(items):
        return [{"name": i} if isinstance(i, str) else {"name": i[0], "params": i[1]} for i in items]
    return parse_suite({"name": name, "scenarios": [{**TINY_SCENARIO, **scenario}],
                        "defenses": tables(defenses), "attacks": tables(attacks)})


def consistent(rec: dict) -> dict:
    """A hand-built record as a read-back check and the reading rule want it (bench/protocol/records.py): a config
    naming its scenario, defense and attack with their params, the cell id hashed from that config, and sealed
    with its digest (edit it after this and it is unverified until sealed again)."""
    from bench.protocol.records import config_id, seal
    rec["config"] = {"scenario": {"name": rec["scenario"]},
                     **{kind: {"name": rec[kind], "params": rec.get(f"{kind}_params", {})} for kind in ("defense", "attack")}}
    rec["cell_id"] = config_id(rec["config"])
    rec.setdefault("environment", {})
    return seal(rec)


@pytest.fixture
def small_kde(monkeypatch):
    """KDE mutual information (metrics/leakage.py) on 200 sampled entries instead of 2,000. It scores every cell, and
    its kernel density fits on 2,000 points are most of an end-to-end grid's time (12 of 15 s a defense); tests of
    the metric's values (tests/test_kde_mi.py) and of committed records keep the default. In-process runs only."""
    from metrics import leakage
    monkeypatch.setitem(leakage.kde_mutual_information.__kwdefaults__, "max_samples", 200)


@pytest.fixture
def data_root():
    root = os.environ.get("LEAKBENCH_DATA")
    if not root:
        pytest.skip("needs the data root: set LEAKBENCH_DATA (CI sets ../shared/data)")
    return root


def weighted_uploads(fed, defense, updates: dict, round: int = 0) -> list:
    """Every client's upload of one round by hand, weighted by its share of the samples (as the engine does)."""
    from bench.protocol.wire import Upload
    total = sum(c.num_samples for c in fed.clients)
    return [Upload(c.name, round, c.num_samples / total, defense.encode(fed, c, updates[c.name], c.num_samples / total))
            for c in fed.clients]


def fedsgd_update(model, x, y, lr: float):
    """(entries before, update) of one FedSGD step: -lr * grad for parameters, drift for BN buffers.

    The model's entries are restored afterwards, so repeated calls attack the same global model."""
    import torch

    from bench.models import update_names
    model.train()
    names = update_names(model)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    before = {n: state[n].detach().clone() for n in names}
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    update = {n: -lr * state[n].grad.detach().clone() if state[n].grad is not None
              else state[n].detach() - before[n] for n in names}
    with torch.no_grad():
        for n in names:
            state[n].copy_(before[n])
    return before, update


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A temporary site-packages on sys.path for plugin distributions (tests/plugin_kit.py); removed after,
    with every plugin it held forgotten."""
    import sys

    from tests.plugin_kit import Site
    monkeypatch.setenv("LEAKBENCH_CACHE", str(tmp_path / "cache"))
    s = Site(tmp_path / "site", tmp_path / "cache")
    sys.path.insert(0, str(s.path))
    yield s
    sys.path.remove(str(s.path))
    s.reload()


def run_every_cell(suite, tmp_path, data_root) -> list[dict]:
    """Run a suite into tmp_path; no cell may fail and every cell has its record."""
    from bench.run.runner import run_suite
    from bench.run.store import Store
    summary = run_suite(suite, tmp_path, data_root=data_root)
    assert summary.failed == 0, summary.failures
    store = Store(tmp_path / "leakbench.sqlite")
    records = store.records(suite.name)
    store.close()
    assert len(records) == len(suite.cells)
    return records


# a tiny core suite: plaintext, central DP-FedAvg and FedHE-Full against iDLG-extended (recovers the labels) and
# one-step iDLG (recovers no image even without a defense, so it gives no verdict); seconds on the digits data
TINY_CORE = """
name = "core"
description = "a tiny core"

[[scenarios]]
name = "digits-tiny"
dataset = "digits"
model = "lenet5-sigmoid"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 200
max_test = 100
seed = 0

[[defenses]]
name = "plaintext"
[[defenses]]
name = "dp-fedavg"
params = { noise_multiplier = 0.5 }
[[defenses]]
name = "fedhe-full"

[[attacks]]
name = "idlg-extended"
[[attacks]]
name = "idlg"
params = { steps = 1 }

[[tracks]]
name = "digits"
setting = "two clients train LeNet-5 on digits for one round: a test's track"
scenarios = ["digits-tiny"]
utility = "digits-tiny"
notes = { dp-fedavg = "user-level DP with two clients a round: noise on the mean as large as the update (a test's row)" }
"""
DP = "digits-tiny/dp-fedavg(noise_multiplier=0.5)"   # the central DP row of TINY_CORE, as --only and pages label it


@pytest.fixture(scope="session")
def tiny_core(tmp_path_factory):
    """TINY_CORE computed once per session: a folder holding core.toml and core/ (results.json, pages.json)."""
    from bench.cli import main
    root = tmp_path_factory.mktemp("tiny")
    (root / "core.toml").write_text(TINY_CORE)
    assert main(["run", str(root / "core.toml"), "--out", str(root / "core")]) == 0
    return root


def copy_export(tiny_core: Path, to: Path, edit=None, suite: str | None = None, pages: bool = True) -> Path:
    """A copy of the tiny_core folder's export under `to`: `edit` changes its records, `suite` renames their suite,
    `pages` False leaves pages.json out."""
    to.mkdir(parents=True, exist_ok=True)
    records = json.loads((tiny_core / "core" / "results.json").read_text())
    if edit:
        edit(records)
    for rec in records:
        rec["suite"] = suite or rec["suite"]
    (to / "results.json").write_text(json.dumps(records))
    if pages:
        shutil.copy(tiny_core / "core" / "pages.json", to / "pages.json")
    return to


def find_record(records: list[dict], label: str) -> dict:
    """The record of scenario/defense/attack as a page labels them, parameters included."""
    from bench.evaluation.schema import attack_label, defense_label
    return next(r for r in records if f"{r['scenario']}/{defense_label(r)}/{attack_label(r)}" == label)


# Skips a reader can undo: (what is missing, words that a skip's reason names it by, the line that provides it).
PROVIDE = (("a data root", ("LEAKBENCH_DATA", "data root"),
            "LEAKBENCH_DATA=/path/to/data make test   (MNIST, Fashion-MNIST, CIFAR-10, the text sets: "
            "README, 'Data root')"),
           ("a browser", ("chromium",), "as root: apt-get install chromium chromium-driver, then make test"))
TALLY = "LEAKBENCH_SKIP_TALLY"   # a file that sums the counts over the pytest runs of one `make test` (Makefile)


def _reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)


def skip_counts(reports) -> dict[str, int]:
    """How many skipped tests want each thing of PROVIDE, read from their skip reasons."""
    counts = {what: 0 for what, _, _ in PROVIDE}
    for report in reports:
        reason = _reason(report)
        for what, words, _ in PROVIDE:
            if any(word in reason for word in words):
                counts[what] += 1
                break
    return counts


def skip_lines(counts: dict[str, int], this_run: dict[str, int] | None = None) -> list[str]:
    """One sentence per thing wanted, with the line that provides it; `this_run` where `counts` add up several runs."""
    lines = []
    for what, _, provide in PROVIDE:
        n = counts.get(what, 0)
        if n:
            here = this_run.get(what, 0) if this_run is not None else n
            part = f" ({here} of them in this run)" if here != n else ""
            lines.append(f"{n} test{'s' if n != 1 else ''} skipped for want of {what}{part}; to run them: {provide}")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = skip_counts(terminalreporter.stats.get("skipped", []))
    tally = os.environ.get(TALLY)
    this_run = None
    if tally:   # `make test` runs pytest twice: the last run says the sum
        path = Path(tally)
        before = json.loads(path.read_text()) if path.is_file() else {}
        this_run, counts = counts, {k: before.get(k, 0) + v for k, v in counts.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(counts))
    lines = skip_lines(counts, this_run)
    if lines:
        terminalreporter.section("skipped for want of what you can provide", sep="-", bold=True)
        for line in lines:
            terminalreporter.write_line(line)
