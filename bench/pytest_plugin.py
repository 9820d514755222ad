"""pytest plugin: a suite's cells as parametrized benchmark tests.

    pytest tests/test_suite_cells.py --leakbench-suite default --leakbench-out out/bench -k "digits-mlp and ilrg"

Each cell runs once under pytest-benchmark (`benchmark.pedantic`, one round); its scenario,
defense, attack, parameters, status, reason, metrics and timings (federation time apart from
attack time) go to `benchmark.extra_info`, and the record to the results store in
--leakbench-out together with the suite's page info (notes, figures), so `leakbench
leaderboard --out DIR` renders the same page as a CLI run. Cells of one scenario and defense
share one federated run within the session; test ids are the cell labels with every character
`-k` cannot take replaced by "_".
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest


def cell_id(cell) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{cell.scenario.name}-{cell.defense.label}-{cell.attack.label}").strip("_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("leakbench")
    group.addoption("--leakbench-suite", default="smoke", help="suite whose cells become tests (name or TOML path)")
    group.addoption("--leakbench-out", default=None, help="directory of the results store (default: a temp dir)")
    group.addoption("--leakbench-data-root", default=None, help="data root (default: $LEAKBENCH_DATA)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "leakbench_cell" in metafunc.fixturenames:
        suite = _suite(metafunc.config)
        metafunc.parametrize("leakbench_cell", suite.cells, ids=[cell_id(c) for c in suite.cells])


def _suite(config: pytest.Config):
    """The suite as `leakbench run` runs it: loaded, checked, without the grid points no defense applies to."""
    from bench.run.preflight import preflight
    from bench.run.spec import load_suite

    return preflight(load_suite(config.getoption("--leakbench-suite")), config.getoption("--leakbench-data-root"))


class CellRunner:
    """Runs single cells, sharing federated runs per group and writing each record to the store."""

    def __init__(self, out: Path, data_root: str | None, suite=None) -> None:
        from bench.run.store import Store

        self.store = Store(out / "leakbench.sqlite")
        self.data_root = data_root
        self.suite = suite
        self._runs: dict[tuple, object] = {}
        self.federation_s: dict[str, float] = {}   # per cell id: the federation time that cell paid (0 if shared)
        if suite is not None:
            self.store.set_info(suite.name, suite.page_info())

    def run_cell(self, cell) -> dict:
        from bench.run.cells import failed, federate, score_cell

        self.store.add_member(cell.suite, cell.cell_id)
        self.federation_s[cell.cell_id] = 0.0
        try:
            if cell.group_key not in self._runs:
                start = time.perf_counter()
                group = [c for c in self.suite.cells if c.group_key == cell.group_key] if self.suite else [cell]
                self._runs[cell.group_key] = federate(cell, self.data_root, group=group)
                self.federation_s[cell.cell_id] = time.perf_counter() - start
            record = score_cell(cell, self._runs[cell.group_key])
        except Exception as err:
            record = failed(cell, err, self._runs.get(cell.group_key))
        self.store.put(record)
        return record

    def extra_info(self, cell, record: dict) -> dict:
        """What a benchmark JSON consumer needs to tell cells apart and read their outcome."""
        numbers = {k: v for k, v in record["metrics"].items() if isinstance(v, (int, float))}
        return {"cell_id": record["cell_id"], "suite": cell.suite, "scenario": cell.scenario.name,
                "defense": cell.defense.name, "defense_params": cell.defense.params, "attack": cell.attack.name,
                "attack_params": cell.attack.params, "status": record["status"], "reason": record["reason"],
                "federation_s": self.federation_s.get(cell.cell_id, 0.0),
                "attack_s": numbers.get("attack_s"), **{f"metric.{k}": v for k, v in numbers.items()}}


@pytest.fixture(scope="session")
def leakbench_runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CellRunner:
    out = request.config.getoption("--leakbench-out")
    suite = _suite(request.config)
    runner = CellRunner(Path(out) if out else tmp_path_factory.mktemp("leakbench"),
                        request.config.getoption("--leakbench-data-root"), suite)
    yield runner
    runner.store.close()
