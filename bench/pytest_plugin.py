"""pytest plugin: a suite's cells as parametrized benchmark tests.

    pytest tests/test_suite_cells.py --leakbench-suite default --leakbench-out out/bench

Each cell runs once under pytest-benchmark (`benchmark.pedantic`, one round); its
metrics go to `benchmark.extra_info` and to the results store in --leakbench-out.
Cells of one scenario and defense share one federated run within the session.
"""
from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("leakbench")
    group.addoption("--leakbench-suite", default="smoke", help="suite whose cells become tests (name or TOML path)")
    group.addoption("--leakbench-out", default=None, help="directory of the results store (default: a temp dir)")
    group.addoption("--leakbench-data-root", default=None, help="data root (default: $LEAKBENCH_DATA)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "leakbench_cell" in metafunc.fixturenames:
        from bench.spec import load_suite

        suite = load_suite(metafunc.config.getoption("--leakbench-suite"))
        ids = [f"{c.scenario.name}-{c.defense.label}-{c.attack.label}" for c in suite.cells]
        metafunc.parametrize("leakbench_cell", suite.cells, ids=ids)


class CellRunner:
    """Runs single cells, sharing federated runs per group and writing each record to the store."""

    def __init__(self, out: Path, data_root: str | None) -> None:
        from bench.store import Store

        self.store = Store(out / "leakbench.sqlite")
        self.data_root = data_root
        self._runs: dict[tuple, object] = {}

    def run_cell(self, cell) -> dict:
        from bench.runner import failed, federate, score_cell

        self.store.add_member(cell.suite, cell.cell_id)
        try:
            if cell.group_key not in self._runs:
                self._runs[cell.group_key] = federate(cell, self.data_root)
            record = score_cell(cell, self._runs[cell.group_key])
        except Exception as err:
            record = failed(cell, err, self._runs.get(cell.group_key))
        self.store.put(record)
        return record


@pytest.fixture(scope="session")
def leakbench_runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CellRunner:
    out = request.config.getoption("--leakbench-out")
    runner = CellRunner(Path(out) if out else tmp_path_factory.mktemp("leakbench"),
                        request.config.getoption("--leakbench-data-root"))
    yield runner
    runner.store.close()
