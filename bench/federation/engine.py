"""The federation engine: clients, local training, rounds, sampling, FedAvg through a defense.

The engine knows no defense by name. Each round: sample clients, let the defense
negotiate, train locally, encode uploads, aggregate at the server, decode, apply. The server
folds each upload into the defense's running aggregate as soon as it is encoded, so a round
holds one upload at a time, not every client's (a defense that overrides `aggregate` alone
gets the round's list: bench/protocol/defense.py). In the attack round the attacked client's
upload (one FedSGD step on a batch, or a local-training delta) is also kept as an attack
target together with its ground truth; with attack_repeats > 1 the same client encodes
further batches under the same defense state (counterfactual uploads: only the first one is
aggregated). A malicious-model attack of the group gets its own targets: the same batches uploaded from
the model it sent the attacked client in that round (bench/federation/exchange.py), never aggregated; every
other client and round gets the honest model.
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Callable

import numpy as np
import torch

from bench.crypto.params import OutOfRange
from bench.federation import candidates
from bench.federation.canary import coins, flip, make_canary, trial_batch, trial_update
from bench.federation.client_devices import assign
from bench.federation.costs import CostMeter
from bench.federation.exchange import modified_targets
from bench.federation.partition import partition
from bench.federation.measure import encryption_breakdown, run_metrics, server_view_knowledge
from bench.federation.scenario import Scenario
from bench.federation.state import (Client, Diverged, Federation, FederationRun, ServerSide, Target, Targets,
                                    require_finite, set_entries)
from bench.models import build_model, torch_device, update_names
from bench.models.losses import TASKS
from bench.models.pretrain import pretrain, split_public
from bench.protocol import contracts
from bench.protocol.attack import Attack
from bench.protocol.defense import Defense, Party, running_aggregate
from bench.protocol.evidence import Truth
from bench.protocol.view import Canary, ServerView
from bench.protocol.wire import Payload, Traffic, Upload


def local_update(fed: Federation, client: Client, x: torch.Tensor, y: torch.Tensor, mode: str,
                 generator: torch.Generator, defense: Defense | None = None) -> dict[str, torch.Tensor]:
    """Client update as a delta: one FedSGD step (-lr * grad) or local SGD epochs.

    Every step's gradient comes from the defense's `local_gradient` (the task's mean loss by default; record-level
    DP clips and noises it per example). The delta is taken against the model the client started from (the global
    model merged with its personalized entries), so a personalized or per-cluster model advances by its own
    training. It trains on the run's device (bench/models/torch_device.py) in the run's one local-training module
    (Federation.local_model); the delta comes back on the CPU."""
    sc = fed.scenario
    defense = defense or _PLAIN
    dev = torch_device.device(fed.model)
    model = fed.local_model()
    start = client.merged(fed.params())
    set_entries(model, start)
    model.to(dev).train()
    if mode == "gradient":
        before = {n: b.detach().cpu().clone() for n, b in model.named_buffers() if n in fed.shapes}
        model.zero_grad()
        contracts.returned_loss(defense, defense.local_gradient(fed, client, model, x, y))
        grads = fed.grads(model)
        after = dict(model.named_buffers())
        return {n: (after[n].detach().cpu() - before[n]) if n in before else -sc.lr * grads[n] for n in fed.names}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=sc.lr)
    finite = torch.ones((), dtype=torch.bool, device=dev)   # checked once at the end: no sync per step
    for _ in range(sc.local_epochs):
        order = torch.randperm(len(y), generator=generator)   # drawn on the CPU on every device
        for batch in order.split(sc.batch_size):
            opt.zero_grad()
            loss = contracts.returned_loss(defense, defense.local_gradient(fed, client, model, x[batch], y[batch]))
            finite &= torch.isfinite(loss)
            opt.step()
    if not bool(finite):
        raise Diverged(fed.round, f"{client.name}'s training loss")
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return {n: state[n].detach().cpu() - start[n] for n in fed.names}


_PLAIN = Defense()   # local training as the base contract runs it: the task's mean loss, backpropagated


def build_federation(scenario: Scenario, data, defense: Defense | None = None) -> Federation:
    """Clients and their data, the (optionally warm-started, defense-adapted) global model, the parties."""
    torch.manual_seed(scenario.seed)
    task = TASKS[data.task](data)
    base = build_model(scenario.model, data, **scenario.model_params)
    pool = np.arange(len(data.train_y))
    if scenario.public_fraction > 0:
        public, pool = split_public(data.train_y, scenario.public_fraction, scenario.seed)
        if scenario.pretrain_epochs:
            pretrain(base, task, data.train_x[public], data.train_y[public], scenario.pretrain_epochs,
                     scenario.batch_size, scenario.lr, scenario.seed)
    start = {k: v.detach().clone() for k, v in base.state_dict().items()}

    def new_model() -> torch.nn.Module:
        model = build_model(scenario.model, data, **scenario.model_params)
        model.load_state_dict(start)
        return contracts.returned_model(defense, "adapt_model", defense.adapt_model(model)) if defense is not None \
            else model

    model = new_model()
    names = update_names(model)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    shapes = {n: tuple(state[n].shape) for n in names}
    parts = partition(data.train_y[pool], scenario.num_clients, scenario.partition, alpha=scenario.alpha,
                      classes_per_client=scenario.classes_per_client, seed=scenario.seed)
    devices = assign(scenario, [data.train_y[pool[idx]] for idx in parts])
    clients = [Client(i, data.train_x[pool[idx]], data.train_y[pool[idx]], Party(f"client-{i}"), device=devices[i])
               for i, idx in enumerate(parts)]
    parties = {"server": Party("aggregation server"), "key-server": Party("key-server")} | {c.name: c.party for c in clients}
    return Federation(scenario, data, task, model, names, shapes, clients, parties, Traffic(), CostMeter(),
                      np.random.default_rng(scenario.seed), new_model)


def _sample(fed: Federation, round: int) -> list[Client]:
    """Fixed-size sampling, or Poisson with q = clients_per_round / num_clients (at least one client)."""
    sc = fed.scenario
    if sc.sampling == "poisson":
        hits = np.flatnonzero(fed.rng.random(sc.num_clients) < sc.clients_per_round / sc.num_clients)
        chosen = list(hits) or [int(fed.rng.integers(sc.num_clients))]
        if round == sc.attack_round and sc.attack_client not in chosen:
            chosen.append(sc.attack_client)
        return [fed.clients[i] for i in sorted(chosen)]
    chosen = list(fed.rng.choice(sc.num_clients, size=sc.clients_per_round, replace=False))
    if round == sc.attack_round and sc.attack_client not in chosen:
        chosen[-1] = sc.attack_client
    return [fed.clients[i] for i in sorted(chosen)]


def _train(fed: Federation, defense: Defense, sampled: list[Client], round: int,
           canary: Canary | None) -> dict[str, list[tuple]]:
    """Each sampled client's update(s): (x, y, update, attacked, canary in the trial or None); the attacked
    client's are FedSGD batches, canary trials where the scenario runs them (bench/federation/canary.py).
    A defense whose `trains` is False (it sends and applies nothing) gets zero updates, untrained."""
    sc = fed.scenario
    trained: dict[str, list[tuple]] = {}
    for client in sampled:
        gen = torch.Generator().manual_seed(sc.seed * 100_003 + round * 1_009 + client.index)
        attacked = round == sc.attack_round and client.index == sc.attack_client
        flips = coins(fed)
        trained[client.name] = []
        for _ in range(sc.attack_repeats if attacked else 1):
            included = flip(canary, flips) if attacked and canary is not None else None
            if attacked:
                idx = torch.randperm(client.num_samples, generator=gen)[:sc.attack_batch_size]
                x, y, mode = client.x[idx], client.y[idx], sc.attack_update
                if included is not None:
                    x, y = trial_batch(canary, x, y, included)
            else:
                x, y, mode = client.x, client.y, "delta"
            update = local_update(fed, client, x, y, mode, gen, defense) if defense.trains else \
                {n: torch.zeros(shape) for n, shape in fed.shapes.items()}
            if included is not None:
                update = trial_update(canary, update, included)
            require_finite(update, round, f"{client.name}'s update")
            trained[client.name].append((x, y, update, attacked, included))
    return trained


def _upload(fed: Federation, defense: Defense, sampled: list[Client], trained, knowledge,
            targets: Targets, arrive: Callable[[Upload], None]) -> None:
    """Encode every update; keep the attacked ones as targets; each client's first goes to `arrive` (the server),
    and a client's updates are dropped once encoded."""
    total = sum(c.num_samples for c in sampled)
    for client in sampled:
        weight = client.num_samples / total
        for rep, (x, y, update, attacked, included) in enumerate(trained.pop(client.name)):
            payload = contracts.returned_payload(defense, "encode", defense.encode(fed, client, update, weight))
            upload = Upload(client.name, fed.round, weight, payload)
            if attacked:
                told = y.tolist() if fed.scenario.labels_known else None
                sent = fed.traffic.sent_in_clear(client.name, "server")
                member = None if included is None else np.atleast_1d(np.asarray(included, dtype=int))
                truth = Truth(x, y, update, client_y=client.y, member=member, trial=included is not None)
                targets.append(Target(ServerView.of(upload, fed.shapes, sent), truth, replace(knowledge, labels=told)))
            if rep == 0:
                fed.send(client.name, "server", "upload", upload.payload)
                fed.observe(upload)
                arrive(upload)
            del payload, upload


