"""The state of a federated run: its clients (data, party, personalized entries, device profile), the
targets it keeps for attacks, the Federation object defense hooks receive, and the finished run.

A non-finite update, loss or model raises Diverged (an outcome the engine reports, not an error), and so does
an update beyond what the defense's encryption can encode (bench/crypto/params.py OutOfRange).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from bench.federation.client_devices import CATALOGS, Device
from bench.federation.costs import CostMeter
from bench.federation.scenario import Scenario
from bench.models import torch_device
from bench.protocol.defense import Party
from bench.protocol.evidence import Truth
from bench.protocol.view import Knowledge, ServerView
from bench.protocol.wire import Message, Payload, Traffic, Upload


@dataclass
class Client:
    index: int
    x: torch.Tensor
    y: torch.Tensor
    party: Party
    local: dict[str, torch.Tensor] = field(default_factory=dict)  # personalized values, NaN where global
    device: Device = field(default_factory=lambda: CATALOGS["uniform"]["uniform"][0])  # scenario data

    def merged(self, global_params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The client's model: its personalized entries over the global model (SelectiveShield eq. 27)."""
        return {n: torch.where(torch.isnan(self.local[n]), v, self.local[n]) if n in self.local else v
                for n, v in global_params.items()}

    @property
    def name(self) -> str:
        return self.party.name

    @property
    def num_samples(self) -> int:
        return len(self.y)


@dataclass
class Target:
    view: ServerView
    truth: Truth
    knowledge: Knowledge


