"""SenseCrypt: clustering, budgets and masks, exact per-cluster FedAvg under Paillier, what the server sees.

Keys are 512 bits here (test-only) so the module runs in well under a minute.
"""
import math

import numpy as np
import pytest
import torch

import defenses.sensecrypt  # noqa: F401  (registers sensecrypt, sensecrypt-dp, paillier-full, maskcrypt-paillier)
from bench.crypto import CryptoError, open_decryptor
from bench.data.loading import load_dataset
from bench.federation.client_devices import Device
from bench.federation.engine import build_federation, local_update, run_federation
from bench.federation.scenario import Scenario
from bench.protocol.evidence import metric, run_value
from bench.protocol.view import ServerView, hidden_leak_free
from bench.registry import DEFENSES, METRICS
from defenses.sensecrypt import percluster
from defenses.sensecrypt.profiles import budgets, device_profiles
from defenses.sensecrypt.selection import histogram_mi, solve_mask
from tests.conftest import tiny_suite, weighted_uploads

KEY = 512
SCHEMA = [  # name, lower_is_better, kind, timing
    ("ari", False, "utility", False), ("silhouette", False, "utility", False),
    ("round_time_max_s", True, "cost", True), ("round_time_mean_s", True, "cost", True),
    ("mask_feasible_fraction", False, "privacy", False), ("accuracy_own_labels", False, "utility", False),
]
for _name, _lower, _kind, _timing in SCHEMA:  # until metrics/run.py lists them
    if _name not in METRICS:
        metric(_name, "s" if _name.endswith("_s") else "", _lower, _kind, _name, fmt="{:.3f}", per_target=False,
               timing=_timing)(run_value(_name))

DATA = load_dataset("digits", None)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: torch's thread pool costs more than it gains, badly so on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def scenario(name="stat", n=20, partition="k-classes", k=2, **kw):
    base = dict(name=name, dataset="digits", model="mlp-tiny", model_params={"hidden": 8}, num_clients=n,
                clients_per_round=n, partition=partition, classes_per_client=k, rounds=1, local_epochs=2,
                batch_size=16, lr=0.1)
    return Scenario(**(base | kw))


def one_round(sc, defense):
    """setup, local training, masks, uploads, aggregation, key-server decode: one round by hand."""
    fed = build_federation(sc, DATA, defense)
    defense.setup(fed)
    fed.round = 0
    gen = torch.Generator().manual_seed(0)
    updates = {c.name: local_update(fed, c, c.x, c.y, "delta", gen) for c in fed.clients}
    defense.round_start(fed, 0, fed.clients, updates)
    uploads = weighted_uploads(fed, defense, updates)
    aggregate = defense.aggregate(fed, uploads, fed.parties["server"])
    update = defense.decode(fed, aggregate, defense.decoder(fed))
    return fed, updates, uploads, update


def test_clustering_recovers_the_categories_without_noise():
    """k-classes with 2 classes each on 20 clients: 5 categories of 4 (appendix E's layout; 10 digit classes
    cannot make the 4 equal categories of section 4.1)."""
    sc = scenario()
    defense = DEFENSES.get("sensecrypt")(key_bits=KEY)
    fed = build_federation(sc, DATA, defense)
    defense.setup(fed)
    assert len(set(defense.truth)) == 5
    assert defense.scores["ari"] >= 0.9 and defense.scores["ap_cluster_count"] == 5
    assert defense.scores["silhouette"] > 0.5


def test_heavy_dp_noise_destroys_the_clustering():
    sc = scenario(n=10)
    noisy = DEFENSES.get("sensecrypt-dp")(key_bits=KEY, dp_epsilon=0.1, dp_clip=0.3)
    fed = build_federation(sc, DATA, noisy)
    noisy.setup(fed)
    assert noisy.scores["ari"] < 0.5


def test_budgets_follow_the_min_rule_and_the_paper_profiles():
    fed = build_federation(scenario(devices="sensecrypt-4.1", device_assign="by-category"), DATA)
    r, v = device_profiles(fed)
    assert sorted(set(r)) == [35.0, 40.0, 45.0, 50.0] and sorted(set(v)) == [10.0, 12.0, 16.0, 24.0]
    for group in set(defense_groups := [tuple(sorted(set(c.y.tolist()))) for c in fed.clients]):
        members = [i for i, g in enumerate(defense_groups) if g == group]   # every category spans the tiers
        assert [r[i] for i in members] == [50.0, 45.0, 40.0, 35.0]
    system = build_federation(scenario(partition="iid", devices="sensecrypt-4.1", device_assign="by-category"), DATA)
    assert device_profiles(system)[0] == [50.0, 45.0, 40.0, 35.0, 30.0] * 4
    assert device_profiles(build_federation(scenario(), DATA)) == ([50.0] * 20, [32.0] * 20)
    alpha = budgets([50, 30, 50], [24, 24, 8], [0, 0, 0])
    assert alpha == pytest.approx([1.0, 0.6, 1 / 3])


