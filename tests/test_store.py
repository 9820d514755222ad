"""The results store: transactional cells, skip on rerun, kill -9 safety, corruption reported."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from bench.cli import main
from bench.run.runner import run_suite
from bench.run.store import Store, StoreError
from tests.conftest import tiny_suite


def test_rerun_skips_finished_cells(tmp_path):
    suite = tiny_suite(["plaintext"], [("idlg", {"reconstruct": False})])
    first = run_suite(suite, tmp_path)
    second = run_suite(suite, tmp_path)
    assert (first.ok, first.skipped) == (1, 0)
    assert (second.ok, second.skipped) == (0, 1)


def test_corrupted_store_is_reported_not_replaced(tmp_path, capsys):
    path = tmp_path / "leakbench.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="corrupted"):
        Store(path)
    assert main(["run", "smoke", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "corrupted" in err
    assert path.read_bytes() == before


def test_kill_minus_nine_loses_no_finished_cell(tmp_path):
    suite_file = tmp_path / "two.toml"
    suite_file.write_text('''
name = "two"
[[scenarios]]
name = "a"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 120
[[scenarios]]
name = "b"
dataset = "digits"
model = "lenet5-sigmoid"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 120
[[defenses]]
name = "plaintext"
[[attacks]]
name = "idlg"
params = { steps = 300, tol = 0.0 }
''')
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "bench", "run", str(suite_file), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = out / "leakbench.sqlite"
    deadline = time.time() + 240
    finished = 0
    while time.time() < deadline and proc.poll() is None:
        if db.exists():
            try:
                finished = sqlite3.connect(db).execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            except sqlite3.Error:
                finished = 0
            if finished >= 1:
                break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed; make the second cell slower"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert finished == 1
    store = Store(db)
    records = store.records()
    assert [r["status"] for r in records] == ["ok"]
    assert store.finished(records[0]["cell_id"])
    store.close()


def test_missing_data_fails_at_load_and_writes_nothing(tmp_path, capsys):
    suite_file = tmp_path / "bad.toml"
    suite_file.write_text('''
name = "bad"
[[scenarios]]
name = "needs-text-data"
dataset = "sst2"
model = "gpt2-lora"
[[defenses]]
name = "plaintext"
[[attacks]]
name = "idlg"
''')
    code = main(["run", str(suite_file), "--out", str(tmp_path / "out"), "--data-root", str(tmp_path)])
    assert code == 2 and "sst2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_failed_cells_are_recorded_and_exit_nonzero(tmp_path, capsys, monkeypatch):
    """A cell that fails at run time (here an attack that raises) is stored with its reason; exit 1."""
    from bench.protocol.attack import Attack
    from bench.registry import ATTACKS, Entry

    class Boom(Attack):
        def blocked(self, view, knowledge):
            return None

        def run(self, view, knowledge, seed):
            raise RuntimeError("boom at run time")

    monkeypatch.setitem(ATTACKS._entries, "boom", Entry("boom", Boom, "raises"))
    suite_file = tmp_path / "bad.toml"
    suite_file.write_text('''
name = "bad"
[[scenarios]]
name = "tiny"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 60
max_test = 30
[[defenses]]
name = "plaintext"
[[attacks]]
name = "boom"
''')
    code = main(["run", str(suite_file), "--out", str(tmp_path)])
    records = json.loads((tmp_path / "results.json").read_text())
    assert code == 1
    assert records[0]["status"] == "failed" and "boom at run time" in records[0]["reason"]