class Targets:
    """A run's attacked uploads in order, as a sequence. Past `resident_bytes` of views and ground truth in
    memory, each further target's view and truth go to a temporary file and are read back on access: a run
    with a hundred attacked batches of a large model holds a few at a time (one d = 768 GPT-2 upload is
    about 190 MB of view and truth). What the sequence hands out is a copy for spilled targets; change
    them with `update`."""

    def __init__(self, resident_bytes: int = 2 << 30):
        self.resident_bytes, self.held = resident_bytes, 0
        self.items: list[Target | tuple[str, Knowledge]] = []
        self.folder = None

    def append(self, target: Target) -> None:
        size = _nbytes(target.view.values) + _nbytes(target.view.visible) + _nbytes(target.truth.update)
        if self.held + size <= self.resident_bytes or not self.items:
            self.held += size
            self.items.append(target)
            return
        import tempfile
        self.folder = self.folder or tempfile.TemporaryDirectory(prefix="leakbench-targets-")
        path = f"{self.folder.name}/{len(self.items)}.pt"
        torch.save((target.view, target.truth), path)
        self.items.append((path, target.knowledge))

    def update(self, change: Callable[[Target], None]) -> None:
        """Apply `change` to every target in place (spilled ones are read, changed and written back)."""
        for i, item in enumerate(self.items):
            target = self[i]
            change(target)
            if not isinstance(item, Target):
                torch.save((target.view, target.truth), item[0])
                self.items[i] = (item[0], target.knowledge)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Target:
        item = self.items[i]
        if isinstance(item, Target):
            return item
        view, truth = torch.load(item[0], weights_only=False)
        return Target(view, truth, item[1])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class Federation:
    """Everything a defense hook may use; hooks receive the party they run at separately."""

    scenario: Scenario
    data: Any
    task: Any
    model: torch.nn.Module
    names: list[str]
    shapes: dict[str, tuple[int, ...]]
    clients: list[Client]
    parties: dict[str, Party]
    traffic: Traffic
    meter: CostMeter
    rng: np.random.Generator
    new_model: Callable[[], torch.nn.Module]
    round: int = -1
    cipher_sizes: list[int] = field(default_factory=list)
    encrypted: dict[str, list[float]] = field(default_factory=dict)   # per-entry-name encrypted fractions
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)   # the server optimizer's (engine._server_step)
    _local: torch.nn.Module | None = field(default=None, repr=False)   # local_model's module and built counters
    _counters: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def observe(self, upload: Upload) -> None:
        """Record what an aggregated upload really encrypted: sizes and per-parameter fractions."""
        self.cipher_sizes.append(upload.payload.cipher_bytes)
        counts = {n: 0 for n in self.names}
        for part in upload.payload.cipher:
            for name, mask in part.layout:
                counts[name] += int(mask.sum())
        for n in self.names:
            total = int(np.prod(self.shapes[n])) if self.shapes[n] else 1
            self.encrypted.setdefault(n, []).append(counts[n] / total)

    def send(self, sender: str, receiver: str, what: str, message: Payload | Message | bytes | int) -> None:
        """Log a message; bytes and Messages travel in the clear and are kept as sent (bytes: opaque
        layout), Payloads are upload-like bodies, an int is a size whose content is not modelled."""
        if isinstance(message, bytes):
            message = Message(message)
        size = message.nbytes if isinstance(message, (Payload, Message)) else int(message)
        self.traffic.log(self.round, sender, receiver, what, size, message if isinstance(message, Message) else None)

    def params(self) -> dict[str, torch.Tensor]:
        state = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        return {n: state[n].detach().clone() for n in self.names}

    def gradient(self, x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
        """Gradient of the task loss on (x, y) at the given (default: global) model, computed where the model
        lives (`backward`), returned on the CPU."""
        model = model or self.model
        model.zero_grad()
        self.backward(model, x, y)
        return self.grads(model)

    def backward(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The gradient of the task's mean loss on (x, y) into the model's zeroed .grad, where the model lives; returns
        the loss. Where the task sets a `chunk`, a larger set is summed over backward passes of that many samples,
        then divided by its terms (tokens): the same gradient, with activation memory bounded by a chunk (one pass
        over 256 sequences of SmolLM2-135M held 20 GB)."""
        dev = torch_device.model_device(model)
        chunk = self.task.chunk
        if chunk is None or len(x) <= chunk:
            loss = self.task.loss(model, x.to(dev), y.to(dev))
            loss.backward()
            return loss.detach()
        terms, summed = 0, torch.zeros((), device=dev)
        for start in range(0, len(x), chunk):
            part = slice(start, start + chunk)
            total, count = self.task.loss_sum(model, x[part].to(dev), y[part].to(dev))
            total.backward()
            terms, summed = terms + count, summed + total.detach()
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= max(terms, 1)
        return summed / max(terms, 1)

    def grads(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's .grad of every update entry, on the CPU (zeros where an entry has none: buffers)."""
        params = dict(model.named_parameters())
        return {n: params[n].grad.detach().cpu().clone() if n in params and params[n].grad is not None
                else torch.zeros(self.shapes[n]) for n in self.names}

    def local_model(self) -> torch.nn.Module:
        """The module every client's local training of the run runs in, built once: building the public architecture
        anew for each client cost more than training a cross-device client's few dozen samples. The caller sets the
        update entries; what training can change besides them (integer buffers such as BatchNorm's counter) is put
        back to its built value here, and frozen weights never train, so each use starts as a fresh build would."""
        if self._local is None:
            self._local = self.new_model()
            self._counters = {n: b.detach().clone() for n, b in self._local.named_buffers() if n not in self.names}
        else:
            with torch.no_grad():
                for n, b in self._local.named_buffers():
                    if n in self._counters:
                        b.copy_(self._counters[n])
        return self._local


@dataclass(frozen=True)
class ClientId:
    """A client as the aggregation server knows it: its name on the wire and its index."""

    name: str
    index: int


class ServerSide:
    """What the aggregation server holds when it aggregates: the round, the model's public layout, the public
    scenario settings, who the clients are, the cost meter and the channel, never a client's data, model or
    keys (its key material comes as the `server` party). Flower's Strategy hooks get no more."""

    def __init__(self, fed: "Federation"):
        self.round, self.names, self.shapes = fed.round, fed.names, fed.shapes
        self.scenario, self.meter = fed.scenario, fed.meter
        self.clients = tuple(ClientId(c.name, c.index) for c in fed.clients)
        self.send = fed.send


@dataclass
class FederationRun:
    targets: Targets | list[Target]
    knowledge: Knowledge
    metrics: dict[str, Any]
    details: dict[str, Any]
    diverged: str | None = None    # why training stopped early (a non-finite update, loss or model), else None
    # a malicious-model attack's label -> the attacked uploads under the model it sent (bench/federation/exchange.py),
    # or the exception its exchange raised; passive attacks read `targets` only
    modified: dict[str, Any] = field(default_factory=dict)


class Diverged(Exception):
    """Training produced a non-finite value: the run stops at this round (an outcome, not an error)."""

    def __init__(self, round: int, what: str, why: str = "is not finite (NaN or inf)"):
        super().__init__(f"training diverged at round {round}: {what} {why}")
        self.round = round


def require_finite(values: dict[str, torch.Tensor], round: int, what: str) -> None:
    if not all(bool(torch.isfinite(v).all()) for v in values.values() if v.is_floating_point()):
        raise Diverged(round, what)


def set_entries(model: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, value in values.items():
            state[name].copy_(value)
