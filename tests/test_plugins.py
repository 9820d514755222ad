"""Plugins against their contracts: each mistake a plugin author can make is one line naming the
distribution, the entry point and the fix, exit 2 and nothing run when found at load; a hook's result of
the wrong type is a failed cell naming the plugin and the type expected (exit 1)."""
import json

import pytest

from bench.cli import main
from bench.registry import ATTACKS, DATASETS, DEFENSES, METRICS, MODELS, PluginError
from tests.plugin_kit import suite_toml

GOOD = '''
    import torch
    import bench

    class SignDefense(bench.Defense):
        """uploads each entry's sign times its tensor's mean magnitude"""

        def encode(self, fed, client, update, weight):
            return bench.dense_payload({n: t.sign() * t.abs().mean() for n, t in update.items()})
'''
DEF_EP = {"leakbench.defenses": {"sign": "sign_plugin:SignDefense"}}


def _install_defense(site, body: str, dist: str = "sign-plugin") -> None:
    site.install(dist, {"sign_plugin.py": GOOD.replace(
        '''        def encode(self, fed, client, update, weight):
            return bench.dense_payload({n: t.sign() * t.abs().mean() for n, t in update.items()})
''', body)}, DEF_EP)


def _run(tmp_path, capsys, defenses=("sign",), attacks=("idlg",)) -> tuple[int, str]:
    suite = suite_toml(tmp_path / "suite.toml", list(defenses), list(attacks))
    code = main(["run", str(suite), "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err.strip()


def _refused(err: str, *parts: str) -> None:
    """The suite was refused at load in one line naming the plugin's distribution and entry point."""
    last = err.splitlines()[-1]
    assert last.startswith("leakbench: error: ") and "plugin sign-plugin 1.0" in last, err
    assert "entry point leakbench.defenses: sign = sign_plugin:SignDefense" in last, last
    for part in parts:
        assert part in last, last


def test_a_good_plugin_runs_and_is_listed(site, tmp_path, capsys):
    site.install("sign-plugin", {"sign_plugin.py": GOOD}, DEF_EP)
    assert DEFENSES.entry("sign").origin.dist == "sign-plugin"
    assert main(["list", "defenses"]) == 0
    assert "uploads each entry's sign" in capsys.readouterr().out
    code, err = _run(tmp_path, capsys)
    assert code == 0 and "refused" not in err, err


def test_misspelled_hook_is_refused_with_the_hook_it_meant(site, tmp_path, capsys):
    """Mistake 1: `encode_update` for `encode` used to publish plaintext as a defense."""
    _install_defense(site, '''        def encode_update(self, fed, client, update, weight):
            return bench.dense_payload(update)
''')
    assert main(["list", "defenses"]) == 0       # everything else keeps working; the refusal is on stderr
    out = capsys.readouterr()
    assert "sign " not in out.out and "did you mean `encode`?" in out.err
    code, err = _run(tmp_path, capsys)
    assert code == 2 and "\n" not in err
    _refused(err, "SignDefense.encode_update is no hook of bench.Defense; did you mean `encode`?")
    assert not (tmp_path / "out").exists()     # nothing ran, nothing was written


def test_wrong_hook_signature_is_refused(site, tmp_path, capsys):
    _install_defense(site, '''        def encode(self, fed, client, update):
            return bench.dense_payload(update)
''')
    code, err = _run(tmp_path, capsys)
    assert code == 2
    _refused(err, "SignDefense.encode(self, fed, client, update) cannot be called as",
             "use `def encode(self, fed, client, update, weight)`")


def test_a_defense_that_changes_no_upload_is_refused(site, tmp_path, capsys):
    _install_defense(site, '''        def run_metrics(self, fed):
            return {}
''')
    code, err = _run(tmp_path, capsys)
    assert code == 2
    _refused(err, "overrides neither encode nor adapt_model", "reference_row = True")


def test_a_declared_reference_row_needs_no_upload_hook(site, tmp_path, capsys):
    _install_defense(site, '''        reference_row = True
''')
    assert "sign" in DEFENSES.names()


def test_class_not_deriving_from_defense_is_refused(site, tmp_path, capsys):
    """Mistake 6: used to be `AttributeError: ... 'cipher_target'`, exit 1."""
    site.install("sign-plugin", {"sign_plugin.py": GOOD.replace("(bench.Defense)", "")}, DEF_EP)
    code, err = _run(tmp_path, capsys)
    assert code == 2
    _refused(err, "SignDefense does not derive from bench.Defense; declare it `class SignDefense(bench.Defense)`")


def test_constructor_that_skips_the_base_is_refused_at_suite_load(site, tmp_path, capsys):
    """Mistake 6: a class that skipped super().__init__ used to run with no sign of trouble."""
    _install_defense(site, '''        def __init__(self, scale: float = 1.0):
            self.scale = scale

        def encode(self, fed, client, update, weight):
            return bench.dense_payload({n: t * self.scale for n, t in update.items()})
''')
    code, err = _run(tmp_path, capsys)
    assert code == 2 and "\n" not in err
    _refused(err, "SignDefense.__init__ does not call super().__init__; add super().__init__(scale=scale)")


def test_encode_returning_a_dict_names_the_plugin_and_the_type(site, tmp_path, capsys):
    """Mistake 6: used to be `'dict' object has no attribute 'plain'`."""
    _install_defense(site, '''        def encode(self, fed, client, update, weight):
            return update
''')
    code, err = _run(tmp_path, capsys)
    assert code == 1
    assert ("leakbench: failed: tiny/sign/idlg: ContractError: defense 'sign' (plugin sign-plugin 1.0, entry point "
            "leakbench.defenses: sign = sign_plugin:SignDefense): encode returned dict, expected a bench.Payload "
            "(plaintext entries: bench.dense_payload(update))") in err, err


def test_unregistered_run_metric_is_an_error_with_the_fix(site, tmp_path, capsys):
    """Mistake 4: a run metric under an unregistered name used to be dropped without a word."""
    _install_defense(site, '''        def encode(self, fed, client, update, weight):
            return bench.dense_payload(update)

        def run_metrics(self, fed):
            return {"sign_share": 0.5}
''')
    code, err = _run(tmp_path, capsys)
    assert code == 1
    assert "run_metrics returned 'sign_share', which is no registered run metric; register it in the defense's " \
           "module with bench.run_metric('sign_share', unit, lower_is_better, kind, description)" in err, err


def test_registered_run_metric_and_details_are_kept(site, tmp_path, capsys):
    site.install("sign-plugin", {"sign_plugin.py": GOOD.replace("    class SignDefense", '''    bench.run_metric("sign_share", "", None, "cost", "share of entries sent as a sign")

    class SignDefense''').replace("for n, t in update.items()})", '''for n, t in update.items()})

        def run_metrics(self, fed):
            return {"sign_share": 1.0, "sign_details": {"rounds": 1}}''')}, DEF_EP)
    code, err = _run(tmp_path, capsys)
    assert code == 0, err
    rec = json.loads((tmp_path / "out" / "results.json").read_text())[0]
    assert rec["metrics"]["sign_share"] == 1.0 and rec["details"]["sign_details"] == {"rounds": 1}
    assert METRICS.entry("sign_share").origin.dist == "sign-plugin"


def test_attack_contract(site, tmp_path, capsys):
    attack = '''
        import bench

        class Guess(bench.Attack):
            """guesses nothing"""
            family = "label"

            def run(self, view, knowledge, seed):
                return {BODY}
    '''
    eps = {"leakbench.attacks": {"guess": "guess_plugin:Guess"}}
    site.install("guess-plugin", {"guess_plugin.py": attack.replace("{BODY}", "[0]")}, eps)
    code, err = _run(tmp_path, capsys, defenses=("plaintext",), attacks=("guess",))
    assert code == 1 and "attack 'guess' (plugin guess-plugin 1.0, entry point leakbench.attacks: guess = " \
                         "guess_plugin:Guess): run returned list, expected a bench.Reconstruction" in err, err
    site.install("guess-plugin", {"guess_plugin.py": attack.replace("{BODY}", "bench.Reconstruction()").replace(
        "def run(self, view, knowledge, seed)", "def run(self, view, knowledge)")}, eps)
    assert "guess" not in ATTACKS.names()
    assert "cannot be called as self, view, knowledge, seed" in ATTACKS.refused["guess"]
    site.install("guess-plugin", {"guess_plugin.py": attack.replace("{BODY}", "bench.Reconstruction()").replace(
        'family = "label"', 'family = "labels"')}, eps)
    assert "Guess.family is 'labels'; set one of label, image" in ATTACKS.refused["guess"]
    site.install("guess-plugin", {"guess_plugin.py": attack.replace("{BODY}", "bench.Reconstruction()").replace(
        "def run(", "def blocks(self, view, knowledge):\n                return None\n\n            def run(")}, eps)
    code, err = _run(tmp_path, capsys, defenses=("plaintext",), attacks=("guess",))
    assert code == 2 and "Guess.blocks is no hook of bench.Attack; did you mean `blocked`?" in err, err


def test_metric_dataset_and_model_contracts(site, tmp_path, capsys):
    site.install("odd-plugin", {"odd_plugin.py": '''
        import torch
        import bench

        def half(ev):
            """a plain function, never registered"""
            return 0.5

        @bench.metric("listy", "", None, "privacy", "returns a list")
        def listy(ev):
            return [1.0]

        def loader(root, seed):
            """a loader without seq_len"""

        def tuple_loader(root, seed, seq_len):
            """digits as a tuple"""
            return (1, 2)

        def factory(data, width):
            """a factory whose width has no default"""
            return torch.nn.Linear(1, 1)
    '''}, {"leakbench.metrics": {"half": "odd_plugin:half", "listy": "odd_plugin"},
           "leakbench.datasets": {"odd-data": "odd_plugin:loader", "tuple-data": "odd_plugin:tuple_loader"},
           "leakbench.models": {"odd-model": "odd_plugin:factory"}})
    assert "half is not a registered metric; decorate the function with @bench.metric(" in METRICS.refused["half"]
    assert "loader(root, seed) cannot be called as data_root, seed, seq_len" in DATASETS.refused["odd-data"]
    assert "factory parameter 'width' has no default" in MODELS.refused["odd-model"]
    with pytest.raises(PluginError, match="plugin odd-plugin 1.0, entry point leakbench.models: odd-model"):
        MODELS.get("odd-model")
    code, err = _run(tmp_path, capsys, defenses=("plaintext",), attacks=("random-guess",))
    assert code == 1 and "metric 'listy' (plugin odd-plugin 1.0, entry point leakbench.metrics: listy = " \
                         "odd_plugin): compute returned list, expected a number" in err, err
    suite = suite_toml(tmp_path / "t.toml", ["plaintext"], ["random-guess"], dataset="tuple-data")
    assert main(["run", str(suite), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "dataset 'tuple-data' (plugin odd-plugin 1.0" in err and "returned tuple, expected a bench.Dataset" in err


def test_a_plugin_may_not_take_a_builtin_name(site):
    site.install("sign-plugin", {"sign_plugin.py": GOOD}, {"leakbench.defenses": {"plaintext": "sign_plugin:SignDefense"}})
    assert DEFENSES.entry("plaintext").origin is None
    assert "the name 'plaintext' is taken by a built-in defense; rename the entry point" in DEFENSES.refused["plaintext"]


def test_project_tests_ignore_installed_plugins(site):
    """Mistake 5: installing any plugin used to fail tests/test_registry.py's grid coverage."""
    site.install("sign-plugin", {"sign_plugin.py": GOOD}, DEF_EP)
    assert "sign" in DEFENSES.names() and "sign" not in DEFENSES.builtins()
    from tests.test_registry import test_every_builtin_defense_and_attack_is_in_the_e2e_grid
    test_every_builtin_defense_and_attack_is_in_the_e2e_grid()


def test_every_builtin_passes_its_contract():
    from bench.protocol import contracts
    checks = {DEFENSES: contracts.check_defense, ATTACKS: contracts.check_attack, METRICS: contracts.check_metric,
              DATASETS: contracts.check_dataset, MODELS: contracts.check_model}
    faults = {f"{reg.kind}/{name}": fault for reg, check in checks.items() for name in reg.builtins()
              if (fault := check(reg.get(name))) is not None}
    assert not faults
    assert {n for n in DEFENSES.builtins() if DEFENSES.get(n).reference_row} == {"plaintext", "base"}
