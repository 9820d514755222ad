"""The SenseCrypt defense: the hooks that run Algorithm 3 (dual-server SenseCrypt) in the federation engine.

setup        Phase 1: keys from the key server (DKMS); each client trains `cluster_epochs` local
             epochs from the initial model, computes Gamma there and uploads it (optionally DP-noised)
             with its device profile; the server clusters by AP, merges one-client clusters into
             their nearest cluster (a cluster of one would let the key server's decrypted cluster
             aggregate reveal that client's update; the paper does not say), and returns cluster
             ids and budgets.
round_start  each sampled client recomputes Gamma at its freshly trained model and solves its mask;
             the server tells it its FedAvg share within its cluster.
encode       per-parameter Paillier on the mask, plaintext elsewhere, the mask in meta.
aggregate    per-cluster FedAvg (percluster.py), public key only.
decode       the key server decrypts each cluster's union mask and keeps the cluster models.
merge        every member of the client's cluster gets the cluster model as its personalized
             entries (client.local covers every entry, so it is also where local training starts).
The engine's global model is the sample-weighted average of the cluster models.

Device profiles (r_i, v_i) are the scenario's (client.device); a device's HE budget (he_budget, 1.0 by
default) scales its client's encryption budget, so a device with budget 0 trains without HE (Fig. 6's
client 9). A suite gives `ratio_cap` per scenario through the scenario's `defense_params`.
`paillier_slice` = S > 0 encrypts only the first S masked values per upload for real and extrapolates
every Paillier cost (slices.py): for models whose masks are too large to encrypt value by value.
Defaults: B, C from section 4.1 (FCN/FMNIST for one-channel inputs, AlexNet/CIFAR10 for three),
eta_MI = 2.0 bits, 2048-bit keys; smaller keys are reported as test_only_key_size.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch

from bench.crypto import clock
from bench.crypto.keys import provision
from bench.protocol.defense import Defense
from bench.protocol.wire import Message, Payload
from bench.registry import DEFENSES
from defenses.sensecrypt import percluster
from defenses.sensecrypt.clustering import (
    PREFERENCES,
    affinity_propagation,
    cluster_scores,
    distances,
    dp_accounting,
    dp_noise,
    dp_sigma,
    merge_singletons,
    model_at,
    sensitivity,
    warm_model,
)
from defenses.sensecrypt.evaluation import own_label_accuracy
from defenses.sensecrypt.profiles import RoundClock, budgets, data_groups, device_profiles
from defenses.sensecrypt.selection import SOLVERS, solve_mask
from defenses.sensecrypt.slices import SliceCosts

# section 4.1: {C=0.7, B=1.3} for the FCN on FMNIST, {C=0.5, B=2} for AlexNet on CIFAR10
PAPER_BC = {"grey": (1.3, 0.7), "colour": (2.0, 0.5)}


@DEFENSES.register("sensecrypt", "SenseCrypt: sensitivity-clustered FedAvg, per-client knapsack masks, "
                                 "per-parameter Paillier, key server")
class SenseCrypt(Defense):
    """A malicious server chooses the model each client's sensitivity Gamma and knapsack mask are computed on,
    and at setup it forms the clusters and hands out the encryption budgets alpha, so it can give the attacked
    client a budget of zero; the mask is solved at the client and only the key server decrypts."""

    links = {"paper": "https://arxiv.org/abs/2508.04100"}
    key_topology = "key-server"
    decodes_weighted_sum = False   # per-cluster FedAvg: the global model is a mean of cluster models

    def __init__(self, key_bits: int = 2048, B: float | None = None, C: float | None = None, eta_mi: float = 2.0,
                 mi_bins: int = 32, ratio_cap: float = 1.0, solver: str = "exact",
                 dp_epsilon: float | None = None, dp_delta: float = 1e-5, dp_clip: float = 1.0,
                 ap_preference: str | float = "median", budget_scope: str = "cluster", cluster_epochs: int = 1,
                 paillier_slice: int = 0) -> None:
        if key_bits < 512 or key_bits % 8:
            raise ValueError(f"key_bits must be a multiple of 8 and >= 512 (2048 outside tests), got {key_bits}")
        if (B is not None and not B > 0) or (C is not None and not C >= 0):
            raise ValueError(f"B must be > 0 and C >= 0, got B={B}, C={C}")
        if not 0.0 < ratio_cap <= 1.0 or mi_bins < 2 or not eta_mi >= 0:
            raise ValueError("ratio_cap must be in (0, 1], mi_bins >= 2 and eta_mi >= 0")
        if solver not in SOLVERS:
            raise ValueError(f"solver '{solver}' must be one of {', '.join(SOLVERS)}")
        if dp_epsilon is not None and not (dp_epsilon > 0 and 0 < dp_delta < 1 and dp_clip > 0):
            raise ValueError("dp_epsilon and dp_clip must be > 0 and dp_delta in (0, 1)")
        if isinstance(ap_preference, str) and ap_preference not in PREFERENCES:
            raise ValueError(f"ap_preference must be a number or one of {', '.join(PREFERENCES)}")
        if budget_scope not in ("cluster", "all"):
            raise ValueError(f"budget_scope '{budget_scope}' must be 'cluster' (section 3.2) or 'all' (Algorithm 3)")
        if cluster_epochs < 0:
            raise ValueError(f"cluster_epochs must be >= 0, got {cluster_epochs}")
        if not isinstance(paillier_slice, int) or paillier_slice < 0:
            raise ValueError(f"paillier_slice must be an int >= 0 (0 = encrypt every value), got {paillier_slice!r}")
        super().__init__(key_bits=key_bits, B=B, C=C, eta_mi=eta_mi, mi_bins=mi_bins, ratio_cap=ratio_cap,
                         solver=solver, dp_epsilon=dp_epsilon, dp_delta=dp_delta, dp_clip=dp_clip,
                         ap_preference=ap_preference,
                         budget_scope=budget_scope, cluster_epochs=cluster_epochs, paillier_slice=paillier_slice)
        self.opt = dict(self.params)
        self.differentially_private = dp_epsilon is not None   # Algorithm 2 noises the sensitivity vectors

    # -- Phase 1 -----------------------------------------------------------------------------------
    def setup(self, fed) -> None:
        o = self.opt
        self.key = provision(fed, "key-server", scheme="paillier", key_bits=o["key_bits"])
        server, keyserver = fed.parties["server"], fed.parties["key-server"]
        server.state["he_params"] = self.key.params
        default_b, default_c = PAPER_BC["colour" if fed.data.input_shape[0] == 3 else "grey"]
        self.B = default_b if o["B"] is None else float(o["B"])
        self.C = default_c if o["C"] is None else float(o["C"])
        self.sizes = [int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1 for n in fed.names]
        self.costs = SliceCosts(o["paillier_slice"]) if o["paillier_slice"] else None
        r, v = device_profiles(fed)
        self.clock = RoundClock(r, v)
        received, norms = [], []
        start = fed.params()
        for client in fed.clients:
            fed.send(client.name, "server", "device profile (r_i, v_i)", np.array([r[client.index], v[client.index]],
                                                                                   "<f8").tobytes())
            gen = torch.Generator().manual_seed(fed.scenario.seed * 100_003 + 50_021 + client.index)
            gamma = sensitivity(fed, warm_model(fed, client, o["cluster_epochs"], gen), client.x, client.y)
            norms.append(float(np.linalg.norm(gamma)))
            if o["dp_epsilon"] is not None:
                rng = np.random.default_rng([fed.scenario.seed, 7, client.index])
                gamma = dp_noise(gamma, o["dp_epsilon"], o["dp_delta"], o["dp_clip"], rng)
            wire = gamma.astype("<f4").tobytes()
            fed.send(client.name, "server", "sensitivity vector", Message(wire, "entries:f4"))
            received.append(np.frombuffer(wire, "<f4").astype(np.float64))
        started = clock.now().cpu
        dist = distances(np.stack(received))
        labels, converged = affinity_propagation(dist, o["ap_preference"], fed.scenario.seed)
        self.cluster_s = clock.now().cpu - started
        self.truth = data_groups(fed)
        self.scores = cluster_scores(dist, labels, self.truth)   # AP's own clustering, as the paper scores it
        labels, self.singletons_merged = merge_singletons(dist, labels)
        self.converged, self.norms = converged, norms
        self.labels = [int(x) for x in labels]
        scopes = self.labels if o["budget_scope"] == "cluster" else [0] * len(self.labels)
        self.alphas = budgets(r, v, scopes)
        self.ratio_cap = float(o["ratio_cap"])
        for client in fed.clients:
            fed.send("server", client.name, "cluster id and encryption budget", 12)
            client.party.state.update(cluster=self.labels[client.index],
                                      alpha=self.alphas[client.index] * self.ratio_cap * client.device.he_budget)
        server.state["clusters"] = list(self.labels)
        keyserver.state["cluster_models"] = {c: {n: t.clone() for n, t in start.items()} for c in set(self.labels)}
        self.masks: list[dict] = []
        self.unions: list[dict] = []
        self.encryptions: list[dict] = []   # measured (values, seconds) per upload: the cost model's check

    # -- Phase 2 -----------------------------------------------------------------------------------
    def round_start(self, fed, round: int, clients: list, updates: dict) -> None:
        server = fed.parties["server"]
        if self.costs is not None:
            self.costs.withheld.clear()   # sliced: last round's counterfactual uploads
        totals: dict[int, int] = {}
        for client in clients:
            totals[self.labels[client.index]] = totals.get(self.labels[client.index], 0) + client.num_samples
        server.state["shares"] = {c.name: c.num_samples / totals[self.labels[c.index]] for c in clients}
        global_params = fed.params()
        for client in clients:
            fed.send("server", client.name, "FedAvg share within the cluster", 8)
            client.party.state["share"] = server.state["shares"][client.name]
            started = clock.now().cpu
            begin = global_params | client.local
            update = updates[client.name]
            trained = model_at(fed, {n: begin[n] + update[n] for n in fed.names})
            gamma = sensitivity(fed, trained, client.x, client.y)
            result = solve_mask(gamma, percluster.flatten(update, fed.names), client.party.state["alpha"], self.B,
                                self.C, self.opt["eta_mi"], self.opt["mi_bins"], self.opt["solver"])
            self.clock.charge(round, client.index, clock.now().cpu - started)
            client.party.state["mask"] = result.mask
            self.masks.append({"round": round, "client": client.name, "cluster": self.labels[client.index],
                               "alpha": client.party.state["alpha"], **result.summary(), "feasible": result.feasible})

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        started = clock.now().cpu
        payload, measured, seconds, upload = percluster.masked_payload(
            fed, client, update, client.party.state["mask"], client.party.state["share"], self.sizes, self.costs)
        self.clock.charge(fed.round, client.index, clock.now().cpu - started - measured + seconds)
        self.clock.upload(fed.round, client.index, int(upload))
        count = payload.cipher[0].length if payload.cipher else 0
        self.encryptions.append({"round": fed.round, "client": client.name, "values": count, "seconds": measured})
        return payload

    def aggregate(self, fed, uploads, server) -> Payload:
        out = percluster.aggregate(fed, uploads, server.state["clusters"], server.state["shares"], server, self.sizes,
                                   self.costs)
        index = {c.name: c.index for c in fed.clients}
        senders = [self.labels[index[u.sender]] for u in uploads]
        for key, blob in out.meta.items():
            if key.startswith("union/"):
                union = percluster.unpack_mask(blob, sum(self.sizes))
                cluster = int(key.split("/")[1])
                self.unions.append({"round": fed.round, "cluster": cluster, "fraction": float(union.mean()),
                                    "uploads": senders.count(cluster)})
        return out

    def decode(self, fed, aggregate: Payload, party) -> dict[str, torch.Tensor]:
        """Cluster models advance by their decrypted updates; the global model becomes their weighted mean."""
        flat = percluster.decode(fed, aggregate, party, self.sizes, self.costs)
        party.state["cluster_updates"] = flat
        models = party.state["cluster_models"]
        for cluster, values in flat.items():
            parts = percluster.split(values, fed.names, self.sizes)
            models[cluster] = {n: models[cluster][n] + torch.from_numpy(parts[n]).float().reshape(fed.shapes[n])
                               for n in fed.names}
        weights: dict[int, int] = {}
        for client in fed.clients:
            weights[self.labels[client.index]] = weights.get(self.labels[client.index], 0) + client.num_samples
        total = sum(weights.values())
        old = fed.params()
        return {n: sum(models[c][n] * (w / total) for c, w in weights.items()) - old[n] for n in fed.names}

    def merge(self, fed, client, global_update: dict[str, torch.Tensor]) -> None:
        model = fed.parties["key-server"].state["cluster_models"][self.labels[client.index]]
        for member in fed.clients:
            if self.labels[member.index] == self.labels[client.index]:
                member.local = {n: t.clone() for n, t in model.items()}

    # -- results -----------------------------------------------------------------------------------
    def run_metrics(self, fed) -> dict:
        out: dict = {"he_params": dict(self.key.params)}
        out.update(self.clock.summary())
        for name in ("ari", "silhouette"):
            if self.scores[name] is not None:
                out[name] = self.scores[name]
        # a cluster aggregate of one upload (a round that sampled one member) decrypts to that client's update
        out["single_upload_aggregates"] = sum(u["uploads"] == 1 for u in self.unions)
        out["cluster_count"] = len(set(self.labels))
        if self.opt["dp_epsilon"] is not None:
            out.update(dp_accounting(self.opt["dp_epsilon"], self.opt["dp_delta"], self.opt["dp_clip"],
                                     fed.clients[fed.scenario.attack_client].name))
        flags = [m["feasible"] for m in self.masks]
        if flags:
            out["mask_feasible_fraction"] = float(np.mean(flags))
        own = own_label_accuracy(fed)
        if own is not None:
            out["accuracy_own_labels"] = own["personal"]
        o = self.opt
        out["sensecrypt"] = {
            "key_bits": o["key_bits"], "test_only_key_size": bool(self.key.params.get("test_only_key_size")),
            "B": self.B, "C": self.C, "eta_mi": o["eta_mi"], "ratio_cap": self.ratio_cap,
            "clustering_s": self.cluster_s, **{k: v for k, v in self.scores.items()},
            "clusters": self.labels, "cluster_count": len(set(self.labels)), "singletons_merged": self.singletons_merged,
            "ground_truth": self.truth, "ap_converged": self.converged,
            "sensitivity_norm": {"min": min(self.norms), "median": float(np.median(self.norms)),
                                 "max": max(self.norms)},
            "dp": None if o["dp_epsilon"] is None else {"epsilon": o["dp_epsilon"], "delta": o["dp_delta"],
                                                        "clip": o["dp_clip"],
                                                        "sigma": dp_sigma(o["dp_epsilon"], o["dp_delta"])},
            "budgets": {f"client-{i}": a for i, a in enumerate(self.alphas)},
            "mask_fraction_mean": float(np.mean([m["fraction"] for m in self.masks])) if self.masks else 0.0,
            "union_fraction_mean": float(np.mean([u["fraction"] for u in self.unions])) if self.unions else 0.0,
            "unions": self.unions,
            "masks": self.masks,
            "infeasible": [{k: m[k] for k in ("round", "client", "budget", "level", "coverage", "mi_bits",
                                              "security_ok", "mi_ok")} for m in self.masks if not m["feasible"]],
            "round_time": self.clock.details(),
            "accuracy_own_labels": own,
            "encryptions": self.encryptions,
        }
        if self.costs is not None:
            out.update(self.costs.metrics())
            out.update({k[:-2] + "_extrapolated_s": out.pop(k) for k in ("round_time_max_s", "round_time_mean_s") if k in out})
            out["encrypted_fraction_extrapolated"] = out["sensecrypt"]["mask_fraction_mean"]
        return out


@DEFENSES.register("sensecrypt-dp", "SenseCrypt with Algorithm 2: the server clusters DP-noised sensitivity "
                                    "(dp_epsilon required, default 1.0)")
class SenseCryptDP(SenseCrypt):
    """Its own name so a suite can sweep epsilon on one scenario: suites filter scenarios' defenses by name."""

    differentially_private = True

    def __init__(self, **params) -> None:
        params.setdefault("dp_epsilon", 1.0)
        if params["dp_epsilon"] is None:
            raise ValueError("sensecrypt-dp needs a dp_epsilon; use sensecrypt for clustering without noise")
        super().__init__(**params)


_SIGNATURE = inspect.signature(SenseCrypt.__init__)
SenseCryptDP.__init__.__signature__ = _SIGNATURE.replace(parameters=[  # the same parameters, dp_epsilon defaulting to 1
    p.replace(default=1.0) if p.name == "dp_epsilon" else p for p in _SIGNATURE.parameters.values()])
