"""The paper's comparison methods on the same footing as SenseCrypt: Paillier, key server, the round-time model.

paillier-full   "Baseline" of section 4.1: every entry Paillier-encrypted (python-paillier per
                parameter), plain FedAvg over all clients, decrypted by the key server. With
                `paillier_slice` = S > 0 it encrypts only the first S values of each upload for real
                and extrapolates every cost (slices.py): the setting for models too large to encrypt.
maskcrypt-paillier  MaskCrypt's masks (defenses/maskcrypt.py: gradient-guided proposals from Plato's
                estimate, ordered union) with the paper's Paillier backend and key server; the key
                server hands back each global decrypted, so the estimate a client ranks by is the
                whole global it received. `union_cap` truncates the round-robin union to a fraction
                of the entries (it keeps every client's best proposals first): the paper's fairness
                setting of equal mask sizes, not Plato's.
Both take the scenario's device profiles (client.device) as SenseCrypt does and report
round_time_max_s / round_time_mean_s from the same model. A suite sets `union_cap` per scenario
through the scenario's `defense_params`.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.crypto import clock
from bench.crypto.keys import provision
from bench.protocol.configurable import Configurable
from bench.protocol.aggregation import Aggregation
from bench.protocol.defense import Defense
from bench.protocol.payloads import hybrid_payload
from bench.crypto import open_decryptor, open_encryptor
from bench.protocol.wire import CipherPart, Message, Payload
from bench.registry import DEFENSES
from defenses.maskcrypt import MaskCrypt, round_robin_union
from defenses.sensecrypt import percluster
from defenses.sensecrypt.evaluation import own_label_accuracy
from defenses.sensecrypt.profiles import RoundClock, device_profiles
from defenses.sensecrypt.slices import SliceCosts, prefix_mask, timed


class _Timed:
    """Device profiles, the Paillier key from the key server, and the round clock."""

    def _start(self, fed, key_bits: int) -> None:
        self.key = provision(fed, "key-server", scheme="paillier", key_bits=key_bits)
        fed.parties["server"].state["he_params"] = self.key.params
        r, v = device_profiles(fed)
        for client in fed.clients:
            fed.send(client.name, "server", "device profile (r_i, v_i)", 16)
        self.clock = RoundClock(r, v)
        self.encryptions: list[dict] = []   # measured (values, seconds) per upload: the cost model's check

    def _timed_encode(self, fed, client, make) -> Payload:
        started = clock.now().cpu
        payload = make()
        seconds = clock.now().cpu - started
        self.clock.charge(fed.round, client.index, seconds)
        self.clock.upload(fed.round, client.index, payload.nbytes)
        self.encryptions.append({"round": fed.round, "client": client.name, "seconds": seconds,
                                 "values": payload.cipher[0].length if payload.cipher else 0})
        return payload

    def _metrics(self, fed) -> dict:
        own = own_label_accuracy(fed)
        details = {"key_bits": self.key.params["key_bits"],
                   "test_only_key_size": bool(self.key.params["test_only_key_size"]),
                   "round_time": self.clock.details(), "accuracy_own_labels": own, "encryptions": self.encryptions}
        out = {"he_params": dict(self.key.params), **self.clock.summary(), "paillier_baseline": details}
        if own is not None:
            out["accuracy_own_labels"] = own["global"]
        return out


def _check(key_bits: int) -> None:
    if key_bits < 512 or key_bits % 8:
        raise ValueError(f"key_bits must be a multiple of 8 and >= 512 (2048 outside tests), got {key_bits}")


@DEFENSES.register("paillier-full", "every entry Paillier-encrypted, FedAvg under HE, key server decrypts; "
                                    "paillier_slice > 0 measures a slice and extrapolates")
class PaillierFull(_Timed, Defense):
    links = {"paper": "https://arxiv.org/abs/2508.04100"}
    key_topology = "key-server"

    def __init__(self, key_bits: int = 2048, paillier_slice: int = 0) -> None:
        _check(key_bits)
        if not isinstance(paillier_slice, int) or paillier_slice < 0:
            raise ValueError(f"paillier_slice must be an int >= 0 (0 = encrypt every value), got {paillier_slice!r}")
        super().__init__(key_bits=key_bits, paillier_slice=paillier_slice)
        self.key_bits, self.slice = key_bits, paillier_slice

    def setup(self, fed) -> None:
        self._start(fed, self.key_bits)
        self.everything = {n: np.ones(int(np.prod(s)) if s else 1, bool) for n, s in fed.shapes.items()}
        self.sizes = [int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1 for n in fed.names]
        self.costs = SliceCosts(self.slice) if self.slice else None

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        if self.costs is None:
            return self._timed_encode(fed, client, lambda: hybrid_payload(fed, client, update, weight,
                                                                          self.everything, scheme="paillier"))
        flat = percluster.flatten(update, fed.names) * weight
        take = self.costs.take(flat.size)
        layout = tuple((n, m) for n, m in percluster.split(prefix_mask(np.ones(flat.size, bool), take), fed.names,
                                                            self.sizes).items() if m.any())
        blobs, seconds = timed(open_encryptor(client.party.keys["paillier"], client.name).encrypt, flat[:take])
        payload = Payload(cipher=(CipherPart("paillier", tuple(blobs), layout, take),))
        enc = self.costs.record("he_encrypt", seconds, take, flat.size)
        self.costs.record("ciphertext_bytes", sum(len(b) for b in blobs), take, flat.size)
        upload = self.costs.record("upload_bytes", payload.nbytes, take, flat.size)
        self.clock.charge(fed.round, client.index, enc)
        self.clock.upload(fed.round, client.index, int(upload))
        self.costs.withheld[blobs[0]] = flat   # the simulation's channel (slices.py)
        return payload

    def start_aggregate(self, fed, server) -> Aggregation:
        return _TimedSum(self, Defense.start_aggregate(self, fed, server))

    def decode(self, fed, aggregate: Payload, party) -> dict[str, torch.Tensor]:
        if self.costs is None:
            return Defense.decode(self, fed, aggregate, party)
        part = aggregate.cipher[0]
        real, seconds = timed(open_decryptor(party.keys["paillier"], party.name).decrypt, list(part.blobs),
                              part.length)
        self.costs.record("he_decrypt", seconds, part.length, sum(self.sizes))
        total = sum(self.costs.withheld[up] for up in self.round_uploads)
        self.costs.withheld.clear()
        self.costs.check(real, total[:part.length], "key server")
        return {n: torch.from_numpy(v).float().reshape(fed.shapes[n])
                for n, v in percluster.split(total, fed.names, self.sizes).items()}

    def run_metrics(self, fed) -> dict:
        out = self._metrics(fed)
        if self.costs is not None:
            out.update(self.costs.metrics())
            out.update({k[:-2] + "_extrapolated_s": out.pop(k) for k in ("round_time_max_s", "round_time_mean_s")
                        if k in out})
            out["encrypted_fraction_extrapolated"] = 1.0
        return out


class _TimedSum(Aggregation):
    """The default running sum, its seconds recorded for the slice extrapolation (slices.py) when sliced."""

    def __init__(self, defense: PaillierFull, inner: Aggregation):
        self.defense, self.inner, self.seconds, self.summed, self.length = defense, inner, 0.0, [], 0

    def fold(self, upload) -> None:
        _, seconds = timed(self.inner.fold, upload)
        self.seconds += seconds
        if self.defense.costs is not None:
            self.length = self.length if self.summed else upload.payload.cipher[0].length
            self.summed.append(upload.payload.cipher[0].blobs[0])   # whose values were summed

    def result(self) -> Payload:
        out, seconds = timed(self.inner.result)
        if self.defense.costs is not None:
            self.defense.round_uploads = self.summed
            self.defense.costs.record("he_aggregate", self.seconds + seconds, self.length, sum(self.defense.sizes))
        return out


@DEFENSES.register("maskcrypt-paillier", "MaskCrypt masks with per-parameter Paillier and a key server "
                                         "(the paper's MaskCrypt baseline); optional union_cap")
class MaskCryptPaillier(_Timed, MaskCrypt):
    key_topology = "key-server"

    def __init__(self, rho: float | None = None, union_cap: float | None = None, random_mask: bool = False,
                 key_bits: int = 2048) -> None:
        _check(key_bits)
        if union_cap is not None and not 0.0 < union_cap <= 1.0:
            raise ValueError(f"union_cap must be in (0, 1], got {union_cap}")
        MaskCrypt.__init__(self, rho=rho, random_mask=random_mask, keys="key-server")
        Configurable.__init__(self, rho=rho, union_cap=union_cap, random_mask=random_mask, key_bits=key_bits)
        self.union_cap, self.key_bits = union_cap, key_bits

    def setup(self, fed) -> None:
        self._start(fed, self.key_bits)
        self.cap = self.union_cap
        if self.rho is None:
            self.rho = 0.10 if fed.data.input_shape[0] == 3 else 0.05
        self.sizes = [int(np.prod(fed.shapes[n])) if fed.shapes[n] else 1 for n in fed.names]

    def _send_proposal(self, fed, round: int, client, update) -> np.ndarray:
        """MaskCrypt's proposal, with its cost charged to its client's round time."""
        started = clock.now().cpu
        proposal = self._proposal(fed, client, update)
        self.clock.charge(round, client.index, clock.now().cpu - started)
        fed.send(client.name, "server", "mask proposal", Message(proposal.astype("<i4").tobytes(), "entries:i4"))
        return proposal

    def _limit(self, union: np.ndarray) -> np.ndarray:
        """The paper's fairness rule: MaskCrypt's union capped to SenseCrypt's mask size."""
        if self.cap is None:
            return union
        return union[:max(1, int(round_half(self.cap * sum(self.sizes))))]

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        def make() -> Payload:
            payload = hybrid_payload(fed, client, update, weight, self.mask, scheme="paillier")
            return Payload(plain=payload.plain, cipher=payload.cipher, meta={"indices": self.indices},
                           layouts={"indices": "entries:i4"})
        return self._timed_encode(fed, client, make)

    def run_metrics(self, fed) -> dict:
        return self._metrics(fed)


def round_half(x: float) -> float:
    return float(np.floor(x + 0.5))
