"""CLI: listing, the smoke run end to end, determinism, and one-line errors."""
import json
import subprocess
import sys

from bench.cli import main
from bench.registry import METRICS


def test_list_every_kind(capsys):
    for kind in ("defenses", "attacks", "metrics", "datasets", "models", "suites"):
        assert main(["list", kind]) == 0
    out = capsys.readouterr().out
    for name in ("plaintext", "idlg", "leacc", "digits", "lenet5-sigmoid", "default", "smoke"):
        assert name in out


def test_python_dash_m_bench_works():
    res = subprocess.run([sys.executable, "-m", "bench", "list", "attacks"], capture_output=True, text=True)
    assert res.returncode == 0 and "idlg" in res.stdout


def test_unknown_suite_is_one_line_nonzero(capsys):
    assert main(["run", "defualt"]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean 'default'" in err and "\n" not in err


def _without_timing(records):
    """Records without their timing metrics and without their digest, which covers those too."""
    timing = {e.name for e in METRICS.entries() if e.obj.timing}
    for rec in records:
        rec["metrics"] = {k: v for k, v in rec["metrics"].items() if k not in timing}
        rec["environment"].pop("digest", None)
    return records


def test_smoke_run_writes_everything_and_is_deterministic(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["run", "smoke", "--out", str(out)]) == 0
    for name in ("leakbench.sqlite", "results.json", "results.csv", "index.html"):
        assert (outs[0] / name).exists()
    first, second = (_without_timing(json.loads((o / "results.json").read_text())) for o in outs)
    assert first == second
    rec = first[0]
    for key in ("cell_id", "suite", "scenario", "defense", "defense_params", "attack", "attack_params", "status",
                "reason", "metrics"):
        assert key in rec
    assert rec["status"] == "ok" and rec["metrics"]["label_acc"] == 1.0


def test_leaderboard_rendering_is_deterministic(tmp_path):
    assert main(["run", "smoke", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "index.html").read_text()
    assert main(["leaderboard", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "index.html").read_text() == page
    assert "plaintext" in page and "idlg(steps=10)" in page and "PSNR" in page and "↓" in page
    assert "strongest attack" in page