@pytest.mark.parametrize("alpha", [1.0, 0.4, 0.05])
def test_mask_solver_is_the_milp_optimum_and_meets_its_constraints(alpha):
    rng = np.random.default_rng(1)
    gamma = rng.lognormal(0, 2, 400)
    values = rng.normal(0, 0.01, 400)
    exact = solve_mask(gamma, values, alpha, 1.3, 0.7, math.inf, solver="exact")  # the knapsack alone
    milp = solve_mask(gamma, values, alpha, 1.3, 0.7, math.inf, solver="milp")
    budget = math.floor(alpha * 400)
    assert exact.mask.sum() <= budget and exact.budget == budget
    if exact.security_ok:
        assert exact.coverage >= 1 - 0.7 * math.exp(-1.3 * alpha) - 1e-12
        top = np.sort(gamma)[::-1][:budget].sum()

        def objective(mask):
            return mask.sum() / budget - gamma[mask].sum() / top
        assert objective(exact.mask) == pytest.approx(objective(milp.mask), abs=1e-9)
        brute = min(objective(np.isin(np.arange(400), np.argsort(-gamma)[:m])) for m in range(budget + 1)
                    if np.sort(gamma)[::-1][:m].sum() >= (1 - 0.7 * math.exp(-1.3 * alpha)) * gamma.sum())
        assert objective(exact.mask) == pytest.approx(brute, abs=1e-12)
    else:
        assert exact.mask.sum() == budget  # infeasible: the whole budget goes to the top entries


def test_mutual_information_bound_grows_the_mask():
    values = np.random.default_rng(2).uniform(-1, 1, 500)
    assert histogram_mi(values, np.zeros(500, bool)) == pytest.approx(np.log2(32), abs=0.1)
    assert histogram_mi(values, np.ones(500, bool)) == 0.0
    gamma = np.r_[np.full(20, 100.0), np.ones(480)]  # a few dominant entries: the knapsack alone picks few
    loose = solve_mask(gamma, values, 1.0, 1.3, 0.7, 10.0)
    tight = solve_mask(gamma, values, 1.0, 1.3, 0.7, 1.0)
    assert loose.mask.sum() < 50 and loose.mi_bits > 1.0
    assert tight.mask.sum() > loose.mask.sum() and tight.mi_bits <= 1.0 and tight.mi_ok
    assert tight.mask[:20].all()  # growth keeps the sensitivity order


def test_every_mask_meets_its_budget_and_infeasible_clients_are_reported():
    sc = scenario(n=10)
    defense = DEFENSES.get("sensecrypt")(key_bits=KEY, budget_scope="all", C=0.05)
    fed = build_federation(sc, DATA, defense)
    fed.clients[9].device = Device("slow", 50.0, 1.0)  # 1/32 of the fastest: 19 entries cannot reach a 95 % level
    run = run_federation(sc, DATA, defense, fed=fed)
    details = run.details["sensecrypt"]
    for m in details["masks"]:
        assert m["fraction"] * 610 <= m["budget"] == math.floor(m["alpha"] * 610 + 1e-9)
        if m["security_ok"]:
            assert m["coverage"] >= m["level"] - 1e-12
    slow = [m for m in details["masks"] if m["client"] == "client-9"]
    assert slow and not slow[0]["security_ok"] and not slow[0]["feasible"]
    assert slow[0]["fraction"] * 610 == slow[0]["budget"] == 19  # it still encrypts all it can
    assert any(i["client"] == "client-9" for i in details["infeasible"])
    assert run.metrics["mask_feasible_fraction"] == pytest.approx(np.mean([m["feasible"] for m in details["masks"]]))
    assert run.metrics["mask_feasible_fraction"] < 1.0
    assert details["test_only_key_size"] is True and run.details["he_params"]["key_bits"] == KEY


