"""A suite's cells as benchmark tests (default: the smoke suite); see bench/pytest_plugin.py."""


def test_cell(leakbench_cell, leakbench_runner, benchmark):
    record = benchmark.pedantic(leakbench_runner.run_cell, args=(leakbench_cell,), rounds=1, iterations=1)
    benchmark.extra_info.update({"cell_id": record["cell_id"], "status": record["status"],
                                 **{k: v for k, v in record["metrics"].items() if isinstance(v, (int, float))}})
    assert record["status"] in ("ok", "blocked"), record["reason"]
