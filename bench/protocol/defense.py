"""The defense contract: hooks the federation engine calls, with no defense-specific branches.

setup (keys, negotiation) -> local_gradient (client: each step of its local training) ->
round_start (per-round negotiation) -> encode (client: update -> payload) -> aggregate
(aggregation server, public material only) -> decode (whoever holds the key) -> merge
(client; personalized parts stay local).

The server aggregates as uploads arrive: start_aggregate opens the round's running aggregate and
the engine folds each upload into it right after the client encodes it, so a round never holds
every upload at once. A defense whose `aggregate` is its own (overridden below the class that
defines its start_aggregate) gets the round's uploads as a list instead (running_aggregate).

Party separation is explicit: key material lives in the `keys` of the party that holds
it, and each hook receives only the party it runs at. The base class is plaintext FedAvg
through the generic wire arithmetic of bench/protocol/payloads.py.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from bench.protocol.configurable import Configurable
from bench.protocol.aggregation import Aggregation, RunningSum
from bench.protocol.payloads import unpack
from bench.protocol.wire import Party, Payload, Upload, dense_payload

KEY_TOPOLOGIES = {
    "none": "nobody needs to: the upload is plaintext",
    "shared-client-key": "any one client colluding with the aggregation server",
    "key-server": "the key server colluding with the aggregation server",
    "pairwise-masks": "every other client of the round colluding with the aggregation server (their pair seeds "
                      "unmask one upload)",
}


class Defense(Configurable):
    """Base defense: plaintext FedAvg wire arithmetic; subclasses override hooks."""

    key_topology: ClassVar[str] = "none"
    # True when decode(aggregate(uploads)) is sum_k weight_k * update_k of the updates given to encode
    # (up to noise that does not depend on the data, which only adds privacy),
    # with the weights given to encode and carried by the uploads: what DP-FedAvg's noise calibration
    # (sum / W of clipped updates) relies on when it wraps this defense. Defenses whose aggregate is
    # anything else (per-cluster models, means over who sent an entry, carried-over residuals) say False.
    decodes_weighted_sum: ClassVar[bool] = True
    # True when an upload carries the client's trained weights (e.g. LoRA factors) instead of its update;
    # an attack then knows to subtract the global weights it sent (Knowledge.gradient)
    uploads_weights: ClassVar[bool] = False
    # True for a row to compare against that protects nothing on purpose (plaintext, the untrained model);
    # a defense class that changes no upload hook (encode, adapt_model) must declare this to be registered
    reference_row: ClassVar[bool] = False
    # False when nothing a client trains is ever sent or applied (the untrained model's row): the engine then
    # skips local training and hands encode a zero update instead of spending the run's time on discarded work
    trains: ClassVar[bool] = True
    # True for a differentially private mechanism: its run_metrics must report the `epsilon` its accountant gives
    # (with the accountant's details under "dp"), and a record of it without one is refused where it is read
    # (bench/protocol/records.py). An instance whose noise is off (a parameter) sets it False.
    differentially_private: ClassVar[bool] = False

    def undefended(self) -> bool:
        """True when this instance's uploads carry the trained update unprotected: the row an attack must break
        in a scenario before its results on other rows give verdicts (bench/evaluation/calibration.py). A protocol
        whose protection is a parameter that can be off says so for that setting."""
        return self.reference_row and self.trains

    def applicable(self, setting) -> str | None:
        """Why this defense cannot apply to a scenario at all (e.g. it needs LoRA adapters the model lacks), or
        None. Checked at suite load on the scenario's Setting (bench/protocol/attack.py): a suite's grid shows
        such a cell as "n/a" with this reason instead of running it."""
        return None

    # -- hooks ---------------------------------------------------------------------------------
    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Reparameterize the (warm-started) model every party builds, e.g. into a frozen
        dictionary and a trainable table; the result is the public architecture."""
        return model

    def setup(self, fed) -> None:
        """Keys and one-off negotiation; send messages with fed.send(round=-1, ...)."""

    def local_gradient(self, fed, client, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """At the client, for each step of its local training (one FedSGD step, or each batch of its local epochs):
        put into the parameters' .grad (zeroed by the engine) the gradient the step takes on the batch (x, y), and
        return the batch's loss. The default is the task's mean loss, backpropagated (Federation.backward);
        record-level DP-SGD clips and noises the gradient per example here."""
        return fed.backward(model, x, y)

    def round_start(self, fed, round: int, clients: list, updates: dict[str, dict[str, torch.Tensor]]) -> None:
        """Per-round negotiation after local training, before uploads (e.g. mask proposals).

        `updates` maps each sampled client's name to its trained update; only that client's
        own code may read its entry (messages it derives go through fed.send)."""

    def encode(self, fed, client, update: dict[str, torch.Tensor], weight: float) -> Payload:
        return dense_payload(update)

    def aggregate(self, fed, uploads: list[Upload], server: Party) -> Payload:
        """At the aggregation server: `fed` is what it holds (bench/federation/state.py's ServerSide: the round,
        names, shapes, public scenario settings, client ids, meter, send), `server` its public key material.
        The default folds the list into start_aggregate's running aggregate."""
        return self.start_aggregate(fed, server).fold_all(uploads)

    def start_aggregate(self, fed, server: Party) -> Aggregation | None:
        """The round's running aggregate (bench/protocol/aggregation.py), opened after round_start; the engine
        folds each upload into it as it arrives. The default adds plaintext parts weighted and ciphertexts
        homomorphically. None: no running aggregate this time (a wrapper around a defense without one), and
        the engine calls `aggregate` with the round's uploads."""
        return RunningSum(fed, server)

    def decoder(self, fed) -> Party:
        """The party that turns the aggregate into a plaintext update."""
        return fed.parties["key-server"] if self.key_topology == "key-server" else fed.clients[0].party

    def decode(self, fed, aggregate: Payload, party: Party) -> dict[str, torch.Tensor]:
        return unpack(aggregate, fed.shapes, party, fed)

    def merge(self, fed, client, global_update: dict[str, torch.Tensor]) -> None:
        """Client-side use of the new global update (personalized defenses override)."""

    def run_metrics(self, fed) -> dict[str, Any]:
        """Measured, defense-specific metrics of the run (fractions, epsilon, ...)."""
        return {}

    def hidden_initial(self, fed) -> dict[str, torch.Tensor]:
        """Boolean masks of initial-model entries the clients draw themselves (after setup) and never send, so
        the aggregation server does not know them from the start (e.g. SHE-LoRA's client-drawn LoRA A)."""
        return {}

    def server_estimate(self, fed) -> dict[str, torch.Tensor]:
        """Values the aggregation server can compute, from public parts of the aggregates it built so far, for
        model entries it does not know (e.g. the plaintext part of a selectively encrypted sum): after the last
        round membership attacks use them in place of a fill; at the attacked round they are Knowledge.estimate."""
        return {}

    # -- budget matching (bench/federation/budget.py) -------------------------------------------------------
    def cipher_target(self) -> tuple[str, float] | None:
        """(reference defense label, bytes ratio) when this defense's encrypted amount is matched."""
        return None

    def match_cipher_bytes(self, nbytes: float) -> None:
        """Before setup: encrypt as much as makes an upload's ciphertexts come to about `nbytes`."""
        raise ValueError(f"defense '{type(self).__name__}' has no encrypted amount to match to a byte budget")


def running_aggregate(defense: Defense, fed, server: Party) -> Aggregation | None:
    """The defense's running aggregate for this round, or None when its `aggregate` must see the uploads as a
    list: a class overrode `aggregate` below the class whose start_aggregate it inherits (a plugin written for
    the list contract, or a non-additive aggregate), or start_aggregate returned None."""
    mro = type(defense).__mro__
    owner = {hook: next(k for k in mro if hook in vars(k)) for hook in ("aggregate", "start_aggregate")}
    if not issubclass(owner["start_aggregate"], owner["aggregate"]):
        return None
    return defense.start_aggregate(fed, server)
