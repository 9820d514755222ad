"""What the server knows of a run (its Knowledge of the attacked round; a scenario's Setting for the
load-time checks) and what a finished run measured (utility on the test set, bytes, HE seconds,
encrypted fractions, and the defense's own run metrics)."""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

from bench.crypto.parallel import he_workers
from bench.federation.scenario import Scenario
from bench.federation.state import Federation, set_entries
from bench.models import build_model, classifier_head, torch_device, update_names
from bench.protocol import contracts
from bench.protocol.attack import Setting
from bench.protocol.defense import Defense
from bench.protocol.view import Knowledge


def server_knowledge(sc: Scenario, data, model: torch.nn.Module, params: dict[str, torch.Tensor],
                     new_model: Callable[[], torch.nn.Module], uploads_weights: bool = False) -> Knowledge:
    """What the server knows of the attacked round: `params` are the global entries it knows (NaN elsewhere)."""
    steps = 1 if sc.attack_update == "gradient" else sc.local_epochs * -(-sc.attack_batch_size // sc.batch_size)
    head = classifier_head(model) if data.task == "classification" else ("", None)
    return Knowledge(task=data.task, model_name=sc.model, model_params=dict(sc.model_params), global_params=params,
                     num_classes=data.num_classes, input_shape=tuple(data.input_shape),
                     batch_size=sc.attack_batch_size, lr=sc.lr, update_kind=sc.attack_update, local_steps=steps,
                     local_batch_size=sc.batch_size,
                     head=head, vocab_size=data.vocab_size, tokenizer=data.tokenizer, build_model=new_model,
                     uploads_weights=uploads_weights, delta=sc.delta)


def setting(sc: Scenario, data, model: torch.nn.Module | None = None) -> Setting:
    """The scenario before any defense, for the attacks' load-time checks (Attack.applicable); `model`: the
    scenario's model already built on `data`."""
    model = model if model is not None else build_model(sc.model, data, **sc.model_params)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    params = {n: state[n].detach() for n in update_names(model)}
    knowledge = server_knowledge(sc, data, model, params, lambda: build_model(sc.model, data, **sc.model_params))
    return Setting(knowledge, sc.mia_size, sc.mia_aux, sc.labels_known, model, sc.canary, sc.clients_per_round)


def server_view_knowledge(fed: Federation, known: dict[str, torch.Tensor], defense: Defense) -> Knowledge:
    params = fed.params()
    knowledge = server_knowledge(fed.scenario, fed.data, fed.model,
                                 {n: torch.where(known[n], params[n], torch.nan) for n in fed.names}, fed.new_model,
                                 defense.uploads_weights)
    return replace(knowledge, estimate=dict(defense.server_estimate(fed)))


def encryption_breakdown(fed: Federation) -> dict[str, Any]:
    """Actual encrypted fraction overall and per parameter, and whether the classifier head is covered."""
    if not fed.encrypted:   # diverged before any upload was aggregated
        return {}
    sizes = {n: int(np.prod(s)) if s else 1 for n, s in fed.shapes.items()}
    per_name = {n: float(np.mean(v)) for n, v in fed.encrypted.items()}
    total = sum(sizes.values())
    out: dict[str, Any] = {"encrypted_fraction": sum(per_name[n] * sizes[n] for n in fed.names) / total,
                           "encrypted_by_parameter": per_name}
    if fed.data.task == "classification":
        weight, bias = classifier_head(fed.model)
        out["head_weight_encrypted"] = per_name[weight]
        if bias is not None:
            out["head_bias_encrypted"] = per_name[bias]
    return out


HE_COSTS = ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s")


def run_metrics(fed: Federation, defense: Defense, wall: float) -> dict[str, Any]:
    data = fed.data
    dev = torch_device.device(fed.model)
    evaluated = fed.model if dev.type == "cpu" else copy.deepcopy(fed.model).to(dev)
    metrics: dict[str, Any] = dict(fed.task.evaluate(evaluated.to(dev), data.test_x, data.test_y, per_example=True))
    if "accuracy" in metrics:   # what a page needs to tell an accuracy from chance (its binomial interval)
        metrics.update(test_samples=len(data.test_y), chance_accuracy=1.0 / data.num_classes)
    if any(c.local for c in fed.clients):  # personalized entries: each client's own model on the test set
        personal = []
        for client in fed.clients:
            model = fed.new_model()
            set_entries(model, client.merged(fed.params()))
            personal.append(fed.task.evaluate(model.to(dev), data.test_x, data.test_y))
        metrics.update({f"{k}_personal": float(np.mean([p[k] for p in personal])) for k in personal[0]})
    metrics.update(upload_bytes=fed.traffic.per_client("up"), download_bytes=fed.traffic.per_client("down"),
                   setup_bytes=fed.traffic.setup_bytes(), wall_s=wall,
                   ciphertext_bytes=float(np.mean(fed.cipher_sizes)) if fed.cipher_sizes else 0.0,
                   **{key: fed.meter.mean(key) for key in HE_COSTS},
                   **{key.replace("_s", "_wall_s"): fed.meter.mean_wall(key) for key in HE_COSTS})
    if any(fed.meter.counts.get(key) for key in HE_COSTS):
        metrics["he_clock"] = {"he_seconds": "CPU seconds of this process and its HE worker processes "
                                             "(bench/crypto/clock.py); *_wall_s: wall seconds",
                               "he_workers": he_workers(), "torch_threads": torch.get_num_threads()}
    metrics.update(contracts.run_metric_values(defense, defense.run_metrics(fed)))
    return metrics
