"""The attacked client's exchange under a model a malicious server modified (threat model "malicious-model").

A malicious-model attack (bench/protocol/attack.py) changes the model the server sends the attacked client in
the attacked round. The engine runs that exchange beside the honest round, once per such attack of the group,
as a counterfactual: the federation's own clients, rounds, training and defense state never see the modified
model (every other client and round gets the honest one, and passive attacks read only honest uploads). The
modified upload becomes that attack's target and is never aggregated: its layout differs from every other
client's, so a real server could not add it to the sum and would drop it.

The defense meets the modified model as it would had the server chosen it: a fresh copy of the defense, taken
before the run's setup, runs its protocol on it (setup: keys and one-off negotiation such as FedML-HE's mask;
round_start: the client's own selection, e.g. MaskCrypt's proposal or SelectiveShield's Fisher mask, on the model
it received; encode) at copies of every party (same data and device profiles, fresh keys and state). Only the
attacked client trains and uploads; the other parties' copies take part in that setup only, and the exchange's
scenario says so (clients_per_round = 1): a defense sizes the round's consensus, weights and noise for the one
client in it (SelectiveShield's consensus is that client's own mask, DP-FedAvg's local noise the whole round's).

The server sends what it knows: the model handed to `modify_model` holds NaN where the server does not know the
global weights (clients decrypt them); the client fills those entries in, matched by tensor identity. What it
may tune the model on is public data of the task: `knowledge.public_x`, up to 2,048 of the scenario's
held-out inputs, none of them a client's.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Callable

import numpy as np
import torch

from bench.federation.costs import CostMeter
from bench.federation.measure import server_knowledge
from bench.federation.state import Client, Federation, Target, Targets, set_entries
from bench.models import update_names
from bench.protocol import contracts
from bench.protocol.attack import Attack
from bench.protocol.defense import Defense, Party
from bench.protocol.evidence import Truth
from bench.protocol.view import Knowledge, ServerView
from bench.protocol.wire import Traffic, Upload

PUBLIC = 2048   # held-out inputs a malicious server may tune its model on (knowledge.public_x)


def _entries(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())


def model_as_sent(fed: Federation, attack: Attack, knowledge: Knowledge) -> tuple[torch.nn.Module, dict]:
    """The modified model as the client runs it, and its update entries as the server knows them (NaN where
    it does not know the global weights the model carries over)."""
    honest = fed.new_model()
    set_entries(honest, knowledge.global_params)
    truth = fed.params()
    carried = {id(t): n for n, t in _entries(honest).items() if n in truth}
    public = fed.data.test_x[:PUBLIC].clone() if fed.data.test_x is not None else None
    told = replace(knowledge, public_x=public)
    model = contracts.returned_model(attack, "modify_model", attack.modify_model(honest, told)).cpu()
    state = _entries(model)
    names = update_names(model)
    known = {n: state[n].detach().clone() for n in names}
    with torch.no_grad():
        for t in state.values():
            if id(t) in carried and t.is_floating_point():
                t.copy_(torch.where(torch.isnan(t), truth[carried[id(t)]], t))
    left = [n for n, t in state.items() if t.is_floating_point() and bool(torch.isnan(t).any())]
    if left:
        raise contracts.ContractError(
            f"{contracts.describe(attack)}: modify_model returned a model whose '{left[0]}' holds entries the "
            f"server does not know (NaN); keep the given model's own tensors (not copies) so the client fills them")
    return model, known


def _parties(fed: Federation) -> tuple[list[Client], dict[str, Party]]:
    """Every party anew: the clients' data and devices, no keys, no defense state, no personalized entries."""
    clients = [Client(c.index, c.x, c.y, Party(c.name), device=c.device) for c in fed.clients]
    parties = {name: Party(p.name) for name, p in fed.parties.items() if not name.startswith("client-")}
    return clients, parties | {c.name: c.party for c in clients}


def modified_targets(fed: Federation, pristine: Defense, attack: Attack, knowledge: Knowledge,
                     batches: list[tuple], weight: float, train: Callable) -> Targets:
    """The attacked client's uploads of `batches` ((x, y, ...) as the honest round drew them) when the server
    sent it `attack.modify_model(...)`, each with the view, ground truth and knowledge of the modified model."""
    sc = replace(fed.scenario, clients_per_round=1)
    model, known = model_as_sent(fed, attack, knowledge)
    template = copy.deepcopy(model)
    names = update_names(model)
    state = _entries(model)
    shapes = {n: tuple(state[n].shape) for n in names}
    clients, parties = _parties(fed)
    mfed = Federation(sc, fed.data, fed.task, model, names, shapes, clients, parties, Traffic(), CostMeter(),
                      np.random.default_rng(sc.seed), lambda: copy.deepcopy(template))
    defense = copy.deepcopy(pristine)
    mfed.round = -1
    defense.setup(mfed)
    mfed.round = fed.round
    client = mfed.clients[sc.attack_client]
    gen = torch.Generator().manual_seed(sc.seed * 100_003 + fed.round * 1_009 + client.index)
    updates = [train(mfed, client, x, y, sc.attack_update, gen, defense) if defense.trains else
               {n: torch.zeros(s) for n, s in shapes.items()} for x, y, *_ in batches]
    defense.round_start(mfed, fed.round, [client], {client.name: updates[0]})
    told = server_knowledge(sc, fed.data, model, known, mfed.new_model, defense.uploads_weights)
    targets = Targets()
    for (x, y, *_), update in zip(batches, updates):
        payload = contracts.returned_payload(defense, "encode", defense.encode(mfed, client, update, weight))
        upload = Upload(client.name, fed.round, weight, payload)
        view = ServerView.of(upload, shapes, mfed.traffic.sent_in_clear(client.name, "server"))
        truth = Truth(x, y, update, client_y=client.y)
        targets.append(Target(view, truth, replace(told, labels=y.tolist() if sc.labels_known else None)))
    return targets