def _uploads_and_aggregate(fed: Federation, defense: Defense, sampled: list[Client], trained, knowledge,
                           targets: Targets) -> Payload:
    """The round's aggregate: uploads folded into the defense's running aggregate as they arrive, or, for a
    defense that aggregates a list, collected and handed over at once."""
    server, keys = ServerSide(fed), fed.parties["server"]
    running = contracts.returned_aggregation(defense, running_aggregate(defense, server, keys))
    uploads: list[Upload] = []
    _upload(fed, defense, sampled, trained, knowledge, targets, uploads.append if running is None else running.fold)
    aggregate = defense.aggregate(server, uploads, keys) if running is None else running.result()
    return contracts.returned_payload(defense, "aggregate", aggregate)


def _aggregate(fed: Federation, defense: Defense, sampled: list[Client], aggregate: Payload,
               known: dict[str, torch.Tensor]) -> None:
    """Decoding, the new global model, and what the server now knows of it."""
    decoder = contracts.returned_party(defense, defense.decoder(fed))
    if decoder.name == "key-server":
        fed.send("server", "key-server", "aggregate", aggregate)
    update = contracts.returned_update(defense, defense.decode(fed, aggregate, decoder), fed.shapes)
    _broadcast(fed, sampled, aggregate, update, decoder)
    learned = _server_learns(aggregate, decoder, fed.shapes)
    current = fed.params()
    step = _server_step(fed, update)
    new = {n: current[n] + step[n] for n in fed.names}
    require_finite(new, fed.round, "the new global model")
    set_entries(fed.model, new)
    for n in fed.names:
        known[n] &= learned[n]
    for client in sampled:
        defense.merge(fed, client, update)


