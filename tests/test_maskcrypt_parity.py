"""MaskCrypt's masks equal those Plato's own code chose (tests/fixtures/maskcrypt_plato.json).

The fixture is a small seeded case: 4 clients, 3 sampled a round (client 2 sits round 1 out, client 3
first joins there), rho 0.05 on a 2,410-parameter MLP, three rounds. It holds each round's global model,
every sampled client's update and gradient, and what Plato chose from them: the proposals, the consensus
and its encrypted fraction (made by tests/fixtures/plato_maskcrypt_fixture.py, which runs Plato at the
commit the fixture names). That schedule makes every part of the client's estimate count: the first
plaintext global, the refresh from each received global, encrypted entries keeping their last value,
an upload's plaintext entries, a late joiner's zeros.
"""
import base64
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import defenses.sensecrypt  # noqa: F401  (registers maskcrypt-paillier)
from bench.data.loading import load_dataset
from bench.federation.engine import build_federation
from bench.federation.scenario import Scenario
from bench.federation.state import set_entries
from bench.registry import DEFENSES

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "maskcrypt_plato.json").read_text())
ROUNDS = FIXTURE["rounds"]


def _tensors(blobs: dict[str, str]) -> dict[str, torch.Tensor]:
    return {n: torch.from_numpy(np.frombuffer(zlib.decompress(base64.b64decode(b)), "<f4").copy())
            .reshape(FIXTURE["shapes"][n]) for n, b in blobs.items()}


def _flat(tensors: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([tensors[n].reshape(-1).double().numpy() for n in FIXTURE["names"]])


def _replay(defense, rounds: int) -> list[tuple[dict[int, set], list[int]]]:
    """The defense's round_start on the recorded inputs: (proposal per client, consensus) per round."""
    sc = Scenario(name="plato-parity", dataset="digits", model="fcn", model_params={"hidden": 32},
                  num_clients=FIXTURE["num_clients"], clients_per_round=len(ROUNDS[0]["sampled"]),
                  rounds=len(ROUNDS), max_train=40 * FIXTURE["num_clients"])
    fed = build_federation(sc, load_dataset("digits", None, max_train=sc.max_train), defense)
    assert fed.names == FIXTURE["names"]
    defense.setup(fed)
    gradients: dict[int, dict[str, torch.Tensor]] = {}
    fed.gradient = lambda x, y, model=None: gradients[id(x)]   # the recorded gradient at that client's model
    out = []
    for r, record in enumerate(ROUNDS[:rounds]):
        fed.round = r
        set_entries(fed.model, _tensors(record["global"]))   # the global model the sampled clients receive
        clients = [fed.clients[i] for i in record["sampled"]]
        updates = {}
        for c in clients:
            own = record["clients"][str(c.index)]
            updates[c.name], gradients[id(c.x)] = _tensors(own["delta"]), _tensors(own["gradient"])
        before = len(fed.traffic.clear)
        defense.round_start(fed, r, clients, updates)
        sent = [(s, np.frombuffer(m.data, "<i4")) for _, s, _, what, m in fed.traffic.clear[before:]
                if what == "mask proposal"]
        proposals = {int(s.split("-")[1]): set(p.tolist()) for s, p in sent}
        out.append((proposals, np.frombuffer(defense.indices, "<i4").tolist()))
    return out


def test_proposals_and_consensus_equal_platos_in_every_round():
    total = sum(int(np.prod(s)) for s in FIXTURE["shapes"].values())
    for r, (proposals, consensus) in enumerate(_replay(DEFENSES.get("maskcrypt")(rho=FIXTURE["rho"]), len(ROUNDS))):
        record = ROUNDS[r]
        assert proposals == {int(i): set(c["proposal"]) for i, c in record["clients"].items()}, f"round {r}"
        assert consensus == record["consensus"], f"round {r}"   # the round-robin order too
        assert len(consensus) / total == pytest.approx(record["hidden_fraction"])


def test_maskcrypt_paillier_shares_the_estimate():
    """Its key server decrypts every global in the clear; round 0's (the public initial model) is Plato's."""
    proposals, consensus = _replay(DEFENSES.get("maskcrypt-paillier")(rho=FIXTURE["rho"], key_bits=512), 1)[0]
    assert proposals == {int(i): set(c["proposal"]) for i, c in ROUNDS[0]["clients"].items()}
    assert consensus == ROUNDS[0]["consensus"]


def test_the_fixture_tells_a_zero_start_apart():
    """Starting the estimate from zeros instead of the received global gives other proposals."""
    record, k = ROUNDS[0], len(ROUNDS[0]["clients"]["0"]["proposal"])
    glob = _flat(_tensors(record["global"]))
    own = record["clients"]["0"]
    latest = glob + _flat(_tensors(own["delta"]))
    zero_start = np.argsort(-(0.0 - latest) * _flat(_tensors(own["gradient"])), kind="stable")[:k]
    assert set(zero_start.tolist()) != set(own["proposal"])
