"""DAGER's pruned search returns the sentences of the plain search, and says when its span check saturates.

The plain search (every (prefix, token) pair through block 0 in float32, fall-backs from the start, every
vocabulary token at every position) lives in tests/dager_reference.py. The fast tests compare the two on
the same uploads of small models; the heavy test reruns batches of the committed dager leaderboard from
their stored configuration and compares each recovered sentence with the stored one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.registry import ATTACKS
from bench.run.cells import federate
from bench.run.spec import parse_suite
from tests.dager_reference import reference_dager

COMMITTED = Path(__file__).resolve().parents[1] / "leaderboards" / "results" / "dager" / "results.json"


@pytest.fixture(autouse=True)
def bfloat16_pretest(monkeypatch):
    """The pre-test in bfloat16 even where it is emulated (the pinned AVX2 path, bench/run/numerics.py, where the
    search runs it in float32): the fast tests compare the bfloat16 pre-test with the plain search."""
    import attacks.dager.arch
    monkeypatch.setattr(attacks.dager.arch, "native_bfloat16", lambda device: True)


def _targets(root, model, params, batch, repeats=2, **scenario):
    sc = {"name": "s", "dataset": "sst2-cls", "model": model, "model_params": params, "num_clients": 1,
          "clients_per_round": 1, "rounds": 1, "max_train": 80, "max_test": 4, "seq_len": 64, "batch_size": 8,
          "lr": 0.01, "attack_batch_size": batch, "attack_repeats": repeats, **scenario}
    suite = parse_suite({"name": "t", "scenarios": [sc], "defenses": [{"name": "plaintext"}],
                         "attacks": [{"name": "dager"}]})
    return list(federate(suite.cells[0], root).targets)


def _both(target, seed: int):
    """(fast, plain) reconstructions of one upload, and the extensions each search tested per position."""
    attack = ATTACKS.get("dager")()
    fast = attack.run(target.view, target.knowledge, seed)
    counts: dict = {}
    with reference_dager(counts):
        plain = attack.run(target.view, target.knowledge, seed)
    return fast, plain, counts


@pytest.mark.parametrize("model,params,batch", [
    ("gpt2", {"n_embd": 128, "n_head": 4, "train_embeddings": False}, 4),
    ("gpt2", {"n_embd": 64, "n_head": 2, "train_embeddings": False}, 8),     # rank at the cap: fall-backs used
    ("gpt2-lora", {"n_embd": 128, "n_head": 4, "lora_r": 96}, 2),
])
def test_pruned_search_returns_the_plain_searchs_sentences(data_root, model, params, batch):
    for i, target in enumerate(_targets(data_root, model, params, batch)):
        fast, plain, _ = _both(target, i)
        assert fast.texts == plain.texts
        assert fast.extra["passed_l2"] == plain.extra["passed_l2"]
        assert fast.extra["saturated"] == plain.extra["saturated"]


def test_layer2_distances_in_small_blocks_change_no_sentence(data_root, monkeypatch):
    """The layer-2 distances are taken a block of (prefix, candidate) pairs at a time (memory on a late step):
    blocks of one prefix each give the plain search's sentences."""
    from attacks.dager.arch import Arch

    whole = Arch.layer2_distances
    blocks = []

    def small(self, keys, values, step, distance, coarse=False, chunk=4096):
        blocks.append(len(keys))
        return whole(self, keys, values, step, distance, coarse=coarse, chunk=1)

    monkeypatch.setattr(Arch, "layer2_distances", small)
    [target] = _targets(data_root, "gpt2", {"n_embd": 128, "n_head": 4, "train_embeddings": False}, 4, repeats=1)
    fast, plain, _ = _both(target, 0)
    assert fast.texts == plain.texts and max(blocks) > 1


def test_saturated_span_vouches_for_no_sentence(data_root):
    """d = 64 with 8 sentences: the rank reaches the cap (64 - 20), so no sentence counts as exact."""
    [target] = _targets(data_root, "gpt2", {"n_embd": 64, "n_head": 2, "train_embeddings": False}, 8, repeats=1)
    rec = ATTACKS.get("dager")().run(target.view, target.knowledge, 0)
    assert rec.extra["rank"] == 64 - 20 and rec.extra["saturated"] is True
    assert rec.extra["exact"] == 0
    [unsaturated] = _targets(data_root, "gpt2", {"n_embd": 128, "n_head": 4, "train_embeddings": False}, 1,
                             repeats=1)
    rec = ATTACKS.get("dager")().run(unsaturated.view, unsaturated.knowledge, 0)
    assert rec.extra["saturated"] is False and rec.extra["exact"] == 1


