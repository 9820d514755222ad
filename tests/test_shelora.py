"""SHE-LoRA: exact column-aware aggregation under HE, what the server sees, OPE, reparameterization, keys."""
import numpy as np
import pytest
import torch

import defenses.shelora  # noqa: F401  (registers she-lora, flex-lora)
from bench.data.loading import load_dataset
from bench.federation.client_devices import Device
from bench.federation.engine import build_federation, local_update
from bench.federation.scenario import Scenario
from bench.protocol.view import ServerView, hidden_leak_free
from bench.registry import DEFENSES
from defenses.shelora import lora, negotiation
from tests.conftest import weighted_uploads

RANKS, BUDGETS = (1, 2, 2, 3), (0.0, 0.1, 0.2, 0.3)   # n = 32 columns: k = 0, 3, 6, 9; sum of ranks = lora_r


@pytest.fixture(scope="module")
def data():
    import os
    root = os.environ.get("LEAKBENCH_DATA")
    if not root:
        pytest.skip("needs the data root: set LEAKBENCH_DATA (CI sets ../shared/data)")
    return load_dataset("sst2", root, max_train=48, max_test=16, seed=0, seq_len=12)


def one_round(data, name="she-lora", **params):
    sc = Scenario(name="t", dataset="sst2", model="gpt2-lora", model_params={"n_embd": 32, "n_layer": 1,
                  "n_head": 2, "lora_r": 8}, num_clients=4, clients_per_round=4, rounds=1, seq_len=12,
                  batch_size=12, lr=0.5)
    defense = DEFENSES.get(name)(**params)
    fed = build_federation(sc, data, defense)
    for c, r, g in zip(fed.clients, RANKS, BUDGETS):
        c.device = Device(f"d{r}", 50.0, 10.0, g, r)
    defense.setup(fed)
    fed.round = 0
    gen = torch.Generator().manual_seed(0)
    updates = {c.name: local_update(fed, c, c.x, c.y, "delta", gen) for c in fed.clients}
    defense.round_start(fed, 0, fed.clients, updates)
    uploads = weighted_uploads(fed, defense, updates)
    trained = {c.name: defense._trained(fed, c, updates[c.name]) for c in fed.clients}
    aggregate = defense.aggregate(fed, uploads, fed.parties["server"])
    return fed, defense, uploads, trained, aggregate


def expected_delta_w(fed, defense, uploads, trained):
    out = {}
    for layer in defense.layers:
        out[layer] = sum(u.weight * (trained[u.sender][layer.b].double().numpy().astype(np.float32).astype(float)
                                     @ trained[u.sender][layer.a].double().numpy().astype(np.float32).astype(float))
                         for u in uploads)
    return out


def test_decrypted_aggregate_equals_plaintext_aggregate_for_heterogeneous_budgets_and_ranks(data):
    fed, defense, uploads, trained, aggregate = one_round(data)
    assert sorted(defense.ks.values()) == [0, 3, 6, 9] and sorted(defense.ranks.values()) == [1, 2, 2, 3]
    assert any(u.payload.cipher for u in uploads) and not uploads[0].payload.cipher   # k = 0 sends no ciphertext
    got = defense.delta_w(fed, aggregate, fed.clients[1].party)
    want = expected_delta_w(fed, defense, uploads, trained)
    for layer in defense.layers:
        assert np.abs(want[layer]).max() > 1e-4
        assert np.abs(got[layer] - want[layer]).max() < 1e-6
    masked = defense.delta_w(fed, aggregate, None)
    for layer in defense.layers:   # the encrypted columns are missing from what the server can use
        order = defense.order[layer.a][:9]
        assert not np.allclose(masked[layer][:, order], want[layer][:, order], atol=1e-6)


def test_server_view_holds_no_value_of_an_encrypted_column(data):
    fed, defense, uploads, trained, _ = one_round(data)
    for c, up in zip(fed.clients, uploads):
        view = ServerView.of(up, fed.shapes)
        assert hidden_leak_free(view)
        seen = np.concatenate([v[~torch.isnan(v)].numpy().ravel() for v in view.values.values()])
        k, r = defense.ks[c.name], defense.ranks[c.name]
        for layer in defense.layers:
            hidden = trained[c.name][layer.a][:r, defense.order[layer.a][:k]].float().numpy().ravel()
            hidden = hidden[hidden != 0]
            assert not np.isin(hidden, seen).any()
            plain_cols = [j for j in range(defense.n) if j not in defense.order[layer.a][:k]]
            shown = trained[c.name][layer.a][:r, plain_cols].float().numpy().ravel()
            assert np.isin(shown, seen).all()                     # the plaintext columns are there
        assert not any(isinstance(v, (int, float)) for v in view.meta.values())


