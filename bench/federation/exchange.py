"""The attacked client's exchange under a model a malicious server modified (threat model "malicious-model").

A malicious-model attack (bench/protocol/attack.py) changes the model the server sends the attacked client in
the attacked round. The engine runs that exchange beside the honest round, once per such attack of the group,
as a counterfactual: the federation's own clients, rounds, training and defense state never see the modified
model (every other client and round gets the honest one, and passive attacks read only honest uploads). The
modified upload becomes that attack's target and is never aggregated: its layout differs from every other
client's, so a real server could not add it to the sum and would drop it.

The defense meets the modified model as it would had the server chosen it: a fresh copy of the defense, taken
before the run's setup, runs its protocol on it (setup: keys and one-off negotiation such as FedML-HE's mask;
round_start: the clients' own selection, e.g. MaskCrypt's proposal or SelectiveShield's Fisher mask, on the model
they received; encode) at copies of every party (same data and device profiles, fresh keys and state). The round
is the honest round's: the same scenario and the same cohort, each of its clients training on the model the
server sent (a negotiation needs one layout) as the engine trains them, so the defense sizes its consensus,
clipping and noise for the real round (DP-FedAvg's local noise z*C/sqrt(m) for the round's m clients, SecAgg's
masks over its participants) and its accounting stands at the attacked round (the copy's round_start is that
round's, bench/federation/accounting.py). Only the attacked client's uploads are kept; no one's is aggregated.

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
                     batches: list[tuple], weight: float, train: Callable, cohort: list[Client]) -> Targets:
    """The attacked client's uploads of `batches` ((x, y, ...) as the honest round drew them) when the server
    sent `attack.modify_model(...)` to the round's `cohort` (the honest round's sampled clients), each with the
    view, ground truth and knowledge of the modified model."""
    sc = fed.scenario
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
    sampled = [mfed.clients[c.index] for c in cohort]

    def trained(who: Client, x, y, mode: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
        if not defense.trains:
            return {n: torch.zeros(s) for n, s in shapes.items()}
        return train(mfed, who, x, y, mode, gen, defense)

    gens = {c.index: torch.Generator().manual_seed(sc.seed * 100_003 + fed.round * 1_009 + c.index) for c in sampled}
    updates = [trained(client, x, y, sc.attack_update, gens[client.index]) for x, y, *_ in batches]
    others = {c.name: trained(c, c.x, c.y, "delta", gens[c.index]) for c in sampled if c is not client}
    defense.round_start(mfed, fed.round, sampled, {**others, client.name: updates[0]})
    told = server_knowledge(sc, fed.data, model, known, mfed.new_model, defense.uploads_weights)
    targets = Targets()
    for (x, y, *_), update in zip(batches, updates):
        payload = contracts.returned_payload(defense, "encode", defense.encode(mfed, client, update, weight))
        upload = Upload(client.name, fed.round, weight, payload)
        view = ServerView.of(upload, shapes, mfed.traffic.sent_in_clear(client.name, "server"))
        truth = Truth(x, y, update, client_y=client.y)
        targets.append(Target(view, truth, replace(told, labels=y.tolist() if sc.labels_known else None)))
    return targets
