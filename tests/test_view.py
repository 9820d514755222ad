"""The server view holds nothing from a hidden position (property test over masks and shapes)."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.view import ServerView, hidden_leak_free
from bench.wire import Payload, PlainPart, Upload

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shape_list=st.lists(shapes, min_size=1, max_size=4), seed=st.integers(0, 10_000))
def test_hidden_positions_never_reach_the_view(shape_list, seed):
    rng = np.random.default_rng(seed)
    names = [f"p{i}" for i in range(len(shape_list))]
    shapes_ = dict(zip(names, shape_list))
    update = {n: torch.from_numpy(rng.normal(size=s).astype(np.float32)) for n, s in shapes_.items()}
    masks = {n: rng.random(int(np.prod(s))) < 0.5 for n, s in shapes_.items()}

    def view_of(values):
        plain = {n: PlainPart.of(values[n], masks[n]) for n in names if masks[n].any()}
        return ServerView.of(Upload("client-0", 0, 1.0, Payload(plain=plain)), shapes_)

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
