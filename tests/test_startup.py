"""Startup: what commands that compute nothing load. Loading the registry imports neither Opacus nor scikit-learn
(seconds, needed only when a ledger or a metric runs), `compare`'s error path loads no torch, and a dry run builds
its models for their structure only."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.models import weights_wanted
from bench.registry import MODELS, Entry
from bench.run.preflight import preflight
from tests.conftest import tiny_suite

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LEAKBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)


def test_loading_every_component_imports_neither_opacus_nor_sklearn(tmp_path):
    done = _python("import sys; from bench.catalog import build; build(); "
                   "print(sorted(m for m in ('opacus', 'sklearn') if m in sys.modules))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_compare_fails_in_one_line_without_loading_torch(tmp_path):
    code = ("import sys; from bench.cli import main; code = main(['compare', 'nowhere-a', 'nowhere-b']); "
            "print(code, 'torch' in sys.modules)")
    done = _python(code, tmp_path)
    assert done.stdout.strip() == "2 False", done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "no results at nowhere-a" in done.stderr


def test_a_dry_run_builds_models_for_their_structure_only(monkeypatch):
    seen = []

    tiny = MODELS.get("mlp-tiny")

    def factory(data):
        """a model that notes whether its weights were wanted"""
        seen.append(weights_wanted())
        return tiny(data)

    monkeypatch.setitem(MODELS._entries, "noted-test", Entry("noted-test", factory, "test model"))
    suite = tiny_suite(["plaintext"], ["random-guess"], model="noted-test")
    preflight(suite, None, weights=False)
    preflight(suite, None)
    assert seen == [False, True] and weights_wanted()
