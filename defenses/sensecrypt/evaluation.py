"""Per-client accuracy on the client's own label distribution, the way the paper scores each client's model.

The engine scores every model on the whole test set; a cluster model trained on two classes
then looks poor although it serves its members well. Here each class's test accuracy is
weighted by the client's share of that class, for its personalized model and for the
global model, so both readings are in the record.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.protocol.evidence import run_metric
from defenses.sensecrypt.clustering import model_at

run_metric("ari", "", False, "utility", "SenseCrypt clustering: adjusted Rand index against the scenario's data categories")
run_metric("silhouette", "", False, "utility", "SenseCrypt clustering: silhouette of the clusters on the sensitivity "
           "distances")
run_metric("round_time_max_s", "s", True, "cost", "modelled round time: slowest client's protection time (scaled by its "
           "CPU share) plus upload over its bandwidth", timing=True)
run_metric("round_time_mean_s", "s", True, "cost", "modelled client time per round, mean over clients", timing=True)
run_metric("mask_feasible_fraction", "", False, "privacy", "share of client masks meeting the security level and the MI "
           "bound within the budget")
run_metric("accuracy_own_labels", "", False, "utility", "mean over clients of its model's test accuracy on its own label "
           "distribution")
run_metric("cluster_count", "", None, "utility", "SenseCrypt: clusters used for per-cluster FedAvg (after one-client "
           "clusters merge into their nearest)")
run_metric("single_upload_aggregates", "", True, "privacy", "SenseCrypt: (round, cluster) aggregates of one upload, "
           "which the key server decrypts to that client's own update")


@torch.no_grad()
def _per_class(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, classes: int) -> np.ndarray:
    model.eval()
    correct = torch.cat([model(xb).argmax(1) == yb for xb, yb in zip(x.split(512), y.split(512))]).numpy()
    model.train()
    labels = y.numpy()
    return np.array([correct[labels == c].mean() if (labels == c).any() else np.nan for c in range(classes)])


def own_label_accuracy(fed) -> dict | None:
    """Mean over clients of sum_c p_i(c) acc(c), for the personalized and for the global model."""
    data = fed.data
    if data.task != "classification":
        return None
    classes = data.num_classes
    global_acc = _per_class(fed.model, data.test_x, data.test_y, classes)
    params = fed.params()
    personal, shared = [], []
    for client in fed.clients:
        share = np.bincount(client.y.numpy(), minlength=classes) / max(client.num_samples, 1)
        acc = _per_class(model_at(fed, params | client.local), data.test_x, data.test_y, classes)
        ok = ~np.isnan(acc) & (share > 0)
        weight = share[ok] / share[ok].sum()
        personal.append(float((acc[ok] * weight).sum()))
        shared.append(float((global_acc[ok] * weight).sum()))
    return {"personal": float(np.mean(personal)), "global": float(np.mean(shared))}
