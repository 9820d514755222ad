"""The she-lora and flex-lora defenses: the hooks that run SHE-LoRA's rounds in the federation engine.

Initialization and round schedule (`init`):
- "client" (default): as the authors' Flower clients run it (icloudsheep/SHE-LoRA @ cfcf289,
  flowertune_llm/client_app.py FlowerClient.fit). Each client builds its own fresh PEFT adapter (A0 drawn by
  the client, B0 = 0), shares no seed and never sends A0. Its first round is negotiation only: it scores A's
  columns at that fresh adapter on calibration data and returns no parameters, only the OPE'd scores. Here
  that round runs in setup (the engine's round -1), so the engine's round r is the official round r + 2 and
  round 0 is the first upload. The server never learns the A a client starts from (hidden_initial), but every
  upload shows it A's plaintext columns, and with B0 = 0 a first step leaves A = A0: it lacks k of n columns.
- "server": the paper's wording, the server distributes A0 (the engine's initial model) and the first round
  negotiates (round_start: importance at the trained adapter, the OPE request in that upload's meta) and
  uploads. The former default, kept so the rows computed with it read as they were.
Hooks: setup (keys, ranks r_i and budgets from each client's device, appendix D.1.2; LoRA cut to r_i);
encode (B_i and the swapped plaintext columns of A_i in clear, the first k_i negotiated columns as CKKS
blocks); aggregate (sum_i w_i B_i A_i^plain per plaintext column, sum_i w_i B_i A_i^cipher under HE, SVD of
the plaintext part); decode/merge (each client decrypts, merges, eq. 4, and re-factors to its rank).

What follows the official code: factors on the wire, the upload split (the negotiated columns swapped to
A's end, k in CKKS blocks of `chunk` columns, the rest of A and all of B in clear: tests/test_shelora_parity.py
checks it against outputs recorded from the code's get_plain_cipher), the server's B_i A_i^cipher product.
What follows the paper where the code differs (stated here, not copied):
- importance sum_k |A_kj| ||x_j|| (section 3.1.1); the code (wasens/sensitivity.py) takes |sum_k A_kj ||x_j|| |,
  which at a fresh adapter weighs ||x_j|| by a random |sum_k A_kj|;
- budgets as fractions gamma_i of n (k_i below); the code's config lists column counts (config.yaml he_budget)
  and its server sends every client the largest;
- Algorithm 1's (a, b) by an exhaustive grid (negotiation.py); the code runs skopt's Bayesian optimization;
- FedAvg of Delta W: weights w_i on plaintext and encrypted columns alike; the code sums the encrypted
  products unweighted and each client scales a block by 1 / (clients that sent it) (she/ckks_server.py
  aggregate_ckks_tensors, utils/client_utils.py decode_ciphers), while its plaintext part is weighted, so its
  aggregate is not FedAvg;
- one A0 per client for scoring and the first training; the code builds a fresh adapter at each of its first
  two rounds (get_model in every fit) from an RNG it does not seed;
- the swap keeps untouched columns in order (lora.swap_order); the code swaps in sequence (she/ckks_client.py
  exchange_columns), which differs only in where untouched tail columns land, except when a chosen column
  is a tail slot an earlier swap filled: then the code leaves it in clear (a recorded case in the parity test);
  our blocks take the negotiated list from its start, the code's the tail left to right (same count and widths).
Remedy against the "server" variant's first-round leak: grad B = -lr G (A0 X)^T travels in clear, and a
server that drew A0 maps it back to the inputs (attacks/dager/attack.py, lora_path "factor-b"); under "client" it
knows A0's plaintext columns only (DAGER solves for the k others, attacks/dager/hidden.py).
Server estimate: after the last round the aggregation server holds the plaintext columns' sum (its SVD in
meta) and rebuilds table 14's masked model; membership attacks use it (Defense.server_estimate), the paper's
"MIAs based on unencrypted parameters" (appendix F.4).
Per-layer shapes: each adapted matrix has its outputs m (SmolLM2: q_proj 576, v_proj 192) and block width;
all share the input width n, since budgets count A's columns. Trainable entries outside the adapters (a
classification head) travel in clear and are averaged. Every client receives all aggregated blocks (the
exact FedAvg of Delta W) rather than the paper's truncation to its own budget. Budgets: k_i = max(min_columns,
floor(n * gamma_i)) columns per layer when gamma_i > 0. A block holds `chunk` columns (the authors' 4) or
fewer where chunk * m must fit N/2 = 4096 slots (GPT-2's m = 2304: one column a block).
"""
from __future__ import annotations

