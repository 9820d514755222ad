"""A real multi-node Ray cluster on this machine: a head that holds no CPU, so every task runs on a worker node (a
raylet of its own, started with no LEAKBENCH_DATA: the data root must arrive with the job), driven through
--ray-address as a remote cluster would be.

- smoke: one worker node; a small MNIST suite stores the in-process results, and a task on the node sees the
  driver's data root and computes the driver's code fingerprint (about 40 s: a node and its workers start).
- two worker nodes; one is removed while groups are in flight (Ray retries the task it held once, on the other
  node). No cell finished before the removal is lost or recomputed, and a rerun completes every cell; the smoke
  variant runs 2 scenarios (8 cells), the other 6 (24 cells). About 35 s and 1 min on 2 cores.

Run with `pytest tests/benchmarks/test_bench_ray_cluster.py -m heavy` (CI: `-m heavy -k smoke`).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.run.executors import Job, RayExecutor
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from bench.run.store import Store
from tests.conftest import EXECUTOR_GRID, tiny_scenarios_toml
from tests.test_reproducible import assert_same, comparable

ROOT = Path(__file__).resolve().parents[2]


def _suite(tmp_path: Path, seeds: int) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text('name = "cluster"\n' + tiny_scenarios_toml(seeds, "mnist", "mnist", "mlp-tiny") + EXECUTOR_GRID)
    return path


@pytest.fixture
def cluster(monkeypatch, data_root):
    """A head with no CPU; worker nodes are added by the test. Nodes inherit this environment: the code on
    PYTHONPATH, one thread, and no LEAKBENCH_DATA."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LEAKBENCH_DATA", raising=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # node workers cannot import this test file
    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        yield head
    finally:
        ray.shutdown()
        head.shutdown()


def _records(out: Path) -> dict[str, dict]:
    if not (out / "leakbench.sqlite").exists():
        return {}
    store = Store(out / "leakbench.sqlite")
    try:
        return {r["cell_id"]: r for r in store.records()}
    finally:
        store.close()


def _where(cells, data_root, run_id, on_round=None):
    """A job that reports where it ran and what it found there."""
    import ray

    from bench.run.version import cell_fingerprint
    return [(ray.get_runtime_context().get_node_id(), data_root, os.path.isdir(data_root),
             os.environ.get("LEAKBENCH_DATA"), cell_fingerprint(cells[0]))]


@pytest.mark.heavy
def test_ray_cluster_smoke(cluster, data_root, tmp_path):
    from bench.run.version import cell_fingerprint

    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    suite = _suite(tmp_path, seeds=1)
    pool = RayExecutor(1, cluster.address, fn=_where)
    try:
        cells = list(load_suite(str(suite)).cells)
        pool.submit(Job(cells, "run", "group", data_root))
        [(_, result)] = pool.wait(300)
    finally:
        pool.close()
    assert not isinstance(result, BaseException), result
    [(node_id, root, exists, env_root, fingerprint)] = result
    assert node_id == node.node_id and node_id != cluster.head_node.node_id
    assert (root, exists, env_root) == (data_root, True, None)        # the job's data root, not the node's env
    assert fingerprint == cell_fingerprint(cells[0])

    remote = run_suite(load_suite(str(suite)), tmp_path / "ray", data_root=data_root, executor="ray",
                       ray_address=cluster.address)
    assert remote.failed == 0 and remote.ok + remote.blocked == 4, remote.failures
    local = run_suite(load_suite(str(suite)), tmp_path / "local", data_root=data_root)
    assert local.failed == 0
    from bench.cli import main
    for out in ("ray", "local"):
        assert main(["leaderboard", "--out", str(tmp_path / out)]) == 0
    assert_same(comparable(tmp_path / "local" / "results.json"), comparable(tmp_path / "ray" / "results.json"))


@pytest.mark.heavy
@pytest.mark.parametrize("seeds", [pytest.param(2, id="smoke"), pytest.param(6, id="six-scenarios")])
def test_a_worker_node_removed_mid_run_loses_no_finished_cell(cluster, data_root, tmp_path, seeds):
    keep = cluster.add_node(num_cpus=1)
    doomed = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    suite, out = _suite(tmp_path, seeds), tmp_path / "out"
    removed: dict[str, dict] = {}

    def remove_after_the_first_group() -> None:
        deadline = time.time() + 600
        while time.time() < deadline:
            stored = _records(out)
            if stored:
                removed.update(stored)
                cluster.remove_node(doomed, allow_graceful=False)   # its raylet dies with a group in flight
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=remove_after_the_first_group, daemon=True)
    watcher.start()
    first = run_suite(load_suite(str(suite)), out, data_root=data_root, executor="ray", workers=2,
                      ray_address=cluster.address)
    watcher.join(timeout=60)
    total = seeds * 2 * 2
    assert removed and len(removed) < total, f"{len(removed)} cells stored when the node was removed"
    after_first = _records(out)
    for cell_id, rec in removed.items():                          # nothing finished was lost or redone
        assert after_first[cell_id]["environment"]["run_id"] == rec["environment"]["run_id"]

    rerun = run_suite(load_suite(str(suite)), out, data_root=data_root, executor="ray", workers=1,
                      ray_address=cluster.address)
    assert rerun.failed == 0, rerun.failures
    finished = first.ok + first.blocked + first.diverged
    assert rerun.skipped == finished and rerun.ok + rerun.blocked == total - finished
    final = _records(out)
    assert len(final) == total and {r["status"] for r in final.values()} <= {"ok", "blocked"}
    for cell_id, rec in removed.items():
        assert final[cell_id]["environment"]["run_id"] == rec["environment"]["run_id"]
        assert final[cell_id]["metrics"] == rec["metrics"]
    assert keep in cluster.list_all_nodes()
