"""Membership inference: metric definitions, and every attack's score direction on separable data.

Separable data: a model that memorized random-label (image) or random-text (LM) members, scored
against fresh non-members of the same distribution. Each attack must reach AUROC > 0.9, and
< 0.1 with the labels flipped (the score-direction check of anchors A1/A8).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.protocol.attack import Reconstruction
from bench.protocol.evidence import Evidence
from bench.protocol.view import Knowledge, MembershipKnowledge, ServerView
from bench.registry import ATTACKS
from metrics import membership as mm

# ----------------------------------------------------------------------------- metrics

def test_tpr_at_fpr_is_max_tpr_with_fpr_at_most_alpha():
    labels = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    scores = np.array([0.9, 0.8, 0.3, 0.2, 0.85, 0.1, 0.05, 0.0])
    assert mm.tpr_at_fpr(scores, labels, 0.0) == pytest.approx(0.25)
    assert mm.tpr_at_fpr(scores, labels, 0.25) == pytest.approx(1.0)
    assert mm.fpr_at_tpr(scores, labels, 0.95) == pytest.approx(0.25)
    assert mm.balanced_accuracy(scores, labels) == pytest.approx(0.875)
    assert mm.auroc(scores, labels) == pytest.approx(13 / 16)


def test_bootstrap_interval_brackets_auroc_and_nan_scores_are_counted():
    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(300), np.zeros(300)].astype(int)
    scores = rng.normal(size=600) + 0.8 * labels
    lo, hi = mm.bootstrap_auroc(scores, labels)
    assert lo < mm.auroc(scores, labels) < hi and hi - lo < 0.15
    scores[:3] = np.nan
    truth = type("T", (), {"member": labels})()
    details = mm.membership_details(Evidence(Reconstruction(scores=scores), truth))
    assert details["n_dropped"] == 3 and details["n_members"] == 297 and details["n_nonmembers"] == 300
    assert len(details["scores"]) == len(details["labels"]) == 600


def test_tpr_at_0_1_fpr_needs_1000_nonmembers():
    truth = type("T", (), {"member": np.r_[np.ones(50), np.zeros(999)].astype(int)})()
    ev = Evidence(Reconstruction(scores=np.arange(1049.0)), truth)
    assert mm.tpr_at_0_1(ev).startswith("unavailable: needs >= 1000 non-members, has 999")
    truth.member = np.r_[np.zeros(1000), np.ones(50)].astype(int)
    ev = Evidence(Reconstruction(scores=np.arange(1050.0)), truth)
    assert mm.tpr_at_0_1(ev) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- separable fixtures

def _knowledge(task, build, members_x, members_y, non_x, non_y, aux_x, aux_y, model, recipe, loss,
               tokenizer=None, rng=None):
    perm = np.random.default_rng(1).permutation(len(members_y) + len(non_y))
    cx, cy = torch.cat([members_x, non_x])[perm], torch.cat([members_y, non_y])[perm]
    labels = np.r_[np.ones(len(members_y)), np.zeros(len(non_y))].astype(int)[perm]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state = dict(model.named_parameters())
    initial = {n: v.detach().clone() for n, v in build().named_parameters() if n in names}
    final = {n: state[n].detach().clone() for n in names}
    mk = MembershipKnowledge(cx, cy, aux_x, aux_y, initial, final, dict(final), recipe, loss)
    k = Knowledge(task=task, model_name="test", model_params={}, global_params=initial, num_classes=10,
                  input_shape=tuple(members_x.shape[1:]), batch_size=len(members_y), lr=recipe["lr"],
                  update_kind="gradient", local_steps=1, head=("", None), tokenizer=tokenizer, build_model=build,
                  membership=mk)
    return k, labels


def _fit(model, loss, x, y, steps, lr):
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss(model, x, y).backward()
        opt.step()
    return model


def _ce(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.fixture(scope="module")
def image_case():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    def build():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))

    def data(n):
        return torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    (mx, my), (nx, ny), (ax, ay) = data(40), data(40), data(160)
    model = _fit(build(), _ce, mx, my, 300, 0.01)
    recipe = {"epochs": 60, "batch_size": 20, "lr": 0.2, "train_size": 40}
    knowledge, labels = _knowledge("classification", build, mx, my, nx, ny, ax, ay, model, recipe, _ce)
    update = {n: -0.1 * g for n, g in zip(
        [n for n, _ in model.named_parameters()],
        torch.autograd.grad(_ce(load_initial(knowledge), mx, my), list(load_initial(knowledge).parameters())))}
    return knowledge, labels, update


def load_initial(knowledge):
    from bench.protocol.view import load
    if not hasattr(knowledge, "_initial_model"):
        object.__setattr__(knowledge, "_initial_model", load(knowledge, knowledge.global_params))
    return knowledge._initial_model


def _view(update):
    return ServerView(dict(update), {n: torch.ones_like(v, dtype=torch.bool) for n, v in update.items()}, (), {}, 1.0)


IMAGE_ATTACKS = [("mia-loss", {}), ("mia-lira", {"shadows": 4}), ("mia-rmia", {"references": 2, "population": 60}),
                 ("mia-grad-cosine", {})]


@pytest.mark.parametrize("name,params", IMAGE_ATTACKS, ids=[a for a, _ in IMAGE_ATTACKS])
def test_image_attack_direction_on_separable_data(image_case, name, params):
    knowledge, labels, update = image_case
    attack = ATTACKS.get(name)(**params)
    view = _view(update)
    assert attack.blocked(view, knowledge) is None
    scores = attack.run(view, knowledge, seed=0).scores
    assert mm.auroc(scores, labels) > 0.9
    assert mm.auroc(scores, 1 - labels) < 0.1


class _Data:
    task = "causal-lm"
    name = "synthetic"
    num_classes = 2

    def __init__(self, tokenizer, seq_len):
        self.tokenizer, self.vocab_size, self.pad_id = tokenizer, len(tokenizer), tokenizer.pad_token_id
        self.input_shape = (seq_len,)


@pytest.fixture(scope="module")
def lm_case():
    import transformers

    from bench.models import build_model
    tok = transformers.ByT5Tokenizer()
    seq_len = 24
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnop"), size=3)) for _ in range(40)]

    def texts(n):
        return [" ".join(w.capitalize() for w in rng.choice(words, size=5)) for _ in range(n)]

    def enc(t):
        ids = tok(t, truncation=True, max_length=seq_len, padding="max_length")["input_ids"]
        return torch.tensor(np.asarray(ids, dtype=np.int64))

    data = _Data(tok, seq_len)

    def build():
        torch.manual_seed(5)
        return build_model("gpt2-lora", data, n_embd=32, n_layer=1, n_head=2, lora_r=8)

    def loss(model, x, y=None):
        logits = model(x)[:, :-1]
        target = x[:, 1:].clone()
        target[target == tok.pad_token_id] = -100
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                 ignore_index=-100)

    mx, nx, ax = enc(texts(30)), enc(texts(30)), enc(texts(10))
    zeros = torch.zeros(30, dtype=torch.int64)
    torch.manual_seed(0)
    model = build()
    for p in model.parameters():   # full fine-tuning memorizes fast on the synthetic texts
        p.requires_grad_(True)
    _fit(model, loss, mx, None, 150, 0.01)

    def build_all():
        m = build()
        for p in m.parameters():
            p.requires_grad_(True)
        return m

    recipe = {"epochs": 1, "batch_size": 8, "lr": 0.01, "train_size": 30}
    knowledge, labels = _knowledge("causal-lm", build_all, mx, zeros, nx, zeros, ax, torch.zeros(10, dtype=torch.int64),
                                   model, recipe, loss, tokenizer=tok)
    return knowledge, labels


LM_ATTACKS = [("mia-loss", {}), ("mia-zlib", {}), ("mia-lowercase", {}), ("mia-mink", {"k": 0.2}),
              ("mia-minkpp", {"k": 0.2}), ("mia-recall", {"shots": 2}), ("mia-pac", {"augmentations": 3})]


@pytest.mark.parametrize("name,params", LM_ATTACKS, ids=[a for a, _ in LM_ATTACKS])
def test_lm_attack_direction_on_separable_data(lm_case, name, params):
    knowledge, labels = lm_case
    attack = ATTACKS.get(name)(**params)
    view = _view({})
    assert attack.blocked(view, knowledge) is None
    scores = attack.run(view, knowledge, seed=0).scores
    assert mm.auroc(scores, labels) > 0.9
    assert mm.auroc(scores, 1 - labels) < 0.1


# ----------------------------------------------------------------------------- through the runner

def _mia_suite(defenses, attacks):
    from tests.conftest import tiny_suite
    return tiny_suite(defenses, attacks, max_train=200, max_test=300, mia_size=100, mia_aux=150, rounds=2,
                      local_epochs=5, attack_update="delta", attack_batch_size=100, attack_round=1)


def test_same_seed_gives_identical_scores_and_shadow_time_is_reported():
    from attacks.mia import common
    from bench.run.cells import run_group
    suite = _mia_suite(["plaintext"], ["mia-loss", ("mia-lira", {"shadows": 2}), "mia-grad-cosine"])
    first = list(run_group(list(suite.cells), None))
    common._SHADOWS.clear()   # retrain the shadows: determinism must not come from the cache
    second = list(run_group(list(suite.cells), None))
    for a, b in zip(first, second):
        assert a["status"] == b["status"] == "ok", a["reason"]
        assert a["details"]["scores"] == b["details"]["scores"]
        assert a["details"]["labels"] == b["details"]["labels"]
        assert a["details"]["n_members"] == a["details"]["n_nonmembers"] == 100
        assert a["metrics"]["attack_s"] > 0
    assert first[1]["details"]["attack_details"]["shadow_train_s"] > 0


def test_full_he_blocks_model_attacks_and_base_is_chance():
    from bench.run.cells import run_group
    suite = _mia_suite(["fedhe-full", "base"], ["mia-loss", "mia-grad-cosine"])
    records = {(r["defense"], r["attack"]): r for cells in ([suite.cells[0], suite.cells[1]],
                                                              [suite.cells[2], suite.cells[3]])
               for r in run_group(cells, None)}
    assert "knows no entry of the final model" in records["fedhe-full", "mia-loss"]["reason"]
    assert records["fedhe-full", "mia-grad-cosine"]["status"] == "blocked"
    assert records["base", "mia-grad-cosine"]["status"] == "blocked"
    assert abs(records["base", "mia-loss"]["metrics"]["mia_auroc"] - 0.5) < 0.15


def test_base_row_skips_local_training_and_keeps_the_built_model(monkeypatch):
    """A defense that sends and applies nothing (trains = False) costs no local training."""
    from bench.federation import engine
    from bench.run.cells import run_group
    suite = _mia_suite(["base"], ["mia-loss"])

    def refuse(*args, **kwargs):
        raise AssertionError("local_update ran for a defense that discards its result")
    monkeypatch.setattr(engine, "local_update", refuse)
    (record,) = run_group([suite.cells[0]], None)
    assert record["status"] == "ok", record["reason"]


def test_infinite_scores_keep_their_rank_and_all_nan_is_unavailable():
    labels = np.array([1, 1, 0, 0])
    assert mm.auroc(np.array([0.0, 1.0, -np.inf, -2.0]), labels) == pytest.approx(1.0)
    truth = type("T", (), {"member": labels})()
    ev = Evidence(Reconstruction(scores=np.full(4, np.nan)), truth)
    from bench.registry import METRICS
    assert METRICS.get("mia_auroc").compute(ev).startswith("unavailable: 4 of 4 scores are NaN")
    assert mm.tpr_at_0_1(ev).startswith("unavailable")


# ----------------------------------------------------------------------------- candidate pools

def test_length_matching_pairs_each_member_with_a_held_out_sequence_of_its_length():
    from bench.federation.candidates import _length_matched
    rng = np.random.default_rng(0)
    members = rng.integers(2, 9, size=200)               # short, like SST-2's training phrases
    pool = rng.permutation(np.r_[rng.integers(2, 9, size=600), np.full(1400, 16)])   # mostly long, like its dev sentences
    chosen = _length_matched(members, pool)
    assert len(set(chosen)) == len(chosen)
    assert np.array_equal(np.sort(pool[chosen]), np.sort(members))
    assert mm.auroc(np.r_[members, pool[:200]].astype(float), np.r_[np.ones(200), np.zeros(200)]) < 0.2


def _nuisance_scores(x: torch.Tensor, pad) -> dict[str, np.ndarray]:
    """Scores that read only the record, not any model: an attack on the untrained model could pick them up."""
    import zlib
    if pad is not None:
        rows = [[int(t) for t in row if int(t) != pad] for row in x]
        return {"length": np.array([len(r) for r in rows], float),
                "zlib": np.array([len(zlib.compress(np.asarray(r, np.int32).tobytes())) for r in rows], float)}
    pixels = (x.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return {"brightness": x.flatten(1).mean(1).numpy(), "contrast": x.flatten(1).std(1).numpy(),
            "zlib": np.array([len(zlib.compress(p.tobytes())) for p in pixels], float)}


@pytest.mark.parametrize("scenario", ["rt-polarity-gpt2-lora", "cifar10-mlp-overfit"])
def test_mia_suite_pools_carry_no_signal_without_a_model(data_root, scenario):
    """Members and non-members of the committed suite must not differ in length, compressibility or
    brightness: such a difference puts every attack on the base row away from chance."""
    from bench.data.loading import load_dataset
    from bench.federation import candidates
    from bench.federation.engine import build_federation
    from bench.run.spec import load_suite
    sc = next(s for s in load_suite("mia").scenarios if s.name == scenario)
    data = load_dataset(sc.dataset, data_root, max_train=sc.max_train, max_test=sc.max_test, seed=sc.seed,
                        seq_len=sc.seq_len)
    fed = build_federation(sc, data)
    params = fed.params()
    known = {n: torch.ones(s, dtype=torch.bool) for n, s in fed.shapes.items()}
    mk, labels = candidates.select(fed, known, params, params)
    assert labels.sum() == sc.mia_size and len(labels) == 2 * sc.mia_size
    for name, score in _nuisance_scores(mk.candidates_x, getattr(data, "pad_id", None)).items():
        assert abs(mm.auroc(score, labels) - 0.5) <= 0.05, f"{scenario}: a {name}-only score separates the pools"
