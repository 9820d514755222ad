"""A run's attacked uploads past the memory budget go to disk and come back unchanged."""
import torch

from bench.federation.state import Target, Targets
from bench.protocol.evidence import Truth
from bench.protocol.view import ServerView


def _target(i: int) -> Target:
    view = ServerView(values={"w": torch.full((256,), float(i))}, visible={"w": torch.ones(256, dtype=torch.bool)},
                      ciphertext_sizes=(), meta={}, weight=1.0)
    truth = Truth(x=torch.zeros(2, 3), y=torch.tensor([i, i]), update={"w": torch.full((256,), float(i))})
    return Target(view, truth, knowledge=f"knowledge {i}")   # kept in memory as it is


def test_spilled_targets_read_back_and_take_changes():
    targets = Targets(resident_bytes=5000)   # one target holds 256 * (4 + 1 + 4) bytes: two stay resident
    for i in range(5):
        targets.append(_target(i))
    assert len(targets) == 5 and sum(isinstance(t, Target) for t in targets.items) == 2
    assert [float(t.view.values["w"][0]) for t in targets] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert torch.equal(targets[4].truth.y, torch.tensor([4, 4])) and targets[4].knowledge == "knowledge 4"

    def mark(target):
        target.truth.member = torch.tensor([True])
    targets.update(mark)
    assert all(bool(t.truth.member[0]) for t in targets)
