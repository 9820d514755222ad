"""A tiny text scenario runs end to end: bench/ holds no image assumption."""
import pytest

from bench.run.cells import run_group
from bench.run.spec import parse_suite


def test_lora_lm_on_sst2_runs_end_to_end(data_root):
    suite = parse_suite({"name": "text", "scenarios": [{
        "name": "sst2-lora", "dataset": "sst2", "model": "gpt2-lora", "num_clients": 2, "clients_per_round": 2,
        "rounds": 1, "max_train": 64, "max_test": 32, "seq_len": 16, "batch_size": 16, "lr": 0.01,
        "attack_batch_size": 2}], "defenses": [{"name": "plaintext"}, {"name": "fedhe-full"}],
        "attacks": [{"name": "mia-loss"}]})
    records = list(run_group([suite.cells[0]], data_root)) + list(run_group([suite.cells[1]], data_root))
    assert records[0]["status"] == "ok" and 0.0 <= records[0]["metrics"]["mia_auroc"] <= 1.0
    assert records[1]["status"] == "blocked" and "every entry is encrypted" in records[1]["reason"]
    for rec in records:
        assert rec["metrics"]["perplexity"] > 1.0
        assert rec["metrics"]["upload_bytes"] > 0
    assert records[1]["metrics"]["encrypted_fraction"] == pytest.approx(1.0)


def test_sst2_sentences_are_the_whole_dev_sentences(data_root):
    """sst2-sentences-cls holds GLUE's 872 dev sentences (split 90/10), not the train split's short phrases."""
    from bench.data.loading import resolve_data_root
    from bench.registry import DATASETS
    root = resolve_data_root(data_root)
    sentences = DATASETS.get("sst2-sentences-cls")(root, 0, 64)
    phrases = DATASETS.get("sst2-cls")(root, 0, 64, max_train=872)
    assert len(sentences.train_y) + len(sentences.test_y) == 872 and len(sentences.test_y) == 87
    mean_tokens = lambda d: float((d.train_x != d.pad_id).sum(1).float().mean())   # noqa: E731
    assert mean_tokens(sentences) > 20 > 14 > mean_tokens(phrases)


def test_a_large_set_gradient_sums_chunks_weighted_by_tokens(data_root):
    """fed.gradient over more sequences than the task's chunk equals one pass over all of them (the loss is
    the mean over every counted token, so chunks of padded sentences weigh by their tokens, not by one each)."""
    import torch

    from bench.data.loading import load_dataset, resolve_data_root
    from bench.federation.engine import build_federation
    from bench.federation.scenario import Scenario

    data = load_dataset("sst2", resolve_data_root(data_root), max_train=80, max_test=8, seq_len=16)
    scenario = Scenario(name="s", dataset="sst2", model="gpt2-lora", num_clients=1, clients_per_round=1,
                        max_train=80, seq_len=16, model_params={"n_embd": 32, "n_layer": 1, "n_head": 2})
    fed = build_federation(scenario, data)
    x, y = fed.clients[0].x, fed.clients[0].y
    lengths = (x != data.pad_id).sum(1)
    assert len(x) > fed.task.chunk and lengths.min() < lengths.max()   # chunks of unequal token counts
    chunked = fed.gradient(x, y)
    fed.model.zero_grad()
    fed.task.loss(fed.model, x, y).backward()
    params = dict(fed.model.named_parameters())
    for name in fed.names:
        torch.testing.assert_close(chunked[name], params[name].grad, rtol=1e-5, atol=1e-7)
    assert any(chunked[n].abs().sum() > 0 for n in fed.names)


def test_a_classifier_drops_padding_columns_and_computes_the_same_logits():
    """Columns that are padding in every row change no class logit, so the classifier skips them: same logits,
    same gradients, a shorter forward pass."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from bench.models.text import TextModel
    torch.manual_seed(0)
    net = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                                   pad_token_id=0, num_labels=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                                   attn_pdrop=0.0))
    x = torch.tensor([[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 0, 0, 0, 0, 0, 0]])
    widths = []
    net.transformer.wte.register_forward_hook(lambda m, i, o: widths.append(o.shape[1]))
    grads = []
    for classify in (False, True):
        net.zero_grad()
        out = TextModel(net, 0, "gpt2", 16, classify=classify)(x)
        out.sum().backward()
        grads.append((out.detach(), net.transformer.h[0].attn.c_attn.weight.grad.clone()))
    assert widths == [8, 3]
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6)


def test_a_gradient_over_many_sequences_is_taken_a_chunk_at_a_time_and_equals_the_whole_batchs():
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from bench.models import text
    torch.manual_seed(0)
    net = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                                   pad_token_id=0, num_labels=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                                   attn_pdrop=0.0))
    x = torch.randint(1, 50, (2 * text.GRAD_CHUNK + 5, 6))
    model = text.TextModel(net, 0, "gpt2", 16, classify=True)
    calls = []
    net.transformer.wte.register_forward_hook(lambda m, i, o: calls.append(len(o)))
    model(x).sum().backward()
    chunked = net.score.weight.grad.clone()
    assert calls[:3] == [text.GRAD_CHUNK, text.GRAD_CHUNK, 5]   # then recomputed in the backward pass
    net.zero_grad()
    net(input_ids=x).logits.sum().backward()
    assert torch.allclose(chunked, net.score.weight.grad, atol=1e-5)
    with torch.no_grad():
        calls.clear()
        model(x)
        assert calls == [len(x)]   # no gradient: one pass
