"""Base: the reference row of membership suites, the model before federated training.

No client update is sent and none is applied, so the global model stays the one the
server built; a membership attack on it measures what the model leaks with no training on
the members (chance, unless the members were seen before federation).
"""
from __future__ import annotations

from bench.protocol.defense import Defense
from bench.protocol.wire import Payload
from bench.registry import DEFENSES


@DEFENSES.register("base", "reference row: the model before federated training (nothing uploaded or applied)")
class Base(Defense):
    key_topology = "none"
    reference_row = True
    decodes_weighted_sum = False   # nothing is sent, the decoded update is zero
    trains = False                 # so the clients' local training is skipped

    def encode(self, fed, client, update, weight) -> Payload:
        return Payload()
