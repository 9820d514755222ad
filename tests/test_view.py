"""The server view holds nothing from a hidden position, and its metadata is exactly what travelled in
the clear (property test over masks, shapes, upload metadata and negotiation messages)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.data.loading import load_dataset
from bench.federation.engine import build_federation, run_federation
from bench.federation.scenario import Scenario
from bench.protocol.view import ServerView, hidden_leak_free
from bench.protocol.wire import LAYOUTS, Message, Payload, PlainPart, Upload
from bench.registry import DEFENSES

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)
names_ = st.text("abcdefgh ()_", min_size=1, max_size=12)
messages = st.lists(st.tuples(st.integers(-1, 3), names_, st.binary(max_size=40), st.sampled_from(LAYOUTS)),
                    max_size=5)


@settings(max_examples=60, deadline=None)
@given(shape_list=st.lists(shapes, min_size=1, max_size=4), seed=st.integers(0, 10_000),
       meta=st.dictionaries(names_, st.binary(max_size=40), max_size=3), sent=messages)
def test_hidden_positions_never_reach_the_view(shape_list, seed, meta, sent):
    rng = np.random.default_rng(seed)
    names = [f"p{i}" for i in range(len(shape_list))]
    shapes_ = dict(zip(names, shape_list))
    update = {n: torch.from_numpy(rng.normal(size=s).astype(np.float32)) for n, s in shapes_.items()}
    masks = {n: rng.random(int(np.prod(s))) < 0.5 for n, s in shapes_.items()}
    clear = [(r, what, Message(data, layout)) for r, what, data, layout in sent]

    def view_of(values):
        plain = {n: PlainPart.of(values[n], masks[n]) for n in names if masks[n].any()}
        return ServerView.of(Upload("client-0", 0, 1.0, Payload(plain=plain, meta=dict(meta))), shapes_, clear)

    view = view_of(update)
    assert hidden_leak_free(view)
    secret = {n: torch.where(torch.from_numpy(masks[n]).reshape(update[n].shape), update[n],
                             torch.randn(update[n].shape)) for n in names}
    other = view_of(secret)
    for n in names:
        vis = view.visible[n]
        assert torch.equal(vis.reshape(-1), torch.from_numpy(masks[n]))
        assert torch.equal(view.values[n][vis], update[n][vis])
        assert torch.equal(torch.nan_to_num(view.values[n], nan=0.0), torch.nan_to_num(other.values[n], nan=0.0))
    # metadata: the upload's own entries and every clear message, as sent, and nothing else
    expected = dict(meta) | {f"sent/{r}/{what}": m.data for r, what, m in clear}
    assert view.meta == expected == other.meta
    assert set(view.layouts) == set(expected)
    for r, what, m in clear:
        if view.meta[f"sent/{r}/{what}"] == m.data:
            assert view.layouts[f"sent/{r}/{what}"] in LAYOUTS


GRID = [("plaintext", {}), ("maskcrypt", {}), ("secagg", {}), ("selectiveshield", {"noise_multiplier": 1.0}),
        ("sensecrypt", {"key_bits": 512, "ratio_cap": 0.05}), ("fedml-he", {}), ("dictpfl", {})]


@pytest.mark.parametrize("name,params", GRID, ids=[g[0] for g in GRID])
def test_every_clear_message_of_the_attacked_client_is_in_its_view(name, params):
    """Generic: whatever a defense sends the server in the clear reaches the metadata, byte for byte."""
    sc = Scenario(name="view", dataset="digits", model="mlp-tiny", num_clients=3, clients_per_round=3, rounds=2,
                  attack_round=1, max_train=90, max_test=30, partition="k-classes", classes_per_client=3)
    data = load_dataset("digits", None, max_train=sc.max_train, max_test=sc.max_test)
    defense = DEFENSES.get(name)(**params)
    fed = build_federation(sc, data, defense)
    run = run_federation(sc, data, defense, fed=fed)
    view = run.targets[0].view
    attacked = fed.clients[sc.attack_client].name
    before = [(r, what, m) for r, s, d, what, m in fed.traffic.clear
              if s == attacked and d == "server" and r <= sc.attack_round]
    for r, what, m in before:
        assert view.meta[f"sent/{r}/{what}"] == m.data and view.layouts[f"sent/{r}/{what}"] == m.layout
    sent_keys = {k for k in view.meta if k.startswith("sent/")}
    assert sent_keys == {f"sent/{r}/{what}" for r, what, _ in before}
    assert hidden_leak_free(view)


def test_what_the_server_knows_of_the_final_model_and_of_the_global_weights():
    """Kills mutants of bench/protocol/view.py that no test of the view reached (docs/mutation.md): the visible
    and known fractions (none of an empty view), the final model assembled with zeros or last known values, and
    whether the global weights and any final entry are known."""
    from types import SimpleNamespace

    from bench.protocol.view import Knowledge, MembershipKnowledge, model_blocked
    nan = float("nan")
    assert ServerView.visible_fraction(SimpleNamespace(visible={"w": torch.tensor([True, False, True, True])})) == 0.75
    assert ServerView.visible_fraction(SimpleNamespace(visible={})) == 0.0
    assert Knowledge.knows_global_model(SimpleNamespace(global_params={"w": torch.ones(3)}))
    assert not Knowledge.knows_global_model(SimpleNamespace(global_params={"w": torch.tensor([1.0, nan])}))
    empty = torch.zeros(0)
    final, last = {"w": torch.tensor([1.0, nan, 3.0, nan])}, {"w": torch.tensor([9.0, 8.0, 7.0, 6.0])}
    mk = MembershipKnowledge(empty, empty, empty, empty, {}, final, last, {})
    assert mk.known_fraction() == 0.5
    assert mk.assemble("zero")["w"].tolist() == [1.0, 0.0, 3.0, 0.0]
    assert mk.assemble("last")["w"].tolist() == [1.0, 8.0, 3.0, 6.0]
    with pytest.raises(ValueError, match="'zero' or 'last'"):
        mk.assemble("mean")
    assert model_blocked(SimpleNamespace(membership=mk)) is None
    hidden = MembershipKnowledge(empty, empty, empty, empty, {}, {"w": torch.full((2,), nan)}, last, {})
    assert hidden.known_fraction() == 0.0 and "knows no entry" in model_blocked(SimpleNamespace(membership=hidden))
