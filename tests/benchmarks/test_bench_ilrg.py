"""iLRG label recovery on untrained and trained 10-class models, random digits batches, plaintext uploads.

Run with `pytest tests/benchmarks/test_bench_ilrg.py -m heavy` (CI: `-m heavy -k smoke`). Batch
sizes up to 32 on untrained ReLU models are the regime where iLRG is expected to be exact. With
C = 10 most classes hold ~K/C samples, where the per-class embedding ratio is ill-conditioned, so
the official algorithm (`ilrg`) is off by one in some batches (the paper's own FCN-3 on MNIST scores
LnAcc 0.804 at B = 32); the guarded variant (`ilrg-guarded`) is asserted exact except SimpleCNN at
B = 32, whose BatchNorm features spread the logits wider; the floors are stated below. Batch 128 and
a trained model are measured and reported in extra_info, not asserted.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.labels.baselines import IDLGExtended, RandomGuess
from attacks.labels.ilrg import ILRG, ILRGGuarded
from bench.data.loading import load_dataset
from bench.models import build_model, classifier_head
from bench.protocol.evidence import Evidence, Truth
from bench.protocol.view import Knowledge, ServerView
from bench.protocol.wire import Upload, dense_payload
from metrics.labels import irec, label_f1, leacc, lnacc
from tests.conftest import fedsgd_update

LR = 0.1
BATCHES = 10
ATTACKS = {"ilrg": ILRG(), "ilrg-guarded": ILRGGuarded(), "idlg-extended": IDLGExtended(), "random-guess": RandomGuess()}
LNACC_FLOOR = {("simplecnn", 32): 0.95}   # ilrg-guarded; everything else at B <= 32 must be exact
OFFICIAL_LNACC_FLOOR = 0.75  # ilrg, measured mean LnAcc: simplecnn B=32 0.76, every other cell >= 0.85


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", None)


def fedsgd_target(data, model: torch.nn.Module, model_name: str, x, y):
    """(view, knowledge, truth) of one plaintext FedSGD upload of `model` on (x, y)."""
    before, update = fedsgd_update(model, x, y, LR)
    shapes = {n: tuple(t.shape) for n, t in update.items()}
    view = ServerView.of(Upload("client-0", 0, 1.0, dense_payload(update)), shapes)
    knowledge = Knowledge(task="classification", model_name=model_name, model_params={}, global_params=before,
                          num_classes=data.num_classes, input_shape=tuple(data.input_shape), batch_size=len(y),
                          lr=LR, update_kind="gradient", local_steps=1, head=classifier_head(model))
    return view, knowledge, Truth(x, y, update)


def attack_batches(data, model_for, model_name: str, size: int, batches: int, seed: int = 0) -> dict[str, dict]:
    """Mean LeAcc/LnAcc/IRec/F1 of each label attack over random batches, plus the worst iLRG batch."""
    rng = np.random.default_rng(seed * 1_000 + size)
    scores: dict[str, list] = {name: [] for name in ATTACKS}
    for b in range(batches):
        idx = torch.from_numpy(rng.choice(len(data.train_y), size, replace=False))
        view, knowledge, truth = fedsgd_target(data, model_for(b), model_name, data.train_x[idx], data.train_y[idx])
        for name, attack in ATTACKS.items():
            ev = Evidence(attack.run(view, knowledge, seed=b), truth, view, knowledge)
            scores[name].append((leacc(ev), lnacc(ev), irec(ev), label_f1(ev)))
    out = {name: dict(zip(("leacc", "lnacc", "irec", "f1"), np.mean(s, axis=0).round(4).tolist()))
           for name, s in scores.items()}
    for name in ("ilrg", "ilrg-guarded"):
        out[name]["min_lnacc"] = float(min(s[1] for s in scores[name]))
    return out


def untrained(data, model_name: str):
    def model_for(b: int) -> torch.nn.Module:
        torch.manual_seed(b)
        return build_model(model_name, data)
    return model_for


def report(benchmark, label: str, result: dict[str, dict]) -> None:
    benchmark.extra_info.update({f"{a}_{k}": v for a, r in result.items() for k, v in r.items()})
    print(f"\n{label}: " + " | ".join(f"{a} " + " ".join(f"{k}={v:.3f}" for k, v in r.items())
                                      for a, r in result.items()))


@pytest.mark.heavy
def test_ilrg_smoke(benchmark, digits):
    result = benchmark.pedantic(attack_batches, args=(digits, untrained(digits, "mlp"), "mlp", 8, 2),
                                rounds=1, iterations=1)
    report(benchmark, "mlp B=8 (smoke)", result)
    assert result["ilrg"]["leacc"] == result["ilrg"]["lnacc"] == 1.0


@pytest.mark.heavy
@pytest.mark.parametrize("batch_size", [8, 16, 32])
@pytest.mark.parametrize("model_name", ["lenet5-relu", "mlp", "simplecnn"])
def test_ilrg_exact_on_untrained_models(benchmark, digits, model_name, batch_size):
    result = benchmark.pedantic(attack_batches, args=(digits, untrained(digits, model_name), model_name,
                                                      batch_size, BATCHES), rounds=1, iterations=1)
    report(benchmark, f"{model_name} B={batch_size}", result)
    assert result["ilrg-guarded"]["leacc"] == 1.0
    assert result["ilrg-guarded"]["lnacc"] >= LNACC_FLOOR.get((model_name, batch_size), 1.0)
    assert result["ilrg"]["lnacc"] >= OFFICIAL_LNACC_FLOOR


@pytest.mark.heavy
@pytest.mark.parametrize("model_name", ["lenet5-relu", "mlp", "simplecnn"])
def test_ilrg_batch_128_report(benchmark, digits, model_name):
    result = benchmark.pedantic(attack_batches, args=(digits, untrained(digits, model_name), model_name,
                                                      128, BATCHES), rounds=1, iterations=1)
    report(benchmark, f"{model_name} B=128", result)


@pytest.fixture(scope="module")
def trained_mlp(digits):
    """The mlp after 5 epochs of SGD on digits (about 0.87 test accuracy), as a round-k global model."""
    torch.manual_seed(0)
    model = build_model("mlp", digits)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(5):
        for idx in torch.randperm(len(digits.train_y)).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(digits.train_x[idx]), digits.train_y[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = float((model(digits.test_x).argmax(1) == digits.test_y).float().mean())
    return model, accuracy


@pytest.mark.heavy
@pytest.mark.parametrize("batch_size", [8, 32, 128])
def test_ilrg_trained_mlp_report(benchmark, digits, trained_mlp, batch_size):
    model, accuracy = trained_mlp
    result = benchmark.pedantic(attack_batches, args=(digits, lambda b: model, "mlp", batch_size, BATCHES),
                                rounds=1, iterations=1)
    benchmark.extra_info["test_accuracy"] = accuracy
    report(benchmark, f"trained mlp (acc {accuracy:.3f}) B={batch_size}", result)