def test_decrypted_cluster_aggregates_equal_plaintext_cluster_fedavg():
    defense = DEFENSES.get("sensecrypt")(key_bits=KEY)
    fed, updates, uploads, update = one_round(scenario(n=10, devices="sensecrypt-4.1", device_assign="by-category"),
                                              defense)
    got = fed.parties["key-server"].state["cluster_updates"]
    masks = {u.sender: percluster.unpack_mask(u.payload.meta["mask"], 610) for u in uploads}
    for cluster, values in got.items():
        members = [c for c in fed.clients if defense.labels[c.index] == cluster]
        total = sum(c.num_samples for c in members)
        expected = sum(percluster.flatten(updates[c.name], fed.names) * (c.num_samples / total) for c in members)
        union = np.logical_or.reduce([masks[c.name] for c in members])
        assert union.any() and not union.all()
        assert np.abs(values[union] - expected[union]).max() < 1e-9          # Paillier fixed point, 2^-40
        assert np.allclose(values[~union], expected[~union], rtol=1e-6, atol=1e-7)  # float32 plaintext wire
    start = fed.params()
    for client in fed.clients:
        defense.merge(fed, client, update)
    for client in fed.clients:  # each member starts the next round from its cluster's model
        sizes = [int(np.prod(fed.shapes[n])) for n in fed.names]
        step = percluster.split(got[defense.labels[client.index]], fed.names, sizes)
        for n in fed.names:
            assert torch.allclose(client.local[n], start[n] + torch.from_numpy(step[n]).float().reshape(fed.shapes[n]),
                                  atol=1e-6)
    total = sum(c.num_samples for c in fed.clients)
    mean = {n: sum(c.local[n] * (c.num_samples / total) for c in fed.clients) for n in fed.names}
    for n in fed.names:  # the engine's global model: the sample-weighted mean of the cluster models
        assert torch.allclose(start[n] + update[n], mean[n], atol=1e-6)


def test_server_view_hides_encrypted_positions_and_shows_the_mask():
    defense = DEFENSES.get("sensecrypt")(key_bits=KEY)
    fed, updates, uploads, _ = one_round(scenario(n=6, k=5), defense)
    fractions = []
    for up in uploads:
        view = ServerView.of(up, fed.shapes)
        mask = percluster.unpack_mask(view.meta["mask"], 610)
        visible = np.concatenate([view.visible[n].reshape(-1).numpy() for n in fed.names])
        assert mask.any() and np.array_equal(visible, ~mask)
        assert hidden_leak_free(view)
        seen = np.concatenate([view.values[n].reshape(-1).numpy() for n in fed.names])
        assert np.isnan(seen[mask]).all()
        assert len(view.ciphertext_sizes) == mask.sum()  # one Paillier ciphertext per encrypted entry
        fractions.append(mask.mean())
    assert len(set(np.round(fractions, 6))) > 1  # masks differ per client


def test_only_the_key_server_can_decrypt():
    defense = DEFENSES.get("sensecrypt")(key_bits=KEY)
    fed, _, uploads, _ = one_round(scenario(n=4, k=5), defense)
    server = fed.parties["server"]
    assert not server.holds_secret()
    assert all(not c.party.holds_secret() for c in fed.clients)
    assert fed.parties["key-server"].holds_secret()
    with pytest.raises(CryptoError, match="no secret key"):
        open_decryptor(server.keys["paillier"], server.name)
    assert defense.key_topology == "key-server"


@pytest.mark.parametrize("name,params", [("paillier-full", {}), ("maskcrypt-paillier", {"union_cap": 0.05})])
def test_paillier_baselines_aggregate_exactly(name, params):
    sc = scenario(n=4, k=5)
    fed = build_federation(sc, DATA)
    defense = DEFENSES.get(name)(key_bits=KEY, **params)
    fed, updates, uploads, update = one_round(sc, defense)
    total = sum(c.num_samples for c in fed.clients)
    for n in fed.names:
        expected = sum(updates[c.name][n] * (c.num_samples / total) for c in fed.clients)
        assert torch.allclose(update[n], expected, atol=1e-6)
    fraction = np.mean([sum(int(m.sum()) for _, m in p.layout) for u in uploads for p in u.payload.cipher]) / 610
    assert fraction == (1.0 if name == "paillier-full" else pytest.approx(0.05, abs=0.002))
    assert not fed.parties["server"].holds_secret()


def test_suite_cells_run_and_report_the_clustering_and_round_time():
    from bench.run.cells import run_group

    for name, params in [("sensecrypt", {"key_bits": KEY}), ("sensecrypt-dp", {"key_bits": KEY, "dp_epsilon": 100.0}),
                         ("paillier-full", {"key_bits": KEY}), ("maskcrypt-paillier", {"key_bits": KEY})]:
        suite = tiny_suite([(name, params)], [("ilrg", {})], model="mlp-tiny", model_params={"hidden": 4},
                           num_clients=4, clients_per_round=4,
                           partition="k-classes", classes_per_client=5, attack_batch_size=8)
        rec = next(run_group(list(suite.cells), None))
        assert rec["status"] in ("ok", "blocked"), rec["reason"]
        assert rec["metrics"]["round_time_max_s"] >= rec["metrics"]["round_time_mean_s"] > 0
        assert rec["details"]["key_topology"] == "key-server"
        if name.startswith("sensecrypt"):
            assert "ari" in rec["metrics"] and rec["metrics"]["mask_feasible_fraction"] <= 1.0


