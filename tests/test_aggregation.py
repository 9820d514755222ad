"""Running aggregates: uploads folded one at a time give the batch sums exactly, the engine holds one upload at a
time, and a defense that overrides `aggregate` alone still gets the round's list."""
from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from bench.crypto import ckks_keygen, choose_ckks_params, open_aggregator, open_decryptor, open_encryptor, \
    paillier_keygen
from bench.crypto.ckks import to_grid
from bench.data.loading import load_dataset
from bench.federation.engine import build_federation, local_update, run_federation
from bench.federation.scenario import Scenario
from bench.protocol.aggregation import Aggregation, RunningSum
from bench.protocol.contracts import ContractError, check_defense
from bench.protocol.defense import Defense, running_aggregate
from bench.protocol.wire import WireError, dense_payload
from bench.registry import DEFENSES
from tests.conftest import weighted_uploads


def _blobs(km, values: np.ndarray) -> list[bytes]:
    return open_encryptor(km.public_only(), "client").encrypt(values)


@pytest.mark.parametrize("scheme", ["ckks", "paillier"])
def test_folding_ciphertexts_gives_the_batch_sum_byte_for_byte(scheme):
    """The folded sum decrypts to the plaintext sum of the uploads (an oracle outside the aggregator: kills a `fold`
    that drops or repeats an upload, which the byte comparison with `add` alone misses, `add` folding the same way),
    and its bytes are the batch `add`'s."""
    km = ckks_keygen(choose_ckks_params(4)) if scheme == "ckks" else paillier_keygen(512)
    rng = np.random.default_rng(0)
    values = [rng.normal(0, 0.01, 5000) for _ in range(4)]
    uploads = [_blobs(km, v) for v in values]
    server = open_aggregator(km.public_only(), "server")
    running = server.running()
    for i, up in enumerate(uploads):
        running.fold(up, f"client-{i}")
    folded = running.blobs()
    got = open_decryptor(km, "key holder").decrypt(folded, 5000)
    tolerance = 1e-6 if scheme == "ckks" else 4 * 2.0 ** -40   # CKKS noise bound; Paillier: 4 roundings to 2^-40
    assert np.abs(got - np.sum(values, axis=0)).max() < tolerance
    assert np.abs(got - np.sum(values[:3], axis=0)).max() > 100 * tolerance   # one upload fewer is told apart
    assert folded == server.add(uploads, [f"client-{i}" for i in range(4)])


def _fed(num_clients: int = 4, model: str = "mlp-tiny", **kw):
    sc = Scenario(name="agg", dataset="digits", model=model, num_clients=num_clients, clients_per_round=num_clients,
                  rounds=1, max_train=40 * num_clients, max_test=30, **kw)
    return sc, build_federation(sc, load_dataset("digits", None, max_train=sc.max_train, max_test=30))


@pytest.mark.parametrize("name", ["fedml-he", "selective"])
def test_a_hybrid_aggregate_folded_is_the_weighted_sum(name):
    """Plaintext parts: the float64 weighted sum in upload order, to the byte; ciphertexts: exact on the grid."""
    defense = DEFENSES.get(name)(**({"rule": "random", "ratio": 0.3} if name == "selective" else {}))
    _, fed = _fed()
    defense.setup(fed)
    gen = torch.Generator().manual_seed(0)
    updates = {c.name: local_update(fed, c, c.x, c.y, "delta", gen) for c in fed.clients}
    uploads = weighted_uploads(fed, defense, updates)
    running = defense.start_aggregate(fed, fed.parties["server"])
    aggregate = running.fold_all(uploads)
    assert aggregate.plain and aggregate.cipher
    for name_, part in aggregate.plain.items():
        total = np.zeros(part.values().shape)
        for up in uploads:
            total += up.weight * up.payload.plain[name_].values().astype(np.float64)
        assert part.data == total.astype("<f4").tobytes()
    (head,), dec = aggregate.cipher, open_decryptor(defense.key, "client-0")
    values, expected = dec.decrypt(list(head.blobs), head.length), np.zeros(head.length)
    for up in uploads:
        offset = 0
        for n, mask in head.layout:
            count = int(mask.sum())
            expected[offset:offset + count] += to_grid(updates[up.sender][n].reshape(-1).double().numpy()[mask]
                                                       * up.weight)
            offset += count
    np.testing.assert_array_equal(values, to_grid(expected))


