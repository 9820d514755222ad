"""Plugins installed as real distributions: a broken one beside a good one is contained, an edit
recomputes exactly the plugin's cells (and rebuilds the catalog), the two plugins of docs/plugins.md run
through the command line, and the project's own tests pass with a third-party plugin installed."""
import json
import os
import re
import subprocess
import sys
import tomllib

from bench.cli import main
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from bench.run.store import Store
from tests.plugin_kit import ROOT, suite_toml
from tests.test_plugins import DEF_EP, GOOD

BROKEN = {"leakbench.defenses": {"broken": "brokn_plugin:Broken"}}   # a typo in the module path
BROKEN_LINE = ("leakbench: defense 'broken' (plugin broken-plugin 2.0, entry point leakbench.defenses: broken = "
               "brokn_plugin:Broken) refused: cannot be imported: ModuleNotFoundError: No module named "
               "'brokn_plugin'; fix or uninstall broken-plugin")


def test_broken_plugin_is_contained_and_named(site, tmp_path):
    """Mistake 3: one broken entry point used to break every command with a 35-line traceback, exit 1."""
    site.write("sign-plugin", {"sign_plugin.py": GOOD}, DEF_EP)
    site.write("broken-plugin", {"broken_plugin.py": "class Broken: pass\n"}, BROKEN, version="2.0")
    listed = site.cli("list", "defenses")
    assert listed.returncode == 0 and listed.stderr.strip() == BROKEN_LINE, listed.stderr
    assert "sign " in listed.stdout and "plaintext" in listed.stdout
    smoke = site.cli("run", "smoke", "--out", str(tmp_path / "smoke"))
    assert smoke.returncode == 0, smoke.stderr
    assert smoke.stderr.count("leakbench: ") == 1 and BROKEN_LINE in smoke.stderr
    named = site.cli("run", str(suite_toml(tmp_path / "s.toml", ["plaintext", "broken"], ["idlg"])),
                     "--out", str(tmp_path / "named"))
    assert named.returncode == 2 and named.stderr.strip().count("\n") == 0, named.stderr
    assert named.stderr.startswith("leakbench: error: suite ") and BROKEN_LINE[11:] in named.stderr
    assert not (tmp_path / "named").exists()


def _fingerprints(out) -> dict[str, str]:
    store = Store(out / "leakbench.sqlite")
    try:
        return {f"{r['defense']}/{r['attack']}": r["environment"]["fingerprint"] for r in store.records()}
    finally:
        store.close()


def test_editing_a_plugin_recomputes_exactly_its_cells(site, tmp_path):
    """Mistake 2: the fingerprint covered only LeakBench's packages, so an edit kept the old numbers."""
    site.install("sign-plugin", {"sign_plugin.py": GOOD}, DEF_EP)
    suite = load_suite(suite_toml(tmp_path / "s.toml", ["plaintext", "sign"], ["random-guess", "no-attack"]))
    first = run_suite(suite, tmp_path / "out")
    assert (first.ok, first.stale) == (4, 0)
    before = _fingerprints(tmp_path / "out")
    assert run_suite(suite, tmp_path / "out").skipped == 4
    site.install("sign-plugin", {"sign_plugin.py": GOOD.replace("t.abs().mean()", "t.abs().max()")}, DEF_EP)
    plan = dict(run_suite(suite, tmp_path / "out", dry_run=True).plan)
    assert plan == {"tiny/plaintext/random-guess": "done", "tiny/plaintext/no-attack": "done",
                    "tiny/sign/random-guess": "stale", "tiny/sign/no-attack": "stale"}
    again = run_suite(suite, tmp_path / "out")
    assert (again.ok, again.skipped, again.stale) == (2, 2, 2)
    after = _fingerprints(tmp_path / "out")
    assert {k for k in after if after[k] != before[k]} == {"sign/random-guess", "sign/no-attack"}
    assert run_suite(suite, tmp_path / "out").skipped == 4


def test_catalog_follows_the_plugin_sources(site, capsys):
    """Mistake 2: `leakbench list` was cached on entry-point names, so a new metric stayed invisible."""
    metric = '''
        import bench

        @bench.metric("alpha_leak", "", True, "privacy", "first metric")
        def alpha(ev):
            return None
    '''
    eps = {"leakbench.metrics": {"leaky": "leaky_metrics"}}
    site.install("leaky-metrics", {"leaky_metrics.py": metric}, eps)
    assert main(["list", "metrics"]) == 0
    assert "alpha_leak" in capsys.readouterr().out
    site.install("leaky-metrics", {"leaky_metrics.py": metric + '''
        @bench.metric("beta_leak", "", True, "privacy", "a metric added later")
        def beta(ev):
            return None
    '''}, eps)
    assert main(["list", "metrics"]) == 0
    assert "beta_leak" in capsys.readouterr().out


def _doc_projects() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The `# file: PATH` code blocks of docs/plugins.md: {project folder: {path in it: text}}, and the
    files outside any project."""
    blocks = re.findall(r"```\w*\n# file: (\S+)\n(.*?)```", (ROOT / "docs" / "plugins.md").read_text(), flags=re.S)
    projects: dict[str, dict[str, str]] = {}
    loose = {}
    for path, text in blocks:
        folder, _, rest = path.partition("/")
        if rest:
            projects.setdefault(folder, {})[rest] = text
        else:
            loose[path] = text
    return projects, loose


def test_the_docs_plugin_examples_run_through_the_cli(site, tmp_path):
    projects, loose = _doc_projects()
    assert set(projects) == {"leakbench-quantize", "leakbench-bias-counts"} and "quantize-demo.toml" in loose
    for files in projects.values():   # each installed as pip would: its package, and its entry points
        meta = tomllib.loads(files.pop("pyproject.toml"))["project"]
        site.write(meta["name"], files, meta["entry-points"], version=meta["version"])
    listed = site.cli("list", "defenses")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert "quantize                 rounds every upload entry to 2**bits levels" in listed.stdout
    (tmp_path / "quantize-demo.toml").write_text(loose["quantize-demo.toml"])
    run = site.cli("run", str(tmp_path / "quantize-demo.toml"), "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert "suite quantize-demo: 6 ok, 0 blocked, 0 diverged, 0 failed" in run.stdout
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    by = {(r["defense"], json.dumps(r["defense_params"]), r["attack"]): r for r in records}
    plain = by[("plaintext", "{}", "bias-counts")]
    coarse = by[("quantize", '{"bits": 1}', "bias-counts")]
    assert plain["metrics"]["lnacc"] == 1.0 and plain["environment"]["plugins"].keys() == {"leakbench-bias-counts"}
    assert coarse["metrics"]["quantization_error"] > 0.1 and coarse["environment"]["plugins"].keys() == {
        "leakbench-bias-counts", "leakbench-quantize"}


def test_project_tests_pass_with_a_third_party_plugin(site):
    """Mistake 5: the project's tests must not depend on which plugins a machine has installed."""
    site.write("sign-plugin", {"sign_plugin.py": GOOD + '''
    @bench.metric("sign_metric", "", None, "privacy", "a third-party metric on every cell")
    def sign_metric(ev):
        return None
    '''}, {**DEF_EP, "leakbench.metrics": {"sign-metric": "sign_plugin"}})
    env = {"PYTHONPATH": str(site.path), "LEAKBENCH_CACHE": str(site.cache)}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_registry.py",
                          "tests/test_e2e_grid.py::test_defense_runs_against_every_image_attack[plaintext]"],
                         cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
