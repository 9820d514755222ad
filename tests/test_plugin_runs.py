"""Plugins installed as real distributions: a broken one beside a good one is contained, and an edit
recomputes exactly the plugin's cells (and rebuilds the catalog)."""
import json

from bench.cli import main
from bench.run.runner import run_suite
from bench.run.spec import load_suite
from bench.run.store import Store
from tests.plugin_kit import suite_toml
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
