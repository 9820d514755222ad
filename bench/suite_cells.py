"""A suite's cells as pytest-benchmark tests, shipped with the package so an installed LeakBench runs them
from any folder (fixtures: bench/pytest_plugin.py, a pytest plugin every install registers):

    pip install 'leakbench[bench]'
    python -m pytest --pyargs bench.suite_cells --leakbench-suite default --leakbench-out out/bench \
        --benchmark-json out/bench/benchmark.json
"""


def test_cell(leakbench_cell, leakbench_runner, benchmark):
    record = benchmark.pedantic(leakbench_runner.run_cell, args=(leakbench_cell,), rounds=1, iterations=1)
    benchmark.extra_info.update(leakbench_runner.extra_info(leakbench_cell, record))
    assert record["status"] in ("ok", "blocked"), record["reason"]