@pytest.mark.parametrize("init", ["client", "server"])
def test_ope_preserves_order_and_the_server_sees_only_ciphertexts_of_positions(data, init):
    """The request travels in setup (the official negotiation-only first round) or, under init = "server",
    in the first upload's meta."""
    cipher = negotiation.OrderCipher(b"0123456789abcdef")
    values = sorted(np.random.default_rng(0).choice(60000, 40, replace=False))
    cts = cipher.positions(values)
    assert cts == sorted(cts) and len(set(cts)) == 40 and cipher.open_positions(cts) == [int(v) for v in values]
    fed, defense, uploads, _, _ = one_round(data, init=init)
    in_meta = [u.payload.meta["she-lora negotiation (OPE)"] for u in uploads if u.payload.meta]
    in_setup = [m.data for c in fed.clients for r, what, m in fed.traffic.sent_in_clear(c.name, "server")
                if what == "she-lora negotiation (OPE)" and r == -1]
    assert (len(in_setup), len(in_meta)) == ((4, 0) if init == "client" else (0, 4))
    for layer in defense.layers:
        server = defense.server_order[layer.a]
        assert len(server) == 9 and all(p >= 2 ** 16 for p in server)      # ciphertexts, not positions
        assert cipher_of(fed).open_positions(server) == defense.order[layer.a]
    blob = (in_setup or in_meta)[1]
    size = int.from_bytes(blob[:4], "big")
    positions, scores = negotiation.decode_message(blob[4:4 + size])
    assert len(positions) == 3 and all(p >= 2 ** 16 for p in positions + scores)


def test_official_schedule_clients_draw_their_own_a0_and_the_server_sees_its_plaintext_columns(data):
    """init = "client": each client's A0 is its own draw, hidden from the server's initial model; a first step
    from B0 = 0 leaves A = A0, so the upload shows A0's plaintext columns; init = "server" uses the model's A0."""
    fed, defense, uploads, trained, _ = one_round(data)
    layer = defense.layers[0]
    a0 = [defense._drawn(fed, c)[layer.a] for c in fed.clients]
    assert not torch.allclose(a0[1], a0[2]) and defense.hidden_initial(fed)[layer.a].all()
    assert not torch.allclose(a0[1], fed.params()[layer.a])
    server_fed, server_def, *_ = one_round(data, init="server")
    assert not server_def.hidden_initial(server_fed) and not server_def._drawn(server_fed, server_fed.clients[0])
    gen = torch.Generator().manual_seed(0)
    c = fed.clients[1]
    step = local_update(fed, c, c.x[:4], c.y[:4], "gradient", gen)           # one FedSGD step from B0 = 0
    assert float(step[layer.a].abs().max()) == 0.0
    view = ServerView.of(weighted_uploads(fed, defense, {x.name: step for x in fed.clients})[1], fed.shapes)
    seen = view.visible[layer.a][: defense.ranks[c.name]]
    hidden = defense.order[layer.a][: defense.ks[c.name]]
    assert not seen[:, hidden].any() and seen.sum(1).eq(defense.n - len(hidden)).all()
    r = defense.ranks[c.name]
    assert torch.equal(view.values[layer.a][:r][seen].float(), a0[1][:r][seen])


def cipher_of(fed):
    return negotiation.OrderCipher(fed.clients[0].party.keys["ope"].secret)


def test_negotiation_gives_prefixes_that_fit_every_budget():
    reqs = [(2, [10, 20], [50, 40]), (2, [20, 30], [45, 44]), (4, [10, 20, 30, 40], [9, 8, 7, 6])]
    order = negotiation.negotiate(reqs)
    assert len(order) == 4 and len(set(order)) == 4 and set(order[:2]) <= {10, 20, 30}


