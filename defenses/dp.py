"""User-level DP-FedAvg (McMahan et al. 2018; Geyer et al. 2017) as a wrapper around any defense.

Every sampled client clips its whole update (parameters and floating BN statistics, the
entries of fed.names; integer counters never enter an update) to L2 norm `clip`; the
wrapped `inner` defense (Flower-style composition) then encodes, aggregates and decodes
the clipped updates. The aggregate is the sum divided by W = clients_per_round, not
the engine's sample-share weighting: with sample shares one client moves the average
by up to w_k * C, not C/W, so noise calibrated for C/W would be too small (anchors
pitfall 11c). Under fixed-size sampling W is the number sampled, i.e. the uniform 1/m
average; under Poisson sampling it is McMahan's fixed-denominator estimator (dividing
by the realized count would make the denominator itself depend on who took part).
Gaussian noise makes the sum carry std z*C (z*C/W on the estimate), and ledgers
(bench.federation.accounting) are stepped once per round with the user-level rate
q = clients_per_round / num_clients. The ledger is the only source of z, and noise
cannot be drawn for a round it has not accounted.

Whose epsilon: the engine forces the attacked client into the attack round (its sampler's
rule is bench.federation.accounting.forced), so its participation there is certain: its own
ledger counts that round at q = 1 and its other rounds at q, and the row's `epsilon` is
that client's (59 rounds at q = 0.1 and one at q = 1, z = 1: RDP 8.01, PRV 7.24, where
every round at q reads 6.33 and 5.58). `epsilon_other_clients` is what every other
client spends (q every round: forcing one client in only lowers another's chance under
fixed-size sampling, and leaves it under Poisson). `target_epsilon` calibrates z for the
attacked client's rounds. Adjacency: user-level add/remove, a client's clipped update
against none (a zero vector), so the sum moves by at most C; replace-one moves it by 2 C
(`epsilon_replace_one` where every round is unsubsampled). An empty Poisson round gets one
client at random; that client's extra chance, (1 - q)^N / N a round, is not accounted.

`dp-fedavg` (central): the aggregation server adds the noise to the aggregate's
plaintext parts. Positions the inner defense sends as ciphertext cannot be noised by
the server; there the party that decodes adds the noise after decryption. Honest
reading for the leaderboard: central DP protects the released model, not the upload.
The honest-but-curious server sees every CLIPPED but UN-NOISED individual update (the
server view is derived from the upload), so an attack on the view faces clipping only;
`upload_noise_multiplier` is 0. With a shared-client-key inner defense, every key
holder can also decrypt the un-noised aggregate.

`dp-fedavg-local` (distributed noise): each of the m clients of a round adds
N(0, (z*C)^2/m) to its clipped update before encoding, so the sum carries std z*C, the
same as central and accounted by the same ledger. The server view IS noised, but one
upload carries only noise multiplier z/sqrt(m) relative to its sensitivity C (the
weakest over the run is reported as `upload_noise_multiplier`); the ledger's epsilon
is the guarantee of the aggregate. SelectiveShield's eq. 21 instead gives every client
noise std z*C*sqrt(m), a per-upload multiplier z*sqrt(m), m times the noise on the sum.

Composition: only inner defenses whose decoded aggregate is the weighted sum of what they
were given (`Defense.decodes_weighted_sum`) can be wrapped; others (per-cluster FedAvg,
per-entry means, carried-over residuals) are refused when the suite loads.

Not covered by the guarantee: anything an inner defense sends in the clear that is
derived from the (clipped) updates during its negotiation, e.g. mask proposals.

Where it applies: user-level noise on the mean of m clipped updates has std z*C/m, which for a handful of clients
drowns the update (core's 4-client MNIST MLP stays at chance, its 2-client LoRA fine-tune diverges). `min_cohort`
states the rule a suite applies: the defense is n/a (Defense.applicable) in a scenario with fewer clients a round.
It is a parameter, off by default, so the suites that reproduce a paper's small-cohort setting keep their rows.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch

from bench.federation.accounting import RdpLedger, forced, noise_for_epsilon, noise_for_histories, report
from bench.protocol.aggregation import Aggregation
from bench.protocol.defense import Defense, Party, running_aggregate
from bench.protocol.wire import Payload, PlainPart, Upload
from bench.registry import DEFENSES


def clip_update(update: dict[str, torch.Tensor], clip: float) -> tuple[dict[str, torch.Tensor], float]:
    """Scale the whole update to L2 norm at most `clip`; returns the clipped update and the original norm."""
    for name, t in update.items():
        if not t.is_floating_point():
            raise ValueError(f"dp: update entry '{name}' is {t.dtype}; only floating entries can be clipped and noised")
    norm = math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in update.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {n: (t.detach().double() * scale).to(t.dtype) for n, t in update.items()}, norm


def _rng(fed, party: Party) -> np.random.Generator:
    """Each party draws its noise from its own stream, seeded per run, apart from the engine's sampling stream."""
    if "dp_rng" not in party.state:
        party.state["dp_rng"] = np.random.default_rng([fed.scenario.seed, 0xD9, zlib.crc32(party.name.encode())])
    return party.state["dp_rng"]


