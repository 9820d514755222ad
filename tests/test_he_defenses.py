"""HE defenses: exact FedAvg under encryption, key separation, bad ciphertexts, utility."""
import numpy as np
import pytest
import tenseal as ts
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.crypto import CryptoError
from bench.crypto.params import GRID
from bench.data.loading import load_dataset
from bench.federation.engine import build_federation, local_update, run_federation
from bench.federation.scenario import Scenario
from bench.protocol.payloads import hybrid_payload
from bench.protocol.view import ServerView, hidden_leak_free
from bench.protocol.wire import Upload
from bench.registry import DEFENSES
from tests.conftest import weighted_uploads

HE_DEFENSES = ["fedhe-full", "fedml-he", "maskcrypt", "selective"]


def _fed(num_clients=20, model="mlp", **kw):
    sc = Scenario(name="he", dataset="digits", model=model, num_clients=num_clients,
                  clients_per_round=num_clients, rounds=1, max_train=40 * num_clients, **kw)
    return build_federation(sc, load_dataset("digits", None, max_train=sc.max_train))


def _one_round(fed, defense):
    defense.setup(fed)
    clients = fed.clients
    gen = torch.Generator().manual_seed(0)
    updates = {c.name: local_update(fed, c, c.x, c.y, "delta", gen) for c in clients}
    defense.round_start(fed, 0, clients, updates)
    uploads = weighted_uploads(fed, defense, updates)
    expected = {n: sum(u.weight * updates[u.sender][n] for u in uploads) for n in fed.names}
    aggregate = defense.aggregate(fed, uploads, fed.parties["server"])
    return defense.decode(fed, aggregate, defense.decoder(fed)), expected, uploads


@pytest.mark.parametrize("name", HE_DEFENSES)
def test_decrypted_aggregate_equals_plaintext_fedavg_for_20_clients(name):
    fed = _fed()
    got, expected, uploads = _one_round(fed, DEFENSES.get(name)())
    worst = max(float((got[n] - expected[n]).abs().max()) for n in fed.names)
    assert worst <= len(uploads) * GRID / 2 + 1e-8   # each client's input rounded to the CKKS grid, no noise left
    assert all(u.payload.cipher_bytes > 0 for u in uploads)


@pytest.mark.parametrize("name", HE_DEFENSES)
def test_aggregation_server_holds_public_material_only(name):
    fed = _fed(num_clients=3)
    defense = DEFENSES.get(name)()
    _, _, uploads = _one_round(fed, defense)
    server = fed.parties["server"]
    assert not server.holds_secret()
    ctx = ts.context_from(server.keys["ckks"].public)
    assert not ctx.is_private()
    vec = ts.ckks_vector_from(ctx, uploads[0].payload.cipher[0].blobs[0][12:])
    with pytest.raises(ValueError, match="secret"):
        vec.decrypt()


def test_under_key_server_no_client_can_decrypt():
    fed = _fed(num_clients=3)
    got, expected, _ = _one_round(fed, DEFENSES.get("fedhe-full")(keys="key-server"))
    assert fed.parties["key-server"].holds_secret()
    assert not fed.parties["server"].holds_secret()
    assert not any(c.party.holds_secret() for c in fed.clients)
    from bench.crypto import open_decryptor
    with pytest.raises(CryptoError, match="client-0"):
        open_decryptor(fed.clients[0].party.keys["ckks"], "client-0")
    assert max(float((got[n] - expected[n]).abs().max()) for n in fed.names) <= 3 * GRID / 2 + 1e-8


def test_full_he_server_view_is_empty():
    fed = _fed(num_clients=2)
    _, _, uploads = _one_round(fed, DEFENSES.get("fedhe-full")())
    view = ServerView.of(uploads[0], fed.shapes)
    assert view.visible_fraction() == 0.0 and hidden_leak_free(view)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), density=st.floats(0.0, 1.0))
