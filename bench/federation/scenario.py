"""One scenario: the data, model, clients, training and attack setting of a federated run.

`Scenario` validates itself on construction; `build` turns a TOML table into it (or any
frozen dataclass) with one-line errors naming the field, the fault and the closest valid
value. Suites (bench/run/spec.py) are grids of scenarios x defenses x attacks.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from bench.protocol.records import NAME_RE   # a suite's or scenario's name, checked again when a record is read


class SpecError(ValueError):
    """A suite or scenario file that cannot be run; the message is the one-line fix."""


MAX_SEED = 2**32 - 1
# a field added once cells were stored under ids that hash every field: left out of a cell's config while it holds
# its default, so those cells keep their ids (scenario_config)
OMITTED_AT_DEFAULT = "omitted at default"
FLOAT32_MAX = 3.4028234663852886e38


def check_name(kind: str, value: Any) -> str:
    """Suite and scenario names become file names: 1..64 of [A-Za-z0-9._+-], not starting with '.', no '..'."""
    if not isinstance(value, str):
        raise SpecError(f"{kind} name must be a string, got {type(value).__name__} {value!r}")
    if NAME_RE.fullmatch(value) and ".." not in value:
        return value
    near = re.sub(r"\.\.+", ".", re.sub(r"[^A-Za-z0-9._+-]+", "-", value)).strip(".-_+")[:64].strip(".-_+")
    hint = f"did you mean '{near}'?" if near else "e.g. 'my-suite'"
    shown = value if len(value) <= 40 else value[:37] + "..."
    raise SpecError(f"{kind} name {shown!r} is not a safe file name (1-64 of A-Z a-z 0-9 . _ + -, "
                    f"not starting with '.', no '..'); {hint}")


@dataclass(frozen=True)
class Scenario:
    """Data, model, clients, training and the attack setting of one federated run."""

    name: str
    dataset: str
    model: str
    model_params: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 4
    clients_per_round: int = 4
    partition: str = "iid"            # iid | dirichlet | k-classes
    alpha: float = 0.5                # Dirichlet concentration
    classes_per_client: int = 2       # for k-classes
    rounds: int = 2
    sampling: str = "fixed"           # fixed (clients_per_round each round) | poisson (q = clients_per_round/num_clients)
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.1
    max_train: int | None = None      # subsample the training set (seeded) to keep runs small
    max_test: int | None = None
    seq_len: int = field(default=32, metadata={"data": "text"})   # text only: set on image data, refused
    seed: int = 0
    public_fraction: float = 0.0      # held out from every client, for a warm start
    pretrain_epochs: int = 0          # central training on the public split before round one
    delta: float = 1e-5               # DP delta at which epsilon is reported
    # the server optimizer (Reddi et al. 2021; McMahan et al. 2018's server momentum): the decoded mean update is a
    # pseudo-gradient, m = server_momentum * m + update, parameters += server_lr * m; (1, 0) is FedAvg
    server_lr: float = field(default=1.0, metadata={"config": OMITTED_AT_DEFAULT})
    server_momentum: float = field(default=0.0, metadata={"config": OMITTED_AT_DEFAULT})
    # attack setting: which upload the honest-but-curious server attacks
    attack_round: int = 0
    attack_client: int = 0
    attack_batch_size: int = 1
    attack_update: str = "gradient"   # gradient (one FedSGD step, the attack papers' setting) | delta (local training)
    attack_repeats: int = 1           # independent attacked batches (e.g. 10 images for iDLG)
    labels_known: bool = False        # threat-model knob: the attacker is told the batch's labels
    canary: str = "none"              # audit trials (bench/federation/canary.py): each attacked repeat holds a
                                      # canary or not, by a fair seeded coin: none | gradient | mislabeled; or
                                      # one-run: `canaries` gradient canaries in the one attacked upload, each
                                      # in or out by its own coin
    canary_norm: float = 10.0         # a gradient canary's update norm (above any clip, so a DP clip binds);
                                      # one-run: the norm of all its canaries together
    canaries: int = 1000              # one-run: how many canaries the attacked upload holds
    # membership inference (bench/federation/candidates.py): candidates and the attacker's auxiliary data
    mia_size: int | None = None       # members and as many held-out non-members; unset: membership attacks get
                                      # bench/federation/candidates.py's default pool (500, bounded by the data); 0: none
    mia_members: str = "all"          # all (the federation's training data) | client (the attacked client's)
    mia_aux: int = 0                  # auxiliary held-out samples the attacker holds, disjoint from both
    # devices (bench/federation/client_devices.py): a catalog, how clients take its types, or one type per client
    devices: str = "uniform"
    device_assign: str = "cycle"      # cycle | by-category | mix
    device_types: list | None = None

    def __post_init__(self) -> None:
        check_name("scenario", self.name)
        for key in ("lr", "alpha", "delta", "public_fraction", "server_lr", "server_momentum"):
            if not math.isfinite(getattr(self, key)):
                raise SpecError(f"scenario '{self.name}': {key} must be finite, got {getattr(self, key)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise SpecError(f"scenario '{self.name}': seed must be in [0, {MAX_SEED}], got {self.seed}; "
                            f"did you mean {min(max(self.seed, 0), MAX_SEED)}?")
        for key in ("max_train", "max_test"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise SpecError(f"scenario '{self.name}': {key} must be >= 1 or left out (whole split), "
                                f"got {getattr(self, key)}; did you mean 1?")
        check_choice("partition", self.partition, ("iid", "dirichlet", "k-classes"))
        check_choice("attack_update", self.attack_update, ("gradient", "delta"))
        check_choice("sampling", self.sampling, ("fixed", "poisson"))
        check_choice("mia_members", self.mia_members, ("all", "client"))
        check_choice("canary", self.canary, ("none", "gradient", "mislabeled", "one-run"))
        if not (math.isfinite(self.canary_norm) and self.canary_norm > 0):
            raise SpecError(f"scenario '{self.name}': canary_norm must be a finite number > 0, got {self.canary_norm}")
        self._check_one_run()
        if (self.mia_size or 0) < 0 or self.mia_aux < 0:
            raise SpecError(f"scenario '{self.name}': mia_size and mia_aux must be >= 0")
        if not 0.0 <= self.public_fraction < 1.0:
            raise SpecError(f"scenario '{self.name}': public_fraction must be in [0, 1), got {self.public_fraction}")
        for name in ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size",
                     "attack_batch_size", "attack_repeats", "seq_len"):
            if getattr(self, name) < 1:
                raise SpecError(f"scenario '{self.name}': {name} must be >= 1, got {getattr(self, name)}; "
                                f"did you mean 1?")
        if self.clients_per_round > self.num_clients:
            raise SpecError(f"scenario '{self.name}': clients_per_round ({self.clients_per_round}) exceeds "
                            f"num_clients ({self.num_clients}); lower it to at most {self.num_clients}")
        if not 0 <= self.attack_round < self.rounds:
            raise SpecError(f"scenario '{self.name}': attack_round must be in [0, {self.rounds - 1}], "
                            f"got {self.attack_round}")
        if not 0 <= self.attack_client < self.num_clients:
            raise SpecError(f"scenario '{self.name}': attack_client must be in [0, {self.num_clients - 1}], "
                            f"got {self.attack_client}")
        from bench.federation import client_devices
        try:
            client_devices.check(self.devices, self.device_assign, self.device_types, self.num_clients)
        except ValueError as err:
            raise SpecError(f"scenario '{self.name}': {err}") from None
        for key in ("lr", "alpha"):
            if getattr(self, key) <= 0:
                raise SpecError(f"scenario '{self.name}': {key} must be > 0, got {getattr(self, key)}")
        if self.lr > FLOAT32_MAX:   # updates are float32: lr * gradient would be inf before training starts
            raise SpecError(f"scenario '{self.name}': lr {self.lr:g} exceeds the largest float32 ({FLOAT32_MAX:.3g}); "
                            "model updates are float32, use a learning rate such as 0.1")
        if not self.server_lr > 0 or not 0 <= self.server_momentum < 1:
            raise SpecError(f"scenario '{self.name}': server_lr must be > 0 and server_momentum in [0, 1), got "
                            f"{self.server_lr} and {self.server_momentum}; FedAvg is server_lr = 1, server_momentum = 0")
        if not 0 < self.delta < 1:
            raise SpecError(f"scenario '{self.name}': delta must be in (0, 1), got {self.delta}")
        if self.pretrain_epochs < 0:
            raise SpecError(f"scenario '{self.name}': pretrain_epochs must be >= 0, got {self.pretrain_epochs}")
        if self.classes_per_client < 1:
            raise SpecError(f"scenario '{self.name}': classes_per_client must be >= 1, "
                            f"got {self.classes_per_client}; did you mean 1?")

    def _check_one_run(self) -> None:
        default = next(f.default for f in dataclasses.fields(self) if f.name == "canaries")
        if self.canary != "one-run":
            if self.canaries != default:
                raise SpecError(f"scenario '{self.name}': canaries counts the canaries of a one-run audit; set "
                                f"canary = \"one-run\" or leave canaries out")
            return
        if self.canaries < 2:
            raise SpecError(f"scenario '{self.name}': a one-run audit needs canaries >= 2, got {self.canaries}")
        if self.attack_repeats != 1:
            raise SpecError(f"scenario '{self.name}': a one-run audit plants its canaries in one attacked upload; "
                            f"set attack_repeats = 1 (got {self.attack_repeats})")


def scenario_config(sc: Scenario) -> dict[str, Any]:
    """The scenario as a cell's config holds it (its id hashes it): every field, but those marked OMITTED_AT_DEFAULT
    while they hold their default, so a field added later leaves the ids of cells that do not use it unchanged."""
    out = dataclasses.asdict(sc)
    for f in dataclasses.fields(sc):
        if f.metadata.get("config") == OMITTED_AT_DEFAULT and out[f.name] == f.default:
            del out[f.name]
    return out


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"choose one of {', '.join(choices)}"
        raise SpecError(f"{name} '{value}' is not valid; {hint}")


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if origin is list or annotation is list:
        return isinstance(value, list)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def build(cls: type, data: dict[str, Any], where: str) -> Any:
    """Validate a TOML table into a frozen dataclass: unknown keys, bad types, missing fields."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(fields)}"
            raise SpecError(f"{where}: unknown key '{key}'; {hint}")
        if not _type_ok(value, hints[key]):
            expected = getattr(hints[key], "__name__", str(hints[key]))
            raise SpecError(f"{where}: '{key}' must be {expected}, got {type(value).__name__} {value!r}")
    missing = [n for n, f in fields.items() if n not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SpecError(f"{where}: missing required key '{missing[0]}'")
    value = dict(data)
    if cls is Scenario:
        value = {k: (float(v) if hints[k] is float and isinstance(v, int) else v) for k, v in value.items()}
    try:
        return cls(**value)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None


def check_model_params(model: str, params: dict[str, Any]) -> None:
    """Model keyword arguments exist and have their default's type (the first argument is the dataset)."""
    from bench.protocol.configurable import check_kwargs
    from bench.registry import MODELS

    fn = MODELS.get(model)
    first = next(iter(__import__("inspect").signature(fn).parameters), None)
    check_kwargs(fn, params, skip=(first,) if first else ())