def test_full_rank_unencrypted_reparameterization_is_plain_lora_fedavg():
    rng = np.random.default_rng(0)
    m, n, ranks, w = 12, 10, (2, 3, 4), (0.5, 0.3, 0.2)
    factors = [(rng.normal(size=(m, r)), rng.normal(size=(r, n))) for r in ranks]
    fedavg = sum(wi * b @ a for wi, (b, a) in zip(w, factors))
    full = min(m, n)
    plain = lora.svd_factors(fedavg, full)
    b, a = lora.reparameterize(plain, np.zeros((m, 0)), np.arange(n), full)
    assert np.abs(b @ a - fedavg).max() < 1e-10
    order = [7, 2, 5]                                              # with three columns under HE
    swap = lora.swap_order(n, order)
    swapped = fedavg[:, swap]
    b, a = lora.reparameterize(lora.svd_factors(swapped[:, :n - 3], full), swapped[:, n - 3:], swap, full)
    assert np.abs(b @ a - fedavg).max() < 1e-10


def test_key_topology_the_aggregation_server_never_holds_a_secret_key(data):
    fed, defense, *_ = one_round(data)
    server = fed.parties["server"]
    assert defense.key_topology == "shared-client-key"
    assert not server.holds_secret() and "ope" not in server.keys
    import tenseal as ts
    assert not ts.context_from(server.keys["ckks"].public).is_private()
    assert all(c.party.keys["ckks"].can_decrypt for c in fed.clients)
    flex, flex_def, uploads, _, aggregate = one_round(data, "flex-lora")
    assert flex_def.key_topology == "none" and not flex.parties["server"].keys and not aggregate.cipher


def _best_rank(w: np.ndarray, rank: int) -> np.ndarray:
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vt[:rank]


def test_a_client_refactors_the_whole_aggregate_and_the_server_only_its_plaintext_columns(data):
    """decode (a client, after decrypting) rebuilds the aggregate Delta W at rank r_max: B A is its best rank-r_max
    approximation (an SVD here, not the code's); server_estimate, the server's rebuild from its own plaintext sums,
    is the same of Delta W with the encrypted columns at 0, and exists only once an aggregate was decoded."""
    fed, defense, uploads, trained, aggregate = one_round(data)
    assert defense.server_estimate(fed) == {}
    current = fed.params()
    step = defense.decode(fed, aggregate, fed.clients[1].party)
    estimate = defense.server_estimate(fed)
    want, masked = expected_delta_w(fed, defense, uploads, trained), defense.delta_w(fed, aggregate, None)
    for layer in defense.layers:
        new = {n: (current[n] + step[n]).double().numpy() for n in (layer.b, layer.a)}
        assert np.abs(new[layer.b] @ new[layer.a] - _best_rank(want[layer], defense.r_max)).max() < 1e-5
        est = estimate[layer.b].double().numpy() @ estimate[layer.a].double().numpy()
        assert np.abs(est - _best_rank(masked[layer], defense.r_max)).max() < 1e-5
        assert np.abs(est - new[layer.b] @ new[layer.a]).max() > 1e-4   # the encrypted columns are missing


def test_table_14s_true_perplexity_is_the_decrypted_aggregates_and_the_masked_one_lacks_the_encrypted_columns(data):
    """run_metrics on a causal LM: the true perplexity is the base model's plus the clients' weighted plaintext
    Delta W (built here from their trained factors, not from the aggregate), the masked one that of the
    server's plaintext columns alone."""
    from defenses.shelora.measure import perplexity, run_metrics
    fed, defense, uploads, trained, aggregate = one_round(data)
    assert fed.data.task == "causal-lm"
    defense.decode(fed, aggregate, fed.clients[1].party)
    out = run_metrics(defense, fed)
    assert out["perplexity_true"] == pytest.approx(perplexity(fed, expected_delta_w(fed, defense, uploads, trained)),
                                                   rel=1e-4)
    assert out["perplexity_masked"] == pytest.approx(perplexity(fed, defense.delta_w(fed, aggregate, None)), rel=1e-6)
    assert abs(out["perplexity_true"] - out["perplexity_masked"]) > 1e-6 * out["perplexity_true"]   # random-init LM: small


def test_an_empty_update_reparameterizes_to_zero_factors_of_the_clients_rank():
    """No plaintext factor and no encrypted column (an adapter that did not move): B and A come back as zeros of
    shapes (m, rank) and (rank, n), as every other case does."""
    m, n, rank = 5, 7, 3
    b, a = lora.reparameterize((np.zeros((m, 0)), np.zeros((0, n))), np.zeros((m, 0)), np.arange(n), rank)
    assert b.shape == (m, rank) and a.shape == (rank, n) and not b.any() and not a.any()
