"""CLI tools around runs: a fast `list` from the cached catalog, --version, and the pytest plugin's records."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python(code, tmp_path):
    env = {**os.environ, "LEAKBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_list_shows_parameters_units_and_does_not_import_torch_once_cached(tmp_path):
    code = ("import sys; from bench.cli import main; main(['list', 'attacks']); main(['list', 'metrics']); "
            "print('TORCH', 'torch' in sys.modules)")
    first = _python(code, tmp_path)            # builds the catalog (imports everything)
    second = _python(code, tmp_path)           # reads it back
    assert first.replace("TORCH True", "TORCH False") == second and "TORCH False" in second
    assert "steps=300" in second and "[image]" in second and "[label]" in second
    lines = {line.split()[0]: line for line in second.splitlines() if line and not line.startswith(" ")}
    assert "(threat model: malicious-model)" in lines["imprint"] and "(threat model: passive)" in lines["idlg"]
    psnr = next(line for line in second.splitlines() if line.startswith("psnr "))
    assert "dB" in psnr and "lower" in psnr and "privacy" in psnr


def test_version(capsys):
    from bench.cli import main
    from bench.run.version import package_version
    try:
        main(["--version"])
    except SystemExit as done:
        assert done.code == 0
    assert capsys.readouterr().out.strip() == f"leakbench {package_version()}"


def test_pytest_plugin_records_cells_selectable_by_k(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text('name = "tinyplug"\ndescription = "plugin check"\nnotes = "plugin *notes*"\n'
                     '[[scenarios]]\nname = "tiny"\ndataset = "digits"\nmodel = "mlp"\nnum_clients = 2\n'
                     'clients_per_round = 2\nrounds = 1\nmax_train = 120\nmax_test = 60\n'
                     '[[defenses]]\nname = "plaintext"\n[[attacks]]\nname = "idlg"\nparams = { reconstruct = false }\n'
                     '[[attacks]]\nname = "random-guess"\n')
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/test_suite_cells.py"),
           "--leakbench-suite", str(suite), "--leakbench-out", str(out), "-k", "tiny and idlg_reconstruct_False",
           f"--benchmark-json={tmp_path / 'bench.json'}"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    [bench] = json.loads((tmp_path / "bench.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    assert (info["scenario"], info["defense"], info["attack"], info["status"]) == ("tiny", "plaintext", "idlg", "ok")
    assert info["attack_params"] == {"reconstruct": False} and info["federation_s"] > 0
    assert info["metric.label_acc"] == 1.0
    from bench.cli import main
    assert main(["leaderboard", "--out", str(out)]) == 0
    assert "plugin <em>notes</em>" in (out / "index.html").read_text()
