"""DAGER speed: one attacked batch end to end (span, layer-1 token filter, layer-2 search).

Run with `pytest tests/benchmarks/test_bench_dager.py -m heavy` (CI: `-m heavy -k smoke`). The
target is one B = 4 SST-2 batch on the d = 768 GPT-2 architecture in <= 60 s on 2 CPU cores; the
smoke variant runs the same path on a d = 64 model. The federated run that produces the upload
is set up outside the timed call; recovery must be exact in both.
"""
from __future__ import annotations

import os
import time

import pytest

from bench.protocol.evidence import Evidence
from bench.registry import ATTACKS
from bench.run.cells import federate
from bench.run.spec import parse_suite
from metrics.text import exact_match, rouge1

CASES = {"smoke": ({"n_embd": 64, "n_head": 2}, 1, None), "d768": ({"n_embd": 768}, 4, 60.0)}


@pytest.mark.heavy
@pytest.mark.parametrize("case", list(CASES))
def test_dager_one_batch(benchmark, case):
    root = os.environ.get("LEAKBENCH_DATA")
    if not root:
        pytest.skip("needs the data root (SST-2 and the GPT-2 tokenizer): set LEAKBENCH_DATA")
    params, batch, target_s = CASES[case]
    suite = parse_suite({"name": "b", "scenarios": [{
        "name": "s", "dataset": "sst2-cls", "model": "gpt2", "model_params": {**params, "train_embeddings": False},
        "num_clients": 1, "clients_per_round": 1, "rounds": 1, "max_train": 64, "max_test": 4, "seq_len": 64,
        "lr": 0.01, "attack_batch_size": batch}], "defenses": [{"name": "plaintext"}], "attacks": [{"name": "dager"}]})
    target = federate(suite.cells[0], root).targets[0]
    attack = ATTACKS.get("dager")()
    start = time.perf_counter()
    rec = benchmark.pedantic(attack.run, args=(target.view, target.knowledge, 0), rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    ev = Evidence(rec, target.truth, target.view, target.knowledge)
    benchmark.extra_info.update({"batch": batch, "n_embd": params["n_embd"], "seconds": seconds,
                                 "rouge1": rouge1(ev), "exact_match": exact_match(ev),
                                 **{k: v for k, v in rec.extra.items() if k.endswith("_s") or k == "rank"}})
    assert rouge1(ev) == 1.0 and exact_match(ev) == 1.0
    if target_s is not None:
        assert seconds <= target_s, f"one B={batch} batch took {seconds:.1f} s (target {target_s} s)"