def _server_step(fed: Federation, update: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the decoded update moves the global model by: the update itself (FedAvg, the default), or the server
    optimizer's step on the trainable parameters (Reddi et al. 2021's FedAvgM; McMahan et al. 2018 use server
    momentum for DP-FedAvg): m = server_momentum * m + update, step = server_lr * m. Buffers (BatchNorm statistics)
    take the update as it is: they are averages, not descended."""
    sc = fed.scenario
    if sc.server_lr == 1.0 and sc.server_momentum == 0.0:
        return update
    trainable = {n for n, p in fed.model.named_parameters() if p.requires_grad}
    step = dict(update)
    for n in fed.names:
        if n in trainable:
            moment = update[n] if n not in fed.momentum else sc.server_momentum * fed.momentum[n] + update[n]
            if sc.server_momentum:
                fed.momentum[n] = moment
            step[n] = sc.server_lr * moment
    return step


def _exchanges(fed: Federation, pristine: Defense, modifiers: dict[str, Attack], knowledge, trained,
               sampled: list[Client]) -> dict:
    """Each malicious-model attack's targets (or the error its exchange raised: that attack's cells fail alone)."""
    client = fed.clients[fed.scenario.attack_client]
    weight = client.num_samples / sum(c.num_samples for c in sampled)
    out = {}
    for label, attack in modifiers.items():
        try:
            out[label] = modified_targets(fed, pristine, attack, knowledge, trained[client.name], weight, local_update,
                                          sampled)
        except Exception as err:   # recorded as that cell's failure with its one-line reason
            out[label] = err
    return out


def run_federation(scenario: Scenario, data, defense: Defense, progress: Callable[[str], None] | None = None,
                   fed: Federation | None = None, needs_membership: bool = False,
                   modifiers: dict[str, Attack] | None = None) -> FederationRun:
    """Every round through the defense; a non-finite update, loss or model stops the run there (`diverged`).

    `needs_membership`: draw membership candidates for the finished run (a membership attack is in the group).
    `modifiers`: the group's malicious-model attacks by label; each is asked for the model the attacked client
    gets in the attacked round, and its uploads land in the run's `modified` under its label."""
    start = time.perf_counter()
    fed = fed or build_federation(scenario, data, defense)
    pristine = copy.deepcopy(defense) if modifiers else None   # the defense before setup, for each exchange
    modified: dict = {}
    fed.round = -1
    defense.setup(fed)
    known = {n: torch.ones(s, dtype=torch.bool) for n, s in fed.shapes.items()}
    for n, hidden in defense.hidden_initial(fed).items():
        known[n] &= ~hidden
    initial = {n: v.masked_fill(~known[n], 0.0) for n, v in fed.params().items()}   # as the server knows it
    last = {n: v.clone() for n, v in initial.items()}   # each entry's last value the server knew
    targets = Targets()
    knowledge, diverged = None, None
    canary = make_canary(fed)
    for r in range(scenario.rounds):
        fed.round = r
        sampled = _sample(fed, r)
        if r == scenario.attack_round:
            knowledge = replace(server_view_knowledge(fed, known, defense), canary=canary)
        try:
            trained = _train(fed, defense, sampled, r, canary)
            defense.round_start(fed, r, sampled, {c.name: trained[c.name][0][2] for c in sampled})
            if r == scenario.attack_round and modifiers:   # before the honest upload, which drops its batches
                modified = _exchanges(fed, pristine, modifiers, knowledge, trained, sampled)
            aggregate = _uploads_and_aggregate(fed, defense, sampled, trained, knowledge, targets)
            _aggregate(fed, defense, sampled, aggregate, known)
        except Diverged as err:   # the global model stays the last finite one; its utility is reported
            diverged = err
            break
        except OutOfRange as err:   # an update the encryption cannot carry: training left the protocol's range
            diverged = Diverged(r, "an update", f"left the range its encryption can encode ({err})")
            break
        current = fed.params()
        last = {n: torch.where(known[n], current[n], last[n]) for n in fed.names}
        if progress:
            progress(f"round {r + 1}/{scenario.rounds}")
    measured = run_metrics(fed, defense, time.perf_counter() - start)
    measured.update(encryption_breakdown(fed))
    if diverged is not None:
        measured["diverged_round"] = diverged.round
    metrics = {k: v for k, v in measured.items() if not isinstance(v, dict)}
    details = {k: v for k, v in measured.items() if isinstance(v, dict)} | {"key_topology": defense.key_topology}
    if defense.differentially_private:   # the record must then carry its epsilon (bench/protocol/records.py)
        details["differentially_private"] = True
    if diverged is not None:
        return FederationRun(targets, knowledge, metrics, details, str(diverged), modified)
    chosen = candidates.select(fed, known, last, initial, needs_membership,
                               defense.server_estimate(fed) if needs_membership else {})
    if chosen is not None:
        def told(target: Target) -> None:
            target.knowledge = replace(target.knowledge, membership=chosen[0])
            target.truth.member = chosen[1]
        targets.update(told)
    return FederationRun(targets, knowledge, metrics, details, modified=modified)


def _broadcast(fed: Federation, sampled: list[Client], aggregate: Payload, update, decoder: Party) -> None:
    """Downstream bytes: the aggregate itself, or the key server's plaintext result."""
    if decoder.name == "key-server" or not aggregate.cipher:
        plain = sum(t.numel() * 4 for t in update.values())
        if decoder.name == "key-server":
            fed.send("key-server", "server", "decrypted aggregate", plain)
        for c in sampled:
            fed.send("server", c.name, "global update", plain if aggregate.cipher else aggregate.nbytes)
    else:
        for c in sampled:
            fed.send("server", c.name, "encrypted global update", aggregate)


def _server_learns(aggregate: Payload, decoder: Party, shapes) -> dict[str, torch.Tensor]:
    """Entries of the new global model the aggregation server knows in plaintext."""
    if decoder.name == "key-server" or not aggregate.cipher:
        return {n: torch.ones(s, dtype=torch.bool) for n, s in shapes.items()}
    learned = {n: torch.zeros(s, dtype=torch.bool) for n, s in shapes.items()}
    for name, part in aggregate.plain.items():
        learned[name] = torch.from_numpy(part.visible().copy()).reshape(shapes[name])
    return learned