def test_an_upload_off_the_first_layout_is_refused_when_it_is_folded():
    _, fed = _fed(num_clients=2)
    updates = {c.name: {n: torch.ones(s) for n, s in fed.shapes.items()} for c in fed.clients}
    uploads = weighted_uploads(fed, Defense(), updates)
    first = next(iter(fed.shapes))
    uploads[1].payload.plain.pop(first)
    running = RunningSum(fed, fed.parties["server"])
    running.fold(uploads[0])
    with pytest.raises(WireError, match=f"^client-1: sends no plaintext '{first}' but client-0 does"):
        running.fold(uploads[1])


class _Watched(Defense):
    """Plaintext FedAvg that notes, each time a client encodes, how many earlier uploads are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.alive: list[int] = []
        self.refs: list[weakref.ref] = []

    def encode(self, fed, client, update, weight):
        self.alive.append(sum(ref() is not None for ref in self.refs))
        payload = dense_payload(update)
        self.refs.append(weakref.ref(payload))
        return payload


class _Listed(_Watched):
    """The same, written for the list contract: its own `aggregate`."""

    def aggregate(self, fed, uploads, server):
        self.listed = len(uploads)
        return super().aggregate(fed, uploads, server)


def test_the_engine_folds_uploads_as_they_arrive_and_a_list_aggregate_still_gets_the_list():
    results = {}
    for kind in (_Watched, _Listed):
        sc, fed = _fed(num_clients=5)
        defense = kind()
        run_federation(sc, fed.data, defense, fed=fed)
        results[kind] = defense, fed.params()
    folded, listed = results[_Watched][0], results[_Listed][0]
    assert folded.alive == [0] * 5                  # each upload was folded and dropped before the next encode
    assert listed.alive == [0, 1, 2, 3, 4] and listed.listed == 5
    for n, value in results[_Watched][1].items():
        assert torch.equal(value, results[_Listed][1][n])


def test_which_class_aggregates_decides_between_folding_and_the_list():
    class Own(Defense):
        def aggregate(self, fed, uploads, server):
            return super().aggregate(fed, uploads, server)

    class Folds(Own):
        def start_aggregate(self, fed, server):
            return RunningSum(fed, server)

    class OwnAgain(Folds):
        def aggregate(self, fed, uploads, server):
            return super().aggregate(fed, uploads, server)

    assert isinstance(running_aggregate(Defense(), None, None), RunningSum)
    assert running_aggregate(Own(), None, None) is None
    assert isinstance(running_aggregate(Folds(), None, None), RunningSum)
    assert running_aggregate(OwnAgain(), None, None) is None
    dp = DEFENSES.get("dp-fedavg")(noise_multiplier=1.0)
    assert isinstance(running_aggregate(dp, None, None), Aggregation)
    dp.inner = Own()                                  # a wrapper folds only what its inner defense folds
    assert running_aggregate(dp, None, None) is None


def test_start_aggregate_is_checked_at_load_and_where_its_result_is_received():
    class Wrong(Defense):
        def encode(self, fed, client, update, weight):
            return dense_payload(update)

        def start_aggregate(self, fed):
            return None

    assert "start_aggregate" in check_defense(Wrong) and "def start_aggregate(self, fed, server)" in check_defense(Wrong)

    class Returns(Wrong):
        def start_aggregate(self, fed, server):
            return {}

    sc, fed = _fed(num_clients=2)
    with pytest.raises(ContractError, match="start_aggregate returned dict, expected a bench.Aggregation"):
        run_federation(sc, fed.data, Returns(), fed=fed)
