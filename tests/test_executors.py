"""Executors: Ray and the process pool give the in-process results; a killed Ray run resumes; bad options exit 2.

One local Ray (2 CPUs) serves the whole module: starting Ray costs seconds. A run given
--executor ray joins it (and leaves it running); the killed run connects to it with --ray-address.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cli import main
from bench.protocol.defense import Defense
from bench.run.executors import Job, LocalExecutor, ProcessExecutor, RayExecutor
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from bench.run.store import Store
from tests.conftest import EXECUTOR_GRID, tiny_scenarios_toml
from tests.test_reproducible import assert_same, comparable

ROOT = Path(__file__).resolve().parents[1]
SEEDS = 3
SUITE = tiny_scenarios_toml(SEEDS) + EXECUTOR_GRID


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import this test file
    yield ray
    ray.shutdown()


@pytest.fixture
def grid(tmp_path) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text('name = "grid"\n' + SUITE)
    return path


def _same_as_in_process(suite: str, tmp_path: Path) -> None:
    local, ray = tmp_path / "local", tmp_path / "ray"
    assert main(["run", suite, "--out", str(local)]) == 0
    assert main(["run", suite, "--out", str(ray), "--executor", "ray", "--workers", "2"]) == 0
    assert_same(comparable(local / "results.json"), comparable(ray / "results.json"))


# on the smoke suite: tests/benchmarks/test_bench_executors.py::test_executors_smoke (CI's make test) compares Ray and
# the process pool with in-process; the grid test below, the default run's check, does so on many groups at once
@pytest.mark.heavy
def test_ray_gives_the_in_process_results_on_default(ray_session, tmp_path):
    _same_as_in_process("default", tmp_path)


def test_process_pool_and_ray_agree_on_a_grid(ray_session, grid, tmp_path):
    """Many groups in flight at once: every executor stores the same rows, one run id per group. The pool
    starts after CKKS ran in this process (a forked worker inherited TenSEAL's threads dead and hung)."""
    outs = {kind: tmp_path / kind for kind in ("local", "process", "ray")}
    for kind, out in outs.items():
        summary = run_suite(load_suite(str(grid)), out, executor=kind, workers=None if kind == "local" else 2)
        assert (summary.ok + summary.blocked, summary.failed) == (SEEDS * 4, 0), summary.failures
        main(["leaderboard", "--out", str(out)])
    first = comparable(outs["local"] / "results.json")
    for kind in ("process", "ray"):
        assert_same(first, comparable(outs[kind] / "results.json"))
    runs = {}
    for rec in _records(outs["ray"]).values():
        runs.setdefault((rec["scenario"], rec["defense"]), set()).add(rec["environment"]["run_id"])
    assert len(runs) == SEEDS * 2 and all(len(ids) == 1 for ids in runs.values())


def _records(out: Path) -> dict[str, dict]:
    store = Store(out / "leakbench.sqlite")
    try:
        return {r["cell_id"]: r for r in store.records()}
    finally:
        store.close()


def _whole(records: dict[str, dict]) -> set[str]:
    """The cells of the groups (scenario, defense) whose both records are stored."""
    groups: dict[tuple, list] = {}
    for rec in records.values():
        groups.setdefault((rec["scenario"], rec["defense"]), []).append(rec)
    return {r["cell_id"] for recs in groups.values() if len(recs) == 2 for r in recs}


def test_a_killed_ray_run_resumes_without_recomputing_finished_cells(ray_session, grid, tmp_path):
    out = tmp_path / "out"
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen([sys.executable, "-m", "bench", "run", str(grid), "--out", str(out), "--executor",
                               "ray", "--workers", "2", "--ray-address", address], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 180
    while not ((out / "leakbench.sqlite").exists() and _whole(_records(out))):   # a group's records land one by one
        assert driver.poll() is None and time.time() < deadline, driver.communicate()[1][-2000:]
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)          # the driver dies with groups in flight
    driver.wait()
    before = _records(out)
    whole = _whole(before)
    assert whole and len(before) < SEEDS * 4, f"{len(before)} cells stored when the driver was killed"

    summary = run_suite(load_suite(str(grid)), out, executor="ray", workers=2)
    assert summary.skipped == len(whole) and summary.failed == 0
    assert summary.ok + summary.blocked == SEEDS * 4 - len(whole)   # only the rest ran
    after = _records(out)
    assert len(after) == SEEDS * 4
    for cell_id in whole:                                           # finished cells untouched
        assert after[cell_id]["environment"]["run_id"] == before[cell_id]["environment"]["run_id"]
        assert after[cell_id]["metrics"] == before[cell_id]["metrics"]
    for cell_id in set(after) - whole:
        assert after[cell_id]["environment"]["run_id"] != before.get(cell_id, {}).get("environment", {}).get("run_id")


@pytest.mark.parametrize("kind", ["local", "process", "ray"])
def test_a_rerun_with_nothing_left_starts_no_executor(kind, grid, tmp_path):
    """An executor named by the run but never started (every group done) is not closed either."""
    suite = load_suite(str(grid))
    assert run_suite(suite, tmp_path, only="tiny-0/plaintext").failed == 0
    again = run_suite(suite, tmp_path, only="tiny-0/plaintext", executor=kind, workers=None if kind == "local" else 2)
    assert (again.skipped, again.ok, again.failed) == (2, 0, 0)


def _crash(cells, data_root, run_id, on_round=None):
    """A worker that dies mid-task."""
    os._exit(3)


@pytest.mark.parametrize("kind", ["process", "ray"])
def test_a_dead_worker_is_recorded_as_failed_cells(ray_session, kind, grid, tmp_path):
    pool = ProcessExecutor(2, fn=_crash) if kind == "process" else RayExecutor(2, fn=_crash)
    try:
        summary = run_suite(load_suite(str(grid)), tmp_path, executor=pool, only="tiny-0/plaintext")
    finally:
        pool.close()
    assert summary.failed == 2 and summary.ok == 0
    reasons = {reason for _, reason in summary.failures}
    assert len(reasons) == 1 and "\n" not in (reason := reasons.pop())
    assert reason.startswith("WorkerCrashedError:" if kind == "ray" else "BrokenProcessPool:"), reason
    assert {r["status"] for r in _records(tmp_path).values()} == {"failed"}


def _settings(cells, data_root, run_id, on_round=None):
    raise RuntimeError(f"device={os.environ.get('LEAKBENCH_DEVICE')} he={os.environ.get('LEAKBENCH_HE_WORKERS')} "
                       f"root={data_root}")


def test_ray_tasks_get_the_driver_settings_and_data_root(ray_session, grid, tmp_path, monkeypatch):
    monkeypatch.setenv("LEAKBENCH_DEVICE", "cpu")
    monkeypatch.delenv("LEAKBENCH_HE_WORKERS", raising=False)
    pool = RayExecutor(2, fn=_settings)
    try:
        summary = run_suite(load_suite(str(grid)), tmp_path, executor=pool, only="tiny-0/plaintext",
                            data_root=str(tmp_path))
    finally:
        pool.close()
    assert {reason for _, reason in summary.failures} == {f"RuntimeError: device=cpu he=1 root={tmp_path}"}


def test_records_from_other_code_are_refused(grid, tmp_path):
    def elsewhere(cells, data_root, run_id, on_round=None):
        from bench.run.executors import compute
        records = compute(cells, data_root, run_id)
        for rec in records:
            rec["environment"]["fingerprint"] = "0ther0code"
        return records

    summary = run_suite(load_suite(str(grid)), tmp_path, executor=LocalExecutor(fn=elsewhere), only="tiny-0/plaintext")
    assert summary.failed == 2
    assert all("computed by other code (fingerprint 0ther0code" in reason for _, reason in summary.failures)


def _threads(cells, data_root, run_id, on_round=None):
    """A job that reports the torch threads its process computes with."""
    import torch

    return [torch.get_num_threads()]


@pytest.mark.parametrize("kind", ["local", "process", "ray"])
def test_each_process_computes_with_its_share_of_the_cores(ray_session, kind, grid, monkeypatch):
    """Local: every core; a pool of 2: half each; a Ray task: its one CPU; LEAKBENCH_THREADS wins everywhere."""
    from bench.run.threads import usable_cores

    import torch

    before, cells = torch.get_num_threads(), list(load_suite(str(grid)).cells)[:1]
    share = {"local": usable_cores(), "process": max(1, usable_cores() // 2), "ray": 1}[kind]
    for override, expect in ((None, share), ("3", 3)):
        if override is None:
            monkeypatch.delenv("LEAKBENCH_THREADS", raising=False)
        else:
            monkeypatch.setenv("LEAKBENCH_THREADS", override)
        pool = {"local": lambda: LocalExecutor(fn=_threads), "process": lambda: ProcessExecutor(2, fn=_threads),
                "ray": lambda: RayExecutor(2, fn=_threads)}[kind]()
        try:
            pool.submit(Job(cells, "run", "group"))
            [(_, result)] = pool.wait(120)
        finally:
            pool.close()
            torch.set_num_threads(before)   # the local executor set this process's
        assert result == [expect], (kind, override)


def test_a_bad_thread_count_exits_2_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LEAKBENCH_THREADS", "none")
    assert main(["run", "smoke", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "leakbench: error: LEAKBENCH_THREADS must be an integer >= 1, got 'none'", err


@pytest.mark.parametrize("args, expect", [
    (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "cannot reach 127.0.0.1:1"),
    (["--executor", "ray", "--ray-address", "headnode"], "is not HOST:PORT"),
    (["--ray-address", "127.0.0.1:6379"], "did you mean --executor ray"),
    (["--executor", "local", "--workers", "2"], "--executor process or ray"),
])
def test_bad_executor_options_exit_2_in_one_line(args, expect, tmp_path, capsys):
    start = time.perf_counter()
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and len(err.splitlines()) == 1, err
    assert time.perf_counter() - start < 30 and not (tmp_path / "o").exists()


def test_ray_missing_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)                   # `import ray` raises ImportError
    assert main(["run", "smoke", "--out", str(tmp_path), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'leakbench[ray]'" in err, err


class _Sleepy(Defense):
    """encode sleeps: a hook stuck far past any time limit"""

    def encode(self, fed, client, update, weight):
        time.sleep(300)


def _with_sleepy(cells, data_root, run_id, on_round=None):
    """The real computation, in a worker that has the test's defense registered as the driver has."""
    from bench.registry import DEFENSES
    from bench.run.executors import compute
    if "sleepy" not in DEFENSES:
        DEFENSES.add("sleepy", _Sleepy)
    return compute(cells, data_root, run_id)


@pytest.fixture
def sleepy():
    from bench.registry import DEFENSES
    DEFENSES.add("sleepy", _Sleepy)
    yield "sleepy"
    DEFENSES._entries.pop("sleepy", None)


def test_a_stuck_hook_times_out_on_ray_as_a_failed_cell(ray_session, sleepy, tmp_path):
    """The time limit is kept where the cell is computed: a Ray task runs it in its worker's main thread."""
    suite = tmp_path / "s.toml"
    suite.write_text('name = "limits"\n' + tiny_scenarios_toml(2).replace("seed = 0\n", 'seed = 0\ndefenses = '
                     '["sleepy"]\ncell_timeout_s = 2\n').replace("seed = 1\n", 'seed = 1\ndefenses = ["plaintext"]\n')
                     + '[[defenses]]\nname = "plaintext"\n[[defenses]]\nname = "sleepy"\n[[attacks]]\nname = '
                       '"random-guess"\n')
    pool = RayExecutor(2, fn=_with_sleepy)
    start = time.monotonic()
    try:
        summary = run_suite(load_suite(str(suite)), tmp_path / "o", executor=pool)
    finally:
        pool.close()
    assert time.monotonic() - start < 120 and (summary.ok, summary.failed) == (1, 1), summary.failures
    assert summary.failures[0][1].startswith("CellTimeout: timed out after 2 s in the federated run")
