"""Concurrent runs into one --out compute each cell once; a group's cells share one federated run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.run.leases import Claims
from bench.run.runner import run_suite
from bench.run.store import Store
from tests.conftest import TINY_SCENARIO, tiny_scenarios_toml, tiny_suite

SUITE = f"""
name = "race"
{tiny_scenarios_toml(3)}
[[defenses]]
name = "plaintext"
[[defenses]]
name = "dp-fedavg"
params = {{ noise_multiplier = 0.5 }}
[[attacks]]
name = "idlg-extended"
[[attacks]]
name = "random-guess"
"""

RUNNER = """
import json, os, sys, time
from pathlib import Path
from bench.run.spec import load_suite
from bench.run.runner import run_suite
suite = load_suite(sys.argv[1])
go = Path(sys.argv[3])
Path(sys.argv[4]).touch()                # ready: imports done
while not go.exists():
    time.sleep(0.01)
s = run_suite(suite, sys.argv[2], poll_s=0.05)
print(json.dumps({"computed": s.ok + s.blocked + s.failed, "skipped": s.skipped, "failed": s.failed}))
"""


def test_two_concurrent_runs_compute_each_cell_once(tmp_path):
    suite_file = tmp_path / "race.toml"
    suite_file.write_text(SUITE)
    out, go = tmp_path / "out", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RUNNER, str(suite_file), str(out), str(go),
                               str(tmp_path / f"ready{i}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for i in range(2)]
    deadline = time.time() + 240
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()                                   # both start computing at once
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    cells = 3 * 2 * 2
    assert sum(r["computed"] for r in results) == cells, results       # each cell computed exactly once
    assert all(r["computed"] + r["skipped"] == cells and r["failed"] == 0 for r in results), results
    store = Store(out / "leakbench.sqlite")
    records = store.records("race")
    store.close()
    assert len(records) == cells and all(r["status"] in ("ok", "blocked") for r in records)
    runs: dict[tuple, set] = {}
    for r in records:
        runs.setdefault((r["scenario"], r["defense"]), set()).add(r["environment"]["run_id"])
    assert all(len(ids) == 1 for ids in runs.values()) and len({i for v in runs.values() for i in v}) == 6


def test_missing_cells_of_a_group_are_recomputed_with_the_rest(tmp_path):
    """A group left half done (one attack stored) is recomputed whole: every row shares one run id."""
    first = tiny_suite(["plaintext"], ["idlg-extended"], name="half")
    run_suite(first, tmp_path)
    store = Store(tmp_path / "leakbench.sqlite")
    old = store.records("half")[0]["environment"]["run_id"]
    store.close()
    both = tiny_suite(["plaintext"], ["idlg-extended", "random-guess"], name="whole")
    summary = run_suite(both, tmp_path)
    assert summary.skipped == 0 and summary.ok + summary.blocked == 2
    store = Store(tmp_path / "leakbench.sqlite")
    ids = {r["environment"]["run_id"] for r in store.records("whole")}
    store.close()
    assert len(ids) == 1 and old not in ids
    again = run_suite(both, tmp_path)            # a complete group is skipped
    assert again.skipped == 2 and again.ok == 0


def test_a_live_claim_is_respected_and_a_dead_one_taken_over(tmp_path):
    Store(tmp_path / "s.sqlite").close()
    a, b = Claims(tmp_path / "s.sqlite", "run-a"), Claims(tmp_path / "s.sqlite", "run-b")
    assert a.claim("g") and a.claim("g") and not b.claim("g")
    a.release("g")
    assert b.claim("g")
    b._db.execute("UPDATE claims SET pid=? WHERE grp='g'", (_dead_pid(),))   # its process is gone
    assert a.claim("g")
    a.close()
    b.close()
    assert TINY_SCENARIO["dataset"] == "digits"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
