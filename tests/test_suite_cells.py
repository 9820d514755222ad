"""A suite's cells as benchmark tests (default: the smoke suite); see bench/pytest_plugin.py."""


def test_cell(leakbench_cell, leakbench_runner, benchmark):
    record = benchmark.pedantic(leakbench_runner.run_cell, args=(leakbench_cell,), rounds=1, iterations=1)
    benchmark.extra_info.update(leakbench_runner.extra_info(leakbench_cell, record))
    assert record["status"] in ("ok", "blocked"), record["reason"]