@DEFENSES.register("dp-fedavg", "user-level DP-FedAvg, central noise: clip on clients, server adds "
                   "N(0, (zC/W)^2) to the sum / W (server sees clipped, un-noised uploads)")
class DPFedAvg(Defense):
    """Central user-level DP-FedAvg: client clipping, uniform average, server-side Gaussian noise."""
    links = {"paper": "https://arxiv.org/abs/1710.06963"}

    local_noise: ClassVar[bool] = False
    differentially_private: ClassVar[bool] = True

    def __init__(self, noise_multiplier: float | None = None, target_epsilon: float | None = None,
                 clip: float = 1.0, inner: str = "plaintext", inner_params: dict | None = None,
                 min_cohort: int | None = None) -> None:
        super().__init__(noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, clip=clip, inner=inner,
                         inner_params=inner_params, min_cohort=min_cohort)
        if min_cohort is not None and (isinstance(min_cohort, bool) or not isinstance(min_cohort, int)
                                       or min_cohort < 1):
            raise ValueError(f"dp-fedavg: min_cohort must be a whole number of clients >= 1, got {min_cohort!r}")
        if (noise_multiplier is None) == (target_epsilon is None):
            raise ValueError("dp-fedavg: give exactly one of noise_multiplier or target_epsilon")
        if noise_multiplier is not None and not noise_multiplier > 0:
            raise ValueError(f"dp-fedavg: noise_multiplier must be > 0 (clipping alone is not DP), "
                             f"got {noise_multiplier}")
        if target_epsilon is not None and not target_epsilon > 0:
            raise ValueError(f"dp-fedavg: target_epsilon must be > 0, got {target_epsilon}")
        if not clip > 0:
            raise ValueError(f"dp-fedavg: clip must be > 0, got {clip}")
        inner_cls = DEFENSES.get(inner)
        if getattr(inner_cls, "differentially_private", False):
            raise ValueError(f"dp-fedavg: inner defense '{inner}' is itself DP; wrap a non-DP defense")
        if not getattr(inner_cls, "decodes_weighted_sum", False):
            fits = [n for n in DEFENSES.names() if getattr(DEFENSES.get(n), "decodes_weighted_sum", False)
                    and not getattr(DEFENSES.get(n), "differentially_private", False)]
            raise ValueError(f"dp-fedavg: inner defense '{inner}' does not decode the weighted sum of the clipped "
                             f"updates, so noise calibrated for sum / W would not give the accounted epsilon; "
                             f"wrap one of: {', '.join(fits)}")
        self.inner: Defense = inner_cls(**(inner_params or {}))
        self.key_topology = self.inner.key_topology
        self.clip = float(clip)
        self.ledger: RdpLedger | None = None     # every client the engine never forces in: q each round
        self.attacked: RdpLedger | None = None   # the attacked client: q = 1 in the round it is forced in
        self._sampled = 0          # clients in the current round
        self._clipped: dict = {}   # this round's clipped updates by client: (the update given, clipped)
        self._most = 0             # most clients in any round: the weakest per-upload noise

    def applicable(self, setting) -> str | None:
        """With `min_cohort`, user-level DP applies only to a scenario that samples at least that many clients a
        round: the noise on the mean is z * clip / (clients a round), so with a handful of clients it swamps the
        update (a configuration of the suite, not a finding about the defense). McMahan et al. 2018 train with
        hundreds to thousands of users a round; a suite that states the rule sets min_cohort (core: 100, the
        cohort of its cross-device scenario). Without it (the default) the defense applies wherever its inner
        defense does."""
        cohort, least = setting.clients_per_round, self.params["min_cohort"]
        if least is not None and cohort is not None and cohort < least:
            return (f"user-level DP needs a cohort of at least {least} clients a round (McMahan et al. 2018 train "
                    f"with hundreds to thousands a round); this scenario samples {cohort}")
        return self.inner.applicable(setting)

    # -- hooks ---------------------------------------------------------------------------------
    def setup(self, fed) -> None:
        sc = fed.scenario
        q = sc.clients_per_round / sc.num_clients
        z = self.params["noise_multiplier"]
        if z is None:   # planned for the attacked client, the one whose rounds spend most
            certain = sum(sc.attack_client in forced(sc, r) for r in range(sc.rounds))
            z = noise_for_epsilon(self.params["target_epsilon"], sc.delta, q, sc.rounds) if q == 1 or not certain \
                else noise_for_histories(self.params["target_epsilon"], sc.delta, [[(q, sc.rounds - certain),
                                                                                    (1.0, certain)]])
        self.ledger, self.attacked = RdpLedger(z, q), RdpLedger(z, q)
        self.inner.setup(fed)

    def round_start(self, fed, round: int, clients: list, updates: dict[str, dict[str, torch.Tensor]]) -> None:
        sc = fed.scenario
        if not math.isclose(sc.clients_per_round / sc.num_clients, self.ledger.sample_rate):
            raise RuntimeError(f"dp: the scenario samples q={sc.clients_per_round}/{sc.num_clients}, "
                               f"the ledger accounts q={self.ledger.sample_rate}")
        if sc.sampling == "fixed" and len(clients) != sc.clients_per_round:
            raise RuntimeError(f"dp: round {round} sampled {len(clients)} clients under fixed-size sampling, "
                               f"the ledger accounts {sc.clients_per_round} of {sc.num_clients}")
        self._sampled = len(clients)
        self._most = max(self._most, len(clients))
        while self.ledger.steps < round + 1:   # this round's release; a copy that joins the run at a later round
            r = self.ledger.steps              # (a malicious server's exchange) accounts the rounds released before
            self.ledger.step()
            self.attacked.step(1.0 if sc.attack_client in forced(sc, r) else None)
        if self.ledger.steps != round + 1:
            raise RuntimeError(f"dp: round {round} started twice; the ledger accounted {self.ledger.steps} rounds")
        # the inner negotiation sees what will be encoded: clipped (not yet noised) updates, kept for encode
        self._clipped = {n: (u, clip_update(u, self.clip)[0]) for n, u in updates.items()}
        self.inner.round_start(fed, round, clients, {n: c for n, (_, c) in self._clipped.items()})

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        given, clipped = self._clipped.pop(client.name, (None, None))
        if given is not update:   # a further (counterfactual) upload of the attacked client
            clipped, _ = clip_update(update, self.clip)
        if self.local_noise:
            std = self._z(fed) * self.clip / math.sqrt(self._sampled)
            rng = _rng(fed, client.party)
            clipped = {n: t + torch.from_numpy(rng.normal(0.0, std, tuple(t.shape))).to(t.dtype)
                       for n, t in clipped.items()}
        return self.inner.encode(fed, client, clipped, 1.0 / fed.scenario.clients_per_round)

    def aggregate(self, fed, uploads: list[Upload], server: Party) -> Payload:
        fixed = [replace(up, weight=1.0 / fed.scenario.clients_per_round) for up in uploads]
        return self._central_noise(fed, server, self.inner.aggregate(fed, fixed, server))

    def start_aggregate(self, fed, server: Party) -> Aggregation | None:
        """The inner defense's running aggregate, fed each upload at weight 1/W and noised once the round is in;
        None (the list path) when the inner defense aggregates a list."""
        inner = running_aggregate(self.inner, fed, server)
        return None if inner is None else _Reweighted(self, fed, server, inner)

    def _central_noise(self, fed, server: Party, aggregate: Payload) -> Payload:
        if self.local_noise:
            return aggregate
        std, rng = self._z(fed) * self.clip / fed.scenario.clients_per_round, _rng(fed, server)
        plain = {}
        for name, part in aggregate.plain.items():
            values = part.values().astype(np.float64) + rng.normal(0.0, std, part.values().shape)
            plain[name] = PlainPart(values.astype("<f4").tobytes(), part.shape, part.mask)
        return replace(aggregate, plain=plain)

    def decoder(self, fed) -> Party:
        return self.inner.decoder(fed)

    def decode(self, fed, aggregate: Payload, party: Party) -> dict[str, torch.Tensor]:
        update = self.inner.decode(fed, aggregate, party)
        if self.local_noise or not aggregate.cipher:
            return update
        # ciphertext positions: the server could not noise them, so the decoding party does
        std, rng = self._z(fed) * self.clip / fed.scenario.clients_per_round, _rng(fed, party)
        flat = {n: t.detach().reshape(-1).double().clone() for n, t in update.items()}
        for part in aggregate.cipher:
            for name, mask in part.layout:
                mask = np.asarray(mask, bool).reshape(-1)
                flat[name][torch.from_numpy(mask)] += torch.from_numpy(rng.normal(0.0, std, int(mask.sum())))
        return {n: flat[n].to(update[n].dtype).reshape(update[n].shape) for n in update}

    def merge(self, fed, client, global_update: dict[str, torch.Tensor]) -> None:
        self.inner.merge(fed, client, global_update)

    def run_metrics(self, fed) -> dict[str, Any]:
        sc = fed.scenario
        z = self.ledger.noise_multiplier
        upload_z = z / math.sqrt(max(self._most, 1)) if self.local_noise else 0.0
        epsilons, details = report(
            sc.delta, self.attacked.history, self.ledger.history, level="user",
            sensitivity="C = clip: a client's clipped update against none (a zero vector); the sum moves by at most C",
            sampling="Poisson at rate q" if sc.sampling == "poisson"
            else f"{sc.clients_per_round} of {sc.num_clients} clients a round, accounted as Poisson at rate q",
            covers="each noised upload and the aggregate" if self.local_noise
            else "the released aggregate, not the clipped, un-noised upload the server reads")
        details |= {"attacked_client": fed.clients[sc.attack_client].name, "noise_multiplier": z,
                    "sample_rate": self.ledger.sample_rate, "steps": self.ledger.steps,
                    "noise": "client-side, distributed" if self.local_noise else "central, added after aggregation",
                    "aggregation": f"sum / {sc.clients_per_round} (clients_per_round)", "inner": self.params["inner"],
                    "target_epsilon": self.params["target_epsilon"]}
        return dict(self.inner.run_metrics(fed)) | epsilons | {
            "noise_multiplier": z, "clip": self.clip, "upload_noise_multiplier": upload_z, "dp": details}

    # -- noise ---------------------------------------------------------------------------------
    def _z(self, fed) -> float:
        """The noise multiplier every noise draw uses: the ledger's, and only for a round it has accounted."""
        if self.ledger is None or self.ledger.steps != fed.round + 1:
            raise RuntimeError(f"dp: noise requested in round {fed.round} but the ledger accounted "
                               f"{0 if self.ledger is None else self.ledger.steps} rounds")
        return self.ledger.noise_multiplier


class _Reweighted(Aggregation):
    """DP-FedAvg's aggregate as uploads arrive: the inner running aggregate at weight 1/W, then the central noise."""

    def __init__(self, dp: DPFedAvg, fed, server: Party, inner: Aggregation):
        self.dp, self.fed, self.server, self.inner = dp, fed, server, inner

    def fold(self, upload: Upload) -> None:
        self.inner.fold(replace(upload, weight=1.0 / self.fed.scenario.clients_per_round))

    def result(self) -> Payload:
        return self.dp._central_noise(self.fed, self.server, self.inner.result())


@DEFENSES.register("dp-fedavg-local", "user-level DP-FedAvg, distributed noise: each client adds "
                   "N(0, (zC)^2/m) to its clipped update (server sees noised uploads)")
class DPFedAvgLocal(DPFedAvg):
    """DP-FedAvg whose noise is added by the clients before upload, so the server view is noised."""

    local_noise = True