def test_encrypted_positions_never_reach_the_view(seed, density):
    fed = _fed(num_clients=2, model="mlp")
    from bench.crypto.keys import provision
    provision(fed, "shared-client-key")
    rng = np.random.default_rng(seed)
    update = {n: torch.from_numpy(rng.normal(size=s).astype(np.float32)) for n, s in fed.shapes.items()}
    masks = {n: rng.random(int(np.prod(s))) < density for n, s in fed.shapes.items()}
    payload = hybrid_payload(fed, fed.clients[0], update, 0.5, masks)
    view = ServerView.of(Upload("client-0", 0, 0.5, payload), fed.shapes)
    assert hidden_leak_free(view)
    for n in fed.names:
        hidden = torch.from_numpy(masks[n]).reshape(fed.shapes[n])
        assert torch.equal(~view.visible[n], hidden)
        assert torch.equal(view.values[n][~hidden], update[n][~hidden])


def test_trained_accuracy_matches_plaintext_within_noise():
    sc = Scenario(name="acc", dataset="digits", model="mlp", num_clients=4, clients_per_round=4, rounds=5,
                  local_epochs=2, lr=0.1, max_train=600)
    data = load_dataset("digits", None, max_train=600)
    accs = {n: run_federation(sc, data, DEFENSES.get(n)()).metrics["accuracy"] for n in ["plaintext"] + HE_DEFENSES}
    assert accs["plaintext"] > 0.5
    for name, acc in accs.items():
        assert abs(acc - accs["plaintext"]) <= 0.03, accs


def test_maskcrypt_union_and_indices_on_the_wire():
    fed = _fed(num_clients=4)
    defense = DEFENSES.get("maskcrypt")()
    _, _, uploads = _one_round(fed, defense)
    total = sum(int(np.prod(s)) for s in fed.shapes.values())
    union = np.frombuffer(uploads[0].payload.meta["indices"], dtype="<i4")
    assert 0.05 * total - 1 <= len(union) <= 4 * 0.05 * total + 1
    view = ServerView.of(uploads[0], fed.shapes)
    assert view.meta["indices"] == uploads[0].payload.meta["indices"]


class _Garbling(DEFENSES.get("fedhe-full")):
    """Test-only: corrupts its ciphertexts in one of three ways."""

    def __init__(self, fault: str = "truncate") -> None:
        super().__init__()
        self.fault = fault

    def encode(self, fed, client, update, weight):
        payload = super().encode(fed, client, update, weight)
        if client.index != 1:
            return payload
        part = payload.cipher[0]
        blob = part.blobs[0]
        if self.fault == "truncate":
            blob = blob[: len(blob) // 2]
        elif self.fault == "garble":
            blob = blob[:100] + bytes(b ^ 0xFF for b in blob[100:140]) + blob[140:]
        else:  # another key's context
            from bench.crypto import PARAM_SETS, ckks_keygen, open_encryptor
            other = ckks_keygen(PARAM_SETS["n4096"])
            blob = open_encryptor(other.public_only(), client.name).encrypt(np.zeros(10))[0]
        from dataclasses import replace
        return replace(payload, cipher=(replace(part, blobs=(blob,) + part.blobs[1:]),))


@pytest.mark.parametrize("fault, needle", [("truncate", "truncated"), ("garble", "garbled"), ("other-key", "key")])
def test_bad_ciphertext_fails_its_cell_only(fault, needle, tmp_path, capsys):
    from bench.cli import main
    DEFENSES.add("garbling-test", _Garbling)
    try:
        suite = tmp_path / "s.toml"
        suite.write_text(f'''
name = "garble"
[[scenarios]]
name = "tiny"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 100
[[defenses]]
name = "plaintext"
[[defenses]]
name = "garbling-test"
params = {{ fault = "{fault}" }}
[[attacks]]
name = "idlg"
params = {{ reconstruct = false }}
''')
        assert main(["run", str(suite), "--out", str(tmp_path / "out")]) == 1
        import json
        records = {r["defense"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())}
        assert records["plaintext"]["status"] == "ok"
        reason = records["garbling-test"]["reason"]
        assert records["garbling-test"]["status"] == "failed"
        assert "aggregation server" in reason and "client-1" in reason and needle in reason and "\n" not in reason
    finally:
        DEFENSES._entries.pop("garbling-test", None)


def test_mask_of_wrong_length_is_named():
    fed = _fed(num_clients=2)
    from bench.crypto.keys import provision
    provision(fed, "shared-client-key")
    update = {n: torch.zeros(s) for n, s in fed.shapes.items()}
    name = fed.names[0]
    with pytest.raises(ValueError, match=f"mask for '{name}' has 3 entries"):
        hybrid_payload(fed, fed.clients[0], update, 1.0, {name: np.ones(3, bool)})