def plain_train(fed, params: dict[str, torch.Tensor], client, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Reference local training: the scenario's SGD epochs from `params`, written out independently."""
    model = fed.new_model()
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for n in fed.names:
            state[n].copy_(params[n])
    sc = fed.scenario
    opt = torch.optim.SGD(model.parameters(), lr=sc.lr)
    for _ in range(sc.local_epochs):
        for batch in torch.randperm(len(client.y), generator=gen).split(sc.batch_size):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(client.x[batch]), client.y[batch]).backward()
            opt.step()
    return {n: state[n].detach().clone() for n in fed.names}


def test_cluster_models_follow_plain_per_cluster_fedavg_over_several_rounds():
    """Members train from their cluster's model; each cluster model becomes its members' weighted mean."""
    from bench.federation.state import set_entries as _set_entries

    defense = DEFENSES.get("sensecrypt")(key_bits=KEY, ratio_cap=0.05)
    fed = build_federation(scenario(n=6, k=5), DATA, defense)
    defense.setup(fed)
    labels = defense.labels
    reference = {c: fed.params() for c in set(labels)}
    worst = []
    for r in range(3):
        fed.round = r
        updates = {c.name: local_update(fed, c, c.x, c.y, "delta", torch.Generator().manual_seed(r * 100 + c.index))
                   for c in fed.clients}
        trained = {c.name: plain_train(fed, reference[labels[c.index]], c, torch.Generator().manual_seed(r * 100 + c.index))
                   for c in fed.clients}
        defense.round_start(fed, r, fed.clients, updates)
        uploads = weighted_uploads(fed, defense, updates, r)
        update = defense.decode(fed, defense.aggregate(fed, uploads, fed.parties["server"]), defense.decoder(fed))
        current = fed.params()
        _set_entries(fed.model, {n: current[n] + update[n] for n in fed.names})
        for client in fed.clients:
            defense.merge(fed, client, update)
        for cluster in reference:
            members = [c for c in fed.clients if labels[c.index] == cluster]
            size = sum(c.num_samples for c in members)
            reference[cluster] = {n: sum(trained[c.name][n] * (c.num_samples / size) for c in members)
                                  for n in fed.names}
        models = fed.parties["key-server"].state["cluster_models"]
        worst.append(max(float((models[c][n] - reference[c][n]).abs().max()) for c in reference for n in fed.names))
        for client in fed.clients:   # where the next round's training starts
            for n in fed.names:
                assert torch.allclose(client.merged(fed.params())[n], reference[labels[client.index]][n], atol=1e-5)
    assert len(set(labels)) > 1
    assert max(worst) < 1e-5, worst


def test_one_client_clusters_merge_into_the_nearest():
    from defenses.sensecrypt.clustering import merge_singletons

    points = np.array([[0.0], [0.1], [5.0], [5.2], [4.0], [20.0]])
    dist = np.abs(points - points.T)
    labels, merged = merge_singletons(dist, np.array([0, 0, 1, 1, 2, 3]))
    assert merged == 2 and labels.tolist() == [0, 0, 1, 1, 1, 1]   # 4.0 joins 5.x; 20.0 joins the nearer 5.x group
    labels, merged = merge_singletons(dist, np.arange(6))            # AP did not converge: everyone alone
    assert min(np.bincount(labels)) >= 2 and merged >= 3
    assert merge_singletons(dist[:1, :1], np.zeros(1, int))[0].tolist() == [0]


def test_no_cluster_of_one_and_the_record_keeps_the_client_list():
    from bench.run.cells import run_group

    # one class per client, 5 clients: AP (seed 0) leaves one client in a cluster of its own
    suite = tiny_suite([("sensecrypt", {"key_bits": KEY, "ratio_cap": 0.05})], [("ilrg", {})], model="mlp-tiny",
                       model_params={"hidden": 4}, num_clients=5, clients_per_round=5, partition="k-classes",
                       classes_per_client=1, attack_batch_size=4)
    rec = next(run_group(list(suite.cells), None))
    assert rec["status"] in ("ok", "blocked"), rec["reason"]
    info = rec["details"]["sensecrypt"]
    assert info["singletons_merged"] >= 1 and info["ap_cluster_count"] >= 2
    assert len(info["clusters"]) == 5 and min(np.bincount(info["clusters"])) >= 2
    assert info["cluster_count"] == len(set(info["clusters"])) == rec["metrics"]["cluster_count"]
    assert rec["metrics"]["single_upload_aggregates"] == 0


def test_client_distances_equal_the_broadcast_formula_to_the_bit():
    """Row by row (memory N x D) gives exactly what the N x N x D broadcast gave."""
    from defenses.sensecrypt.clustering import distances

    vectors = np.random.default_rng(0).random((7, 1001))
    diff = vectors[:, None, :] - vectors[None, :, :]
    assert np.array_equal(distances(vectors), np.sqrt((diff ** 2).sum(-1)))
    assert np.all(np.diag(distances(vectors)) == 0.0)
