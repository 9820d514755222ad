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


def _top_k(estimate: np.ndarray, record: dict, own: dict, k: int) -> list[int]:
    """Plato's proposal, written out here: the k entries of largest (estimate - latest) * gradient, where latest is
    the received global plus the client's update (float32, as trained) and ties keep the lower index."""
    latest = _flat({n: t + _tensors(own["delta"])[n] for n, t in _tensors(record["global"]).items()})
    return np.argsort(-(estimate - latest) * _flat(_tensors(own["gradient"])), kind="stable")[:k].tolist()


def _round_robin(proposals: list[list[int]]) -> list[int]:
    """Plato's consensus: the proposals' first entries in client order, then their second entries, ..., each index
    kept where it first occurs."""
    out: list[int] = []
    for i in range(max(map(len, proposals))):
        for p in proposals:
            if i < len(p) and p[i] not in out:
                out.append(p[i])
    return out


def test_the_oracle_gives_platos_round_zero_and_consensus():
    """The replay below is checked against Plato where both must agree: round 0 (every client's estimate is the
    public initial model) and the consensus of Plato's own proposals in every round."""
    k = len(ROUNDS[0]["clients"]["0"]["proposal"])
    glob = _flat(_tensors(ROUNDS[0]["global"]))
    for i, own in ROUNDS[0]["clients"].items():
        assert _top_k(glob, ROUNDS[0], own, k) == own["proposal"], f"client {i}"
    for record in ROUNDS:
        assert _round_robin([record["clients"][str(i)]["proposal"] for i in record["sampled"]]) == record["consensus"]


def test_maskcrypt_paillier_shares_the_estimate():
    """Its key server decrypts every global, so each client's estimate is the whole received global in every round
    (Plato's is only at round 0; later its encrypted entries keep their last value). Every round of the fixture
    replayed against that rule. Kills the mutant that drops the key-server rule from `_hidden_in_global`: it
    reproduces Plato's proposals, which differ from these in rounds 1 and 2."""
    replayed = _replay(DEFENSES.get("maskcrypt-paillier")(rho=FIXTURE["rho"], key_bits=512), len(ROUNDS))
    k = len(ROUNDS[0]["clients"]["0"]["proposal"])
    differs = 0
    for r, (record, (proposals, consensus)) in enumerate(zip(ROUNDS, replayed)):
        glob = _flat(_tensors(record["global"]))
        want = {i: _top_k(glob, record, record["clients"][str(i)], k) for i in record["sampled"]}
        assert proposals == {i: set(p) for i, p in want.items()}, f"round {r}"
        assert consensus == _round_robin([want[i] for i in record["sampled"]]), f"round {r}"
        differs += sum(set(p) != set(record["clients"][str(i)]["proposal"]) for i, p in want.items())
    assert differs >= 2   # the key server's estimate is told apart from Plato's in the later rounds


def test_the_fixture_tells_a_zero_start_apart():
    """Starting the estimate from zeros instead of the received global gives other proposals."""
    record, k = ROUNDS[0], len(ROUNDS[0]["clients"]["0"]["proposal"])
    glob = _flat(_tensors(record["global"]))
    own = record["clients"]["0"]
    latest = glob + _flat(_tensors(own["delta"]))
    zero_start = np.argsort(-(0.0 - latest) * _flat(_tensors(own["gradient"])), kind="stable")[:k]
    assert set(zero_start.tolist()) != set(own["proposal"])