@pytest.mark.heavy
@pytest.mark.parametrize("scenario,batches", [("sst2-gpt2-b16", [0]), ("sst2-gpt2-b32", [0, 3])])
def test_committed_batches_are_recovered_sentence_for_sentence(data_root, scenario, batches, monkeypatch):
    """Batch 3 of B = 32 reached the rank cap (748): stored with every sentence 'exact' and ROUGE-1 0.46, it is
    now flagged saturated with the same sentences. The client draws its batches one after another from one seeded
    generator, so federating only the first max(batches) + 1 of them gives the committed batches (a change to how
    they are drawn fails this test).

    The search's bfloat16 pre-test runs in float32 here: a CPU without bfloat16 instructions (AVX2 only) emulates
    it about 40 times slower than float32 (B = 32's batch 0 had not finished in 10 minutes). By the search's
    design both give the same sentences; the fast tests above compare the bfloat16 pre-test with the plain search."""
    from attacks.dager.arch import Arch
    monkeypatch.setattr(Arch, "coarse_layer2_inputs", Arch.next_layer2_inputs)
    [rec] = [r for r in json.loads(COMMITTED.read_text()) if r["scenario"] == scenario and r["defense"] == "plaintext"]
    scenario_config = {**rec["config"]["scenario"], "attack_repeats": max(batches) + 1}
    suite = parse_suite({"name": "dager", "scenarios": [scenario_config],
                         "defenses": [rec["config"]["defense"]], "attacks": [rec["config"]["attack"]]})
    cell = suite.cells[0]
    targets = federate(cell, data_root).targets
    attack = ATTACKS.get("dager")(**rec["config"]["attack"]["params"])
    for i in batches:
        out = attack.run(targets[i].view, targets[i].knowledge, cell.scenario.seed * 1000 + i)
        assert sorted(out.texts) == sorted(rec["details"]["texts"][i]["recovered"])   # a batch has no order
        assert out.extra["saturated"] == (rec["details"]["attack_info"][i]["rank"] == 748)


def _small_gpt2_spans(data_root):
    """(target, Arch, layer spans) of one B = 2 upload of a 64-wide random-init GPT-2, as the attack builds them."""
    from attacks.dager.arch import Arch
    [target] = _targets(data_root, "gpt2", {"n_embd": 64, "n_head": 2, "train_embeddings": False}, 2, repeats=1)
    model = target.knowledge.build_model()
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, value in target.knowledge.global_params.items():
            state[name].copy_(value)
    arch = Arch(model.eval(), int(target.knowledge.tokenizer.pad_token_id))
    spans, *_ = ATTACKS.get("dager")()._spans(target.view, target.knowledge, arch, state)
    return target, arch, spans


def test_a_batch_whose_first_tokens_all_fail_falls_back_as_the_plain_search_does(data_root):
    """l2 = 0: no first token passes layer 2, so the exact pass has nothing to extend (a saturated B = 64 batch
    reaches this); the search then keeps the closest failing tokens, as the plain search does from the start."""
    from attacks.dager.decoder import decoder_search
    from tests.dager_reference import reference_decoder_search
    _, arch, spans = _small_gpt2_spans(data_root)
    tokens = [list(range(50, 60))] * 4
    (exact, fallbacks, stopped) = decoder_search(arch, spans[1], tokens, 2, 0.0)
    (plain_exact, plain_fallbacks) = reference_decoder_search(arch, spans[1], tokens, 2, 0.0)
    assert exact == plain_exact == [] and fallbacks and stopped is None
    assert [seq for seq, _ in fallbacks] == [seq for seq, _ in plain_fallbacks]
    # the same distances, summed in another order by the two searches' float32 products (last digits differ)
    assert [d for _, d in fallbacks] == pytest.approx([d for _, d in plain_fallbacks], rel=1e-5)


def test_a_step_where_too_many_prefixes_pass_layer2_stops_the_search_and_flags_the_batch(data_root, monkeypatch):
    """l2 = 10 lets every extension through, as a span covering most of the input space does: with a cap of
    3 prefixes the search stops at the first step past it, and the attack flags the batch saturated (0 exact)."""
    import functools

    import attacks.dager.attack as dager
    from attacks.dager.decoder import decoder_search
    target, arch, spans = _small_gpt2_spans(data_root)
    attack = ATTACKS.get("dager")()
    tokens = [[50, 51], [52, 53], [54, 55]]
    exact, _, stopped = decoder_search(arch, spans[1], tokens, 2, 10.0, max_prefixes=3)
    assert stopped == 1 and sorted(s for s, _ in exact) == [[50], [51]]     # 4 extensions passed step 1
    assert decoder_search(arch, spans[1], tokens, 2, 10.0, max_prefixes=8)[2] is None   # 8 pass step 2
    clean = attack.run(target.view, target.knowledge, 0)
    assert not clean.extra["saturated"] and clean.extra["saturated_at"] is None and clean.extra["exact"] == 2
    monkeypatch.setattr(dager, "decoder_search", functools.partial(decoder_search, max_prefixes=1))
    out = attack.run(target.view, target.knowledge, 0)
    assert out.extra["saturated"] and out.extra["saturated_at"] >= 1 and out.extra["exact"] == 0