import os

import numpy as np
import torch

from bench.crypto.clock import now, since
from bench.crypto.params import KeyMaterial
from bench.protocol.defense import Defense
from bench.protocol.evidence import run_metric
from bench.protocol.wire import CipherPart, Payload, PlainPart
from bench.registry import DEFENSES
from defenses.shelora import he, lora, measure, negotiation

RULES = ("max", "min", "random")
INITS = ("client", "server")

run_metric("perplexity_true", "", True, "utility", "SHE-LoRA Table 14: perplexity of the base model plus the decrypted "
           "aggregated Delta W", fmt="{:.1f}")
run_metric("perplexity_masked", "", None, "privacy", "SHE-LoRA Table 14: perplexity with the encrypted columns of Delta W "
           "zeroed (the server's usable model)", fmt="{:.1f}")


@DEFENSES.register("she-lora", "SHE-LoRA: OPE-negotiated column subsets of LoRA-A under CKKS, server-side "
                               "B*A^cipher, column-aware aggregation, SVD reparameterization to each rank")
class SheLoRA(Defense):
    links = {"paper": "https://arxiv.org/abs/2505.21051", "code": "https://github.com/liyan2015/SHE-LoRA"}
    key_topology = "shared-client-key"
    uploads_weights = True         # the wire carries the trained factors B_i, A_i (swapped), not deltas
    decodes_weighted_sum = False   # aggregates Delta W = B A column-aware, then SVD back to each client's rank

    def __init__(self, budget: float | None = None, rule: str = "max", chunk: int = 4, calibration: int = 128,
                 min_columns: int = 1, sigma: float = 0.0, init: str = "client") -> None:
        if budget is not None and not 0.0 <= budget <= 1.0:
            raise ValueError(f"budget must be in [0, 1] (a fraction of A's columns), got {budget}")
        if rule not in RULES:
            raise ValueError(f"rule '{rule}' must be one of {', '.join(RULES)}")
        if chunk < 1 or calibration < 1 or min_columns < 0 or sigma < 0:
            raise ValueError("chunk and calibration must be >= 1, min_columns and sigma >= 0")
        if init not in INITS:
            raise ValueError(f"init '{init}' must be one of {', '.join(INITS)}")
        super().__init__(budget=budget, rule=rule, chunk=chunk, calibration=calibration, min_columns=min_columns,
                         sigma=sigma, init=init)
        self.opt = dict(self.params)

    def applicable(self, setting) -> str | None:
        if not lora.layers(list(setting.knowledge.global_params)):
            return f"model '{setting.knowledge.model_name}' trains no LoRA adapters (it splits LoRA factors)"
        return None

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self, fed) -> None:
        self.layers = lora.layers(fed.names)
        if not self.layers:
            raise ValueError(f"{self.__class__.__name__}: model '{fed.scenario.model}' must train LoRA adapters "
                             "(e.g. gpt2-lora)")
        adapters = {n for layer in self.layers for n in (layer.a, layer.b)}
        self.extra = [n for n in fed.names if n not in adapters]   # e.g. a classification head: in clear
        first = self.layers[0]
        self.r_max, self.n = fed.shapes[first.a]
        self.m = {layer.a: fed.shapes[layer.b][0] for layer in self.layers}   # outputs: q_proj 576, v_proj 192
        widths = {fed.shapes[layer.a][1] for layer in self.layers}
        if len(widths) > 1:
            raise ValueError(f"she-lora: the adapted layers must share one input width (budgets count A's columns), "
                             f"got {sorted(widths)}; adapt projections of one width (e.g. q_proj, v_proj)")
        if max(self.m.values()) > he.slots():
            raise ValueError(f"she-lora: the server's product B_i A_i^cipher needs a layer's {max(self.m.values())} "
                             f"outputs in one ciphertext of {he.slots()} slots; use a narrower model")
        # columns per block that the server's product fits (chunk * m <= N/2 slots), per layer
        self.chunk = {a: min(self.opt["chunk"], he.slots() // m) for a, m in self.m.items()}
        self.ranks, self.ks = {}, {}
        for c in fed.clients:
            rank = c.device.lora_rank or self.r_max
            if rank > self.r_max:
                raise ValueError(f"device '{c.device.type}' of {c.name} has LoRA rank {rank}, above the model's "
                                 f"{self.r_max}; raise the scenario's model_params.lora_r to at least {rank}")
            self.ranks[c.name], self.ks[c.name] = rank, self._columns(c)
            fed.send(c.name, "server", "LoRA rank and HE budget", 12)
        self.key = None
        if any(self.ks.values()):
            self.key = he.keygen()
            public = self.key.public_only()
            fed.parties["server"].keys["ckks"] = public
            fed.send("key-server", "server", "ckks public context with galois keys", public.public)
            ope_key = os.urandom(16)
            for c in fed.clients:
                c.party.keys["ckks"] = self.key
                c.party.keys["ope"] = KeyMaterial("ope", b"", ope_key, {})
                fed.send("key-server", c.name, "ckks context and OPE key", len(self.key.secret) + len(ope_key))
        start = fed.params()
        for c in fed.clients:
            c.local = {n: t.clone() for n, t in (start | self._drawn(fed, c)).items()}
            for layer in self.layers:
                c.local[layer.a][self.ranks[c.name]:] = 0.0
                c.local[layer.b][:, self.ranks[c.name]:] = 0.0
        self.order: dict[str, list[int]] | None = None
        self.requests: dict[str, bytes] = {}
        self.costs: dict[str, list] = {}
        if self.opt["init"] == "client":   # the official first round: negotiation only, no upload
            self._negotiate(fed, fed.clients, {c.name: c.local for c in fed.clients}, in_setup=True)

    def _drawn(self, fed, client) -> dict[str, torch.Tensor]:
        """init "client": the client's own A0 (its own seed, never sent), U(-1/sqrt(n), 1/sqrt(n)) as peft's
        default init; B0 stays 0, so the model is unchanged. init "server": none (the initial model's A0)."""
        if self.opt["init"] != "client":
            return {}
        seed = np.random.default_rng([fed.scenario.seed, client.index, 0xA0]).integers(2 ** 62)
        gen = torch.Generator().manual_seed(int(seed))
        bound = 1.0 / np.sqrt(self.n)
        return {layer.a: (torch.rand(fed.shapes[layer.a], generator=gen) * 2 - 1) * bound for layer in self.layers}

    def hidden_initial(self, fed) -> dict[str, torch.Tensor]:
        if self.opt["init"] != "client":
            return {}
        return {layer.a: torch.ones(fed.shapes[layer.a], dtype=torch.bool) for layer in self.layers}

    def _columns(self, client) -> int:
        gamma = self.opt["budget"] if self.opt["budget"] is not None else client.device.he_budget
        if gamma <= 0:
            return 0
        return int(min(self.n, max(self.opt["min_columns"], np.floor(self.n * gamma + 1e-9))))

    # -- negotiation ---------------------------------------------------------------------------------
    def round_start(self, fed, round: int, clients: list, updates: dict) -> None:
        """init "server": the first round negotiates from the trained adapters (init "client" did in setup)."""
        if self.order is None:
            self._negotiate(fed, clients, {c.name: self._trained(fed, c, updates[c.name]) for c in clients})

    def _negotiate(self, fed, clients: list, adapters: dict, in_setup: bool = False) -> None:
        """Each client scores A's columns at its adapter (`adapters`: its parameters) and sends its OPE'd request
        (in setup as a message, else in its next upload's meta); the server runs Algorithm 1 on OPE values."""
        if not any(self.ks[c.name] for c in clients):
            self.order = {layer.a: [] for layer in self.layers}
            return
        per_layer: dict[str, list] = {layer.a: [] for layer in self.layers}
        for c in clients:
            trained = adapters[c.name]
            model = fed.new_model()
            state = dict(model.named_parameters())
            with torch.no_grad():
                for name, value in trained.items():
                    state[name].copy_(value)
            norms = lora.feature_norms(model, [layer.module for layer in self.layers],
                                       c.x[: self.opt["calibration"]])
            cipher = negotiation.OrderCipher(c.party.keys["ope"].secret)
            blobs = []
            for layer in self.layers:
                score = lora.importance(trained[layer.a][: self.ranks[c.name]].double().numpy(),
                                        norms[layer.module])
                cols = self._select(fed, c, score)
                pos, sc = cipher.positions(cols), cipher.scores(score[cols])
                blobs.append(negotiation.encode_message(pos, sc))
                per_layer[layer.a].append((self.ks[c.name], pos, sc))
            request = b"".join(len(b).to_bytes(4, "big") + b for b in blobs)
            if in_setup:
                fed.send(c.name, "server", "she-lora negotiation (OPE)", request)
            else:
                self.requests[c.name] = request
        wire = {a: negotiation.negotiate(reqs) for a, reqs in per_layer.items()}   # server: OPE values only
        self.server_order = wire
        self.order = {}
        for c in fed.clients:
            fed.send("server", c.name, "negotiated HE subset (OPE)", 8 * sum(len(v) for v in wire.values()))
        opener = negotiation.OrderCipher(clients[0].party.keys["ope"].secret)
        self.order = {a: opener.open_positions(v) for a, v in wire.items()}

    def _select(self, fed, client, score: np.ndarray) -> list[int]:
        k = self.ks[client.name]
        rule = self.opt["rule"]
        if rule == "random":
            rng = np.random.default_rng([fed.scenario.seed, client.index, 0x5E])
            return [int(j) for j in rng.permutation(self.n)[:k]]
        ranked = np.argsort(-score if rule == "max" else score, kind="stable")
        return [int(j) for j in ranked[:k]]

    def _trained(self, fed, client, update) -> dict[str, torch.Tensor]:
        start = client.merged(fed.params())
        return {n: start[n] + update[n] for n in fed.names}

    # -- client upload -------------------------------------------------------------------------------
    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        trained = self._trained(fed, client, update)
        r, k = self.ranks[client.name], self.ks[client.name]
        rng = np.random.default_rng([fed.scenario.seed, fed.round, client.index, 0xD9])
        plain, columns = {}, []
        for layer in self.layers:
            a = trained[layer.a].double().numpy()[:r]
            b = trained[layer.b].double().numpy()[:, :r]
            if self.opt["sigma"]:          # gradient-scale sigma, as DAGER's and gaussian-noise's: lr * sigma here
                std = self.opt["sigma"] * fed.scenario.lr
                a = a + rng.normal(0.0, std, a.shape)
                b = b + rng.normal(0.0, std, b.shape)
            order = self.order[layer.a]
            swap = lora.swap_order(self.n, order)
            shown = np.zeros((self.r_max, self.n))   # each entry at its parameter position: the view is
            shown[:r] = a                              # positional; the swap is public and re-applied on read
            mask = np.zeros((self.r_max, self.n), bool)
            mask[:r, swap[: self.n - k]] = True
            plain[layer.a] = PlainPart.of(torch.from_numpy(shown), mask)
            b_full = np.zeros((self.m[layer.a], self.r_max))
            b_full[:, :r] = b
            b_mask = np.zeros((self.m[layer.a], self.r_max), bool)
            b_mask[:, :r] = True
            plain[layer.b] = PlainPart.of(torch.from_numpy(b_full), b_mask)
            if k:
                columns.append((layer.a, a[:, order[:k]], ~mask & (np.arange(self.r_max) < r)[:, None]))
        tic = now()
        cipher = []
        if columns:   # one timed call per upload, as every defense's he_encrypt_s
            with fed.meter.time("he_encrypt_s"):
                cipher = [CipherPart("ckks", tuple(he.encrypt_blocks(client.party.keys["ckks"], cols, self.chunk[a])),
                                     ((a, hidden),), r * k) for a, cols, hidden in columns]
        enc_s = since(tic).cpu
        for name in self.extra:
            plain[name] = PlainPart.of(trained[name])
        meta = {"she-lora negotiation (OPE)": self.requests.pop(client.name)} if client.name in self.requests else {}
        payload = Payload(plain=plain, cipher=tuple(cipher), meta=meta)
        self.costs.setdefault(client.device.type, []).append((payload.nbytes, payload.cipher_bytes, enc_s))
        return payload

    # -- server --------------------------------------------------------------------------------------
    def aggregate(self, fed, uploads: list, server) -> Payload:
        k_min = min(self.ks[u.sender] for u in uploads)
        k_max = max(self.ks[u.sender] for u in uploads)
        meta, cipher, products = {}, [], []
        self.shapes_k = (k_min, k_max)
        adders = {}
        for layer in self.layers:
            m = self.m[layer.a]
            total = np.zeros((m, self.n - k_min))
            adders[layer.a] = he.BlockAggregator(server.keys["ckks"], m, self.chunk[layer.a]) if k_max else None
            for up in uploads:
                r, k = self.ranks[up.sender], self.ks[up.sender]
                b = up.payload.plain[layer.b].values().astype(np.float64).reshape(m, r)
                swap = lora.swap_order(self.n, self.order[layer.a])
                a = up.payload.plain[layer.a].dense().double().numpy()[:r][:, swap[: self.n - k]]
                total[:, : self.n - k] += up.weight * (b @ a)
                if k:
                    part = next(p for p in up.payload.cipher if p.layout[0][0] == layer.a)
                    products.append((layer.a, list(part.blobs), b, up.weight, k))
            b_p, a_p = lora.svd_factors(total, self.r_max)
            meta[layer.a + "/plain-svd"] = np.concatenate([b_p.ravel(), a_p.ravel()]).astype("<f4").tobytes()
        if products:   # one timed call per round: the server's whole B_i * A_i^cipher work
            with fed.meter.time("he_aggregate_s"):
                for a, blobs, b, weight, k in products:
                    adders[a].add(blobs, b, weight, k)
        for layer in self.layers:
            m, adder = self.m[layer.a], adders[layer.a]
            if k_max:
                mask = np.zeros((self.r_max, self.n), bool)
                mask[0, self.n - k_max:] = True
                cipher.append(CipherPart("ckks", tuple(adder.blobs()), ((layer.a, mask),), m * k_max))
        plain = {n: PlainPart.of(torch.from_numpy(sum(up.weight * up.payload.plain[n].values().astype(np.float64)
                                                      for up in uploads).reshape(fed.shapes[n])))
                 for n in self.extra}
        return Payload(plain=plain, cipher=tuple(cipher), meta=meta)

    # -- clients -------------------------------------------------------------------------------------
    def _decrypted(self, fed, aggregate: Payload, party) -> dict[str, np.ndarray]:
        """Every layer's m x k_max decrypted columns (one timed call); none for party None (the server)."""
        k_max = self.shapes_k[1]
        if not k_max or party is None:
            return {}
        with fed.meter.time("he_decrypt_s"):
            return {layer.a: he.decrypt_blocks(party.keys["ckks"],
                                               list(next(p for p in aggregate.cipher if p.layout[0][0] == layer.a).blobs),
                                               self.m[layer.a], k_max, self.chunk[layer.a]) for layer in self.layers}

    def _delta_w(self, aggregate: Payload, decrypted: dict, layer) -> tuple[tuple, np.ndarray, np.ndarray]:
        """(plaintext factors, m x k decrypted columns in swapped order (none for the server), the swap)."""
        width, m = self.n - self.shapes_k[0], self.m[layer.a]
        flat = np.frombuffer(aggregate.meta[layer.a + "/plain-svd"], "<f4").astype(np.float64)
        rank = min(self.r_max, m, width)
        b_p = flat[: m * rank].reshape(m, rank)
        a_p = flat[m * rank:].reshape(rank, width)
        cols = decrypted.get(layer.a, np.zeros((m, 0)))
        return (b_p, a_p), cols[:, ::-1], lora.swap_order(self.n, self.order[layer.a])

    def _refactor(self, fed, aggregate, party, rank: int) -> dict[str, torch.Tensor]:
        out = {}
        decrypted = self._decrypted(fed, aggregate, party)
        for layer in self.layers:
            (b_p, a_p), cols, swap = self._delta_w(aggregate, decrypted, layer)
            b_hat, a_hat = lora.reparameterize((b_p[:, :rank], a_p[:rank]), cols, swap, rank)
            b_full, a_full = np.zeros((self.m[layer.a], self.r_max)), np.zeros((self.r_max, self.n))
            b_full[:, :rank], a_full[:rank] = b_hat, a_hat
            out[layer.b] = torch.from_numpy(b_full).float()
            out[layer.a] = torch.from_numpy(a_full).float()
        return out

    def decode(self, fed, aggregate: Payload, party) -> dict[str, torch.Tensor]:
        current = fed.params()
        new = self._refactor(fed, aggregate, party, self.r_max)
        for n in self.extra:
            new[n] = torch.tensor(aggregate.plain[n].values().reshape(fed.shapes[n]), dtype=torch.float32)
        self.last = (aggregate, party)
        return {n: new[n] - current[n] for n in fed.names}

    def merge(self, fed, client, global_update) -> None:
        aggregate, _ = self.last
        client.local = self._refactor(fed, aggregate, client.party, self.ranks[client.name])

    def server_estimate(self, fed) -> dict[str, torch.Tensor]:
        """The adapters of the last aggregate as the aggregation server can rebuild them from its own plaintext
        sums (the paper's "unencrypted parameters", table 14's masked model): encrypted columns of Delta W as 0."""
        if not hasattr(self, "last"):
            return {}
        return self._refactor(fed, self.last[0], None, self.r_max)

    # -- measurements (measure.py) ------------------------------------------------------------------
    def run_metrics(self, fed) -> dict:
        return measure.run_metrics(self, fed)

    def delta_w(self, fed, aggregate: Payload, party) -> dict:
        return measure.delta_w(self, fed, aggregate, party)


@DEFENSES.register("flex-lora", "Flex-LoRA: heterogeneous-rank LoRA, plaintext Delta W aggregation and SVD "
                                "to each rank; sigma adds Gaussian noise of gradient-scale std sigma (lr * sigma on the "
                                "uploaded factors) as Flex-LoRA-DP")
class FlexLoRA(SheLoRA):
    links = {"paper": "https://arxiv.org/abs/2402.11505"}
    key_topology = "none"

    def __init__(self, sigma: float = 0.0) -> None:
        super().__init__(budget=0.0, sigma=sigma, init="server")   # Flex-LoRA's server sends the initial adapters
        self.params = {"sigma": sigma}

    def undefended(self) -> bool:
        """Without noise the server reads every trained factor in the clear: the LoRA scenarios' undefended row."""
        return self.opt["sigma"] == 0
