"""SHE-LoRA's measurements: the aggregated Delta W as a key holder or the server sees it, table 14's perplexity.

Split from protocol.py, which runs the rounds; these read its state (layers, shapes, order) only.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.wire import Payload


def delta_w(defense, fed, aggregate: Payload, party) -> dict:
    """Every layer's aggregated Delta W in original column order, as a key holder decrypts it; party None:
    only the plaintext part, what the aggregation server can use (encrypted columns as 0)."""
    out = {}
    decrypted = defense._decrypted(fed, aggregate, party)
    for layer in defense.layers:
        (b_p, a_p), cols, swap = defense._delta_w(aggregate, decrypted, layer)
        w = np.zeros((defense.m[layer.a], defense.n))
        w[:, : a_p.shape[1]] = b_p @ a_p
        if cols.shape[1]:
            w[:, defense.n - cols.shape[1]:] += cols
        out[layer] = np.zeros_like(w)
        out[layer][:, swap] = w
    return out


def perplexity(fed, delta: dict) -> float:
    """Perplexity of the base model plus scaling * Delta W per layer (LoRA factors zeroed)."""
    model = fed.new_model()
    modules = dict(model.named_modules())
    state = dict(model.named_parameters())
    with torch.no_grad():
        for layer, w in delta.items():
            mod = modules[layer.module]
            state[layer.b].zero_()
            step = torch.from_numpy(w).float()   # m x n = nn.Linear's (out, in); GPT-2's Conv1D stores (in, out)
            mod.base_layer.weight += float(mod.scaling["default"]) * (step.T if mod.fan_in_fan_out else step)
    return float(fed.task.evaluate(model, fed.data.test_x, fed.data.test_y)["perplexity"])


def run_metrics(defense, fed) -> dict:
    per_type = {t: {"upload_bytes": float(np.mean([c[0] for c in v])), "cipher_bytes": float(np.mean([c[1] for c in v])),
                    "encrypt_s": float(np.mean([c[2] for c in v]))} for t, v in sorted(defense.costs.items())}
    out: dict = {"she_lora": {"ranks": dict(defense.ranks), "columns": dict(defense.ks), "by_device": per_type,
                              "order": {a: list(v) for a, v in (defense.order or {}).items()}}}
    if hasattr(defense, "last") and fed.data.task == "causal-lm":     # table 14 is about language modelling
        aggregate, party = defense.last
        out["perplexity_true"] = perplexity(fed, delta_w(defense, fed, aggregate, party))
        out["perplexity_masked"] = perplexity(fed, delta_w(defense, fed, aggregate, None))
    return out
