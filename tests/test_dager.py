"""DAGER: exact text recovery on small GPT-2 / LoRA / MiniLM models, its metrics, and load-time checks."""
import pytest
import torch

from attacks.dager.attack import visible_block
from attacks.dager.span import make_span, rank_of, spectrum
from bench.cli import main
from bench.protocol.attack import Reconstruction
from bench.protocol.evidence import Evidence
from bench.run.cells import run_group
from bench.run.spec import parse_suite
from metrics.text import exact_match, rouge1, rouge2, token_acc


def _suite(dataset, model, model_params, defenses=("plaintext",), attack_params=None, **scenario):
    sc = {"name": "s", "dataset": dataset, "model": model, "model_params": model_params, "num_clients": 1,
          "clients_per_round": 1, "rounds": 1, "max_train": 40, "max_test": 4, "seq_len": 64, "batch_size": 8,
          "lr": 0.01, "attack_batch_size": 2, "attack_repeats": 2, **scenario}
    return parse_suite({"name": "t", "scenarios": [sc], "defenses": [{"name": d} for d in defenses],
                        "attacks": [{"name": "dager", "params": attack_params or {}}]})


def _run(suite, root):
    return [r for cell in suite.cells for r in run_group([cell], root)]


def test_rank_keeps_a_weak_input_direction_above_the_float32_floor():
    """A float32 gradient whose weakest input direction is 1e-4 of the strongest (as at d = 768, B = 8):
    numpy's matrix_rank rule (2.7e-4 relative for 2304 x 768) drops it, the default keeps it."""
    gen = torch.Generator().manual_seed(0)
    x = torch.linalg.qr(torch.randn(768, 96, generator=gen, dtype=torch.float64))[0].T   # 96 orthonormal inputs
    scale = torch.logspace(0, -4, 96, dtype=torch.float64)
    grad = (torch.randn(2304, 96, generator=gen, dtype=torch.float64)
            @ torch.linalg.qr(torch.randn(96, 96, generator=gen, dtype=torch.float64))[0] * scale) @ x
    grad = grad.float()
    singular, _ = spectrum(grad)
    numpy_tol = float(singular[0]) * max(grad.shape) * torch.finfo(torch.float32).eps
    assert rank_of(singular, tuple(grad.shape), numpy_tol) < 96
    assert rank_of(singular, tuple(grad.shape), None) == 96


def test_span_distance_separates_members_from_random_vectors():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 64, generator=gen)
    grad = torch.randn(300, 10, generator=gen) @ x            # rows in span{x_t}
    singular, vecs = spectrum(grad)
    rank = rank_of(singular, tuple(grad.shape), None)
    assert rank == 10
    for span in (make_span(vecs, rank), make_span(vecs, 40)):   # basis and complement paths
        inside = span.distance(x)
        assert float(inside.max()) < 1e-5 if span.rank == 10 else True
    span = make_span(vecs, rank)
    assert float(span.distance(torch.randn(50, 64, generator=gen)).min()) > 0.5


def test_visible_block_keeps_only_fully_visible_rows_or_columns():
    grad = torch.arange(12.0).reshape(4, 3)
    vis = torch.ones(4, 3, dtype=torch.bool)
    vis[0, 1] = False
    block, coords = visible_block(grad, vis)
    assert coords is None and block.shape == (3, 3)
    vis[:, 2] = False
    vis[0, 1] = True
    block, coords = visible_block(grad, vis)
    assert coords.tolist() == [0, 1] and block.shape == (4, 2)


@pytest.mark.parametrize("lora", [False, True])
def test_cached_decoder_step_equals_the_full_forward(lora):
    """The one-position block-0 step over cached keys and values gives the full forward's layer-2 inputs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from attacks.dager.arch import Arch
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)).eval()
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.5)     # B = 0 would hide a wrong LoRA path
    arch = Arch(model, pad_id=0)
    prefixes, cand = torch.randint(1, 50, (3, 5)), torch.tensor([7, 11, 42, 3])
    keys, values = zip(*[arch.token_kv(prefixes[:, p], p)[2:] for p in range(5)])
    got = arch.next_layer2_inputs(torch.stack(keys, 1), torch.stack(values, 1), arch.token_kv(cand, 5), chunk=5)
    full = torch.cat([prefixes.repeat_interleave(4, 0), cand.repeat(3).unsqueeze(1)], 1)
    want = arch.layer_inputs(full)[:, -1].view(3, 4, -1)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(arch.layer_inputs(full[:1, :3])[0], arch.layer_inputs(full[:1])[0, :3], atol=1e-6)


def test_decoder_matching_and_rouge_metrics(data_root):
    from bench.data.loading import resolve_data_root
    from bench.data.text import encode, get_tokenizer
    tok = get_tokenizer(resolve_data_root(data_root))
    refs = ["a gripping film", "dull and slow"]
    x = encode(tok, refs, 8)

    class K:
        tokenizer = tok

    class T:
        pass
    truth = T()
    truth.x = x
    rec = Reconstruction(texts=["dull and slow", "a gripping movie"], extra={"matching": "decoder"})
    ev = Evidence(rec, truth, None, K())
    assert rec.extra == {"matching": "decoder"} and rouge1(ev) == pytest.approx((1.0 + 2 / 3) / 2)
    assert rec.extra["_matched"] == (["a gripping movie", "dull and slow"], refs)
    assert rouge2(ev) == pytest.approx(0.75) and exact_match(ev) == 0.5
    assert token_acc(ev) == pytest.approx(6 / 7)   # 'a gripping film' is 4 BPE tokens: 3 of 4, then 3 of 3


def test_token_set_metrics_by_hand():
    """The batch [5, 6, 6, 7] and [7, 8] (0 pads, a special token): {6, 7, 8, 9} recovered is 3 right of 4 (9 is
    not in the batch) of the 4 distinct (5 missed); against the 6 tokens with counts the bag overlaps in 3."""
    from metrics.text import bag_rouge1, token_f1, token_precision, token_recall

    class K:
        tokenizer = type("Tok", (), {"all_special_ids": [0]})()

    class T:
        x = torch.tensor([[5, 6, 6, 7], [7, 8, 0, 0]])
    ev = Evidence(Reconstruction(extra={"tokens": [6, 7, 8, 9, 0]}), T(), None, K())
    assert token_precision(ev) == 0.75 and token_recall(ev) == 0.75 and token_f1(ev) == 0.75
    assert bag_rouge1(ev) == pytest.approx(2 * 0.75 * 0.5 / 1.25)
    assert token_f1(Evidence(Reconstruction(texts=["a"]), T(), None, K())) is None   # no token set: no score


def test_gpt2_fedsgd_batch_is_recovered_exactly(data_root):
    suite = _suite("sst2-cls", "gpt2", {"n_embd": 128, "n_head": 4})
    [rec] = _run(suite, data_root)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["rouge1"] == 1.0 and rec["metrics"]["exact_match"] == 1.0   # (ROUGE-2 of a one-word
    assert rec["metrics"]["token_acc"] == 1.0                                            # sentence is 0 by definition)
    texts = rec["details"]["texts"][0]
    assert sorted(texts["recovered"]) == sorted(texts["reference"]) and len(texts["reference"]) == 2


def test_lora_grad_b_recovers_when_rank_exceeds_tokens(data_root):
    suite = _suite("sst2-cls", "gpt2-lora", {"n_embd": 128, "n_head": 4, "lora_r": 96}, attack_batch_size=1,
                   attack_repeats=1)
    [rec] = _run(suite, data_root)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["rouge1"] >= 0.99


def test_fully_encrypted_view_is_blocked_by_design(data_root):
    suite = _suite("sst2-cls", "gpt2", {"n_embd": 64, "n_head": 2, "train_embeddings": False}, defenses=("fedhe-full",),
                   attack_repeats=1)
    [he] = _run(suite, data_root)
    assert he["status"] == "blocked" and "empty" in he["reason"]


def test_dager_on_images_is_refused_at_load():
    from bench.federation.scenario import SpecError
    from bench.run.preflight import preflight

    suite = parse_suite({"name": "t", "scenarios": [{"name": "s", "dataset": "digits", "model": "mlp",
                         "num_clients": 1, "clients_per_round": 1, "rounds": 1, "max_train": 20, "max_test": 10}],
                         "defenses": [{"name": "plaintext"}], "attacks": [{"name": "dager"}]})
    with pytest.raises(SpecError, match="attack 'dager' cannot run in it: needs tokenized text"):
        preflight(suite, None)


def _toml(tmp_path, dataset="sst2-cls", model_params='{ n_embd = 64, n_head = 2 }', seq_len=64):
    path = tmp_path / "s.toml"
    path.write_text(f'''name = "x"
[[scenarios]]
name = "s"
dataset = "{dataset}"
model = "gpt2"
model_params = {model_params}
seq_len = {seq_len}
max_train = 20
max_test = 4
[[defenses]]
name = "plaintext"
[[attacks]]
name = "dager"
''')
    return str(path)


def test_text_scenarios_fail_at_load_with_one_line(tmp_path, capsys, data_root, monkeypatch):
    monkeypatch.delenv("LEAKBENCH_DATA", raising=False)
    out = str(tmp_path / "out")
    assert main(["run", _toml(tmp_path), "--out", out]) == 2                       # no data root
    assert "needs" in capsys.readouterr().err
    empty = tmp_path / "root"
    (empty / "text").symlink_to(__import__("pathlib").Path(data_root) / "text", target_is_directory=True) \
        if empty.mkdir() is None else None
    assert main(["run", _toml(tmp_path), "--out", out, "--data-root", str(empty)]) == 2   # no tokenizer
    err = capsys.readouterr().err
    assert "gpt2/vocab.json" in err and len(err.strip().splitlines()) == 1
    too_long = _toml(tmp_path, model_params='{ n_embd = 64, n_head = 2, n_positions = 16 }')
    assert main(["run", too_long, "--out", out, "--data-root", data_root]) == 2    # longer than positions
    err = capsys.readouterr().err
    assert "positions" in err and len(err.strip().splitlines()) == 1
    assert main(["run", _toml(tmp_path, seq_len=8), "--out", out, "--data-root", data_root]) == 2
    assert "seq_len" in capsys.readouterr().err


def _lora_upload_run(data_root, defense, rounds=1, lora_r=96, path="auto"):
    import defenses.shelora  # noqa: F401
    from bench.federation.budget import parse_label
    name, params = parse_label(defense)
    suite = parse_suite({"name": "t", "scenarios": [{
        "name": "s", "dataset": "sst2-cls", "model": "gpt2-lora", "num_clients": 1, "clients_per_round": 1,
        "model_params": {"n_embd": 128, "n_head": 4, "lora_r": lora_r}, "rounds": rounds, "attack_round": rounds - 1,
        "max_train": 40, "max_test": 4, "seq_len": 64, "batch_size": 8, "lr": 0.01, "attack_batch_size": 1,
        "attack_repeats": 1}],
        "defenses": [{"name": name, "params": params}], "attacks": [{"name": "dager", "params": {"lora_path": path}}]})
    [rec] = _run(suite, data_root)
    return rec


@pytest.mark.parametrize("defense,rounds,expect", [("flex-lora", 1, "ok"), ("she-lora(budget=0.05)", 1, "ok"),
                                                   ("she-lora(budget=0.05, init=server)", 1, "ok"),
                                                   ("plaintext", 2, "ok"), ("she-lora(budget=0.05)", 2, "tokens")])
def test_lora_factor_uploads(data_root, defense, rounds, expect):
    """Uploads of trained factors (uploads_weights): the attacker subtracts the global weights it sent. In the
    first round she-lora's plaintext B, A's plaintext columns in the upload (the client drew A0, B0 = 0 left A
    at it) and the 6 hidden columns solved for give DAGER everything; under init = server the server drew A0
    itself. After one aggregation the clients' factors come from decrypted columns, so the server no longer
    knows the global weights: DAGER reads the batch's token set alone (attacks/dager/tokens.py), no sentence.
    Plaintext LoRA in its second round (B != 0) is read through grad A. The token set needs the complement of
    the start's row space (n - r columns) wider than DAGER's rank cutoff: r = 32 there, not 96, of n = 128."""
    rec = _lora_upload_run(data_root, defense, rounds, lora_r=32 if expect == "tokens" else 96)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metrics"]["token_f1"] == 1.0   # every row reads the batch's token set
    if expect == "ok":
        assert rec["metrics"]["rouge1"] >= 0.99
    else:
        assert "rouge1" not in rec["metrics"]
    info = (rec["details"].get("attack_info") or [{}])[0]
    if defense == "she-lora(budget=0.05)" and rounds == 1:   # 6 of 128 columns hidden per matrix, solved
        assert info["hidden_columns_l1"] == info["hidden_columns_l2"] == 6
        assert info["solved_l1"] >= 9 and info["solved_l2"] >= 9
    elif expect == "ok":
        assert "hidden_columns_l1" not in info


def test_client_drawn_a0_blocks_dager_only_when_the_path_needs_what_is_hidden(data_root):
    """With all of A under CKKS and A0 drawn by the client, the server knows no column of the A that maps
    grad B back to the inputs (factor-b), and sees no entry of grad A (factor-a). With A mostly in clear the
    factor-a path is still blocked: grad A needs the A the client started from."""
    for path, budget, why in (("factor-b", 1.0, "no column of A"), ("factor-a", 1.0, "entirely hidden"),
                              ("factor-a", 0.05, "grad A needs")):
        rec = _lora_upload_run(data_root, f"she-lora(budget={budget})", lora_r=4, path=path)
        assert rec["status"] == "blocked" and why in rec["reason"], rec["reason"]
