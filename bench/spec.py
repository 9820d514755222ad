"""Scenario and suite specs: TOML in, frozen validated dataclasses out.

A suite is a grid scenarios x defenses x attacks; each point is a Cell whose id is a
stable hash of its full config, so the same config is never computed twice. Every
validation error is one line naming the field, the fault and the closest valid value.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """A suite or scenario file that cannot be run; the message is the one-line fix."""


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
    seq_len: int = 32                 # text only
    seed: int = 0
    public_fraction: float = 0.0      # held out from every client, for a warm start
    pretrain_epochs: int = 0          # central training on the public split before round one
    delta: float = 1e-5               # DP delta at which epsilon is reported
    # attack setting: which upload the honest-but-curious server attacks
    attack_round: int = 0
    attack_client: int = 0
    attack_batch_size: int = 1
    attack_update: str = "gradient"   # gradient (one FedSGD step, the attack papers' setting) | delta (local training)
    attack_repeats: int = 1           # independent attacked batches (e.g. 10 images for iDLG)
    labels_known: bool = False        # threat-model knob: the attacker is told the batch's labels
    # membership inference (bench/membership.py): candidates and the attacker's auxiliary data
    mia_size: int = 0                 # members and as many held-out non-members; 0 = no membership evaluation
    mia_members: str = "all"          # all (the federation's training data) | client (the attacked client's)
    mia_aux: int = 0                  # auxiliary held-out samples the attacker holds, disjoint from both
    # devices (bench/devices.py): a catalog, how clients take its types, or one type per client
    devices: str = "uniform"
    device_assign: str = "cycle"      # cycle | by-category | mix
    device_types: list | None = None

    def __post_init__(self) -> None:
        _check_choice("partition", self.partition, ("iid", "dirichlet", "k-classes"))
        _check_choice("attack_update", self.attack_update, ("gradient", "delta"))
        _check_choice("sampling", self.sampling, ("fixed", "poisson"))
        _check_choice("mia_members", self.mia_members, ("all", "client"))
        if self.mia_size < 0 or self.mia_aux < 0:
            raise SpecError(f"scenario '{self.name}': mia_size and mia_aux must be >= 0")
        if not 0.0 <= self.public_fraction < 1.0:
            raise SpecError(f"scenario '{self.name}': public_fraction must be in [0, 1), got {self.public_fraction}")
        for name in ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size",
                     "attack_batch_size", "attack_repeats", "seq_len"):
            if getattr(self, name) < 1:
                raise SpecError(f"scenario '{self.name}': {name} must be >= 1, got {getattr(self, name)}")
        if self.clients_per_round > self.num_clients:
            raise SpecError(f"scenario '{self.name}': clients_per_round ({self.clients_per_round}) exceeds "
                            f"num_clients ({self.num_clients}); lower it to at most {self.num_clients}")
        if not 0 <= self.attack_round < self.rounds:
            raise SpecError(f"scenario '{self.name}': attack_round must be in [0, {self.rounds - 1}], "
                            f"got {self.attack_round}")
        if not 0 <= self.attack_client < self.num_clients:
            raise SpecError(f"scenario '{self.name}': attack_client must be in [0, {self.num_clients - 1}]")
        from bench import devices
        try:
            devices.check(self.devices, self.device_assign, self.device_types, self.num_clients)
        except ValueError as err:
            raise SpecError(f"scenario '{self.name}': {err}") from None
        if self.lr <= 0 or self.alpha <= 0 or not 0 < self.delta < 1:
            raise SpecError(f"scenario '{self.name}': lr and alpha must be > 0 and delta in (0, 1)")


@dataclass(frozen=True)
class Component:
    """A named defense or attack with its parameters."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        return self.name + "(" + ", ".join(f"{k}={v}" for k, v in sorted(self.params.items())) + ")"


@dataclass(frozen=True)
class Cell:
    suite: str
    scenario: Scenario
    defense: Component
    attack: Component

    def config(self) -> dict[str, Any]:
        return {"scenario": dataclasses.asdict(self.scenario),
                "defense": dataclasses.asdict(self.defense),
                "attack": dataclasses.asdict(self.attack)}

    @property
    def cell_id(self) -> str:
        """Stable hash of the full config (suite name excluded: the same cell is the same work)."""
        blob = json.dumps(self.config(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def group_key(self) -> tuple[str, str]:
        """Cells sharing scenario and defense share one federated run."""
        return (self.scenario.name, json.dumps(dataclasses.asdict(self.defense), sort_keys=True, default=str))


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    cells: tuple[Cell, ...]
    source: str = ""
    notes: str = ""                       # shown on the suite's leaderboard page
    figures: tuple[dict, ...] = ()        # curves drawn from its records (leaderboards/figures.py)

    def page_info(self) -> dict[str, Any]:
        return {"description": self.description, "notes": self.notes, "figures": list(self.figures)}

    @property
    def scenarios(self) -> list[Scenario]:
        seen: dict[str, Scenario] = {}
        for cell in self.cells:
            seen.setdefault(cell.scenario.name, cell.scenario)
        return list(seen.values())


# --------------------------------------------------------------------------- parsing

def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
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


def _components(tables: list[dict[str, Any]], kind: str, registry, where: str) -> list[Component]:
    """Each table: name, params, and an optional sweep {param: [values]} expanded as a product."""
    out: list[Component] = []
    for i, table in enumerate(tables):
        spot = f"{where} {kind}[{i}]"
        unknown = set(table) - {"name", "params", "sweep"}
        if unknown:
            raise SpecError(f"{spot}: unknown key '{sorted(unknown)[0]}'; use name, params or sweep")
        name = table.get("name")
        if not isinstance(name, str):
            raise SpecError(f"{spot}: missing 'name'")
        if name not in registry:
            from bench.registry import UnknownName
            raise SpecError(f"{spot}: {UnknownName(kind, name, registry.names())}")
        params = table.get("params", {})
        sweep = table.get("sweep", {})
        if not isinstance(params, dict) or not isinstance(sweep, dict):
            raise SpecError(f"{spot}: 'params' and 'sweep' must be tables")
        if any(not isinstance(v, list) or not v for v in sweep.values()):
            raise SpecError(f"{spot}: every sweep value must be a non-empty list")
        keys = sorted(sweep)
        for combo in itertools.product(*(sweep[k] for k in keys)):
            merged = {**params, **dict(zip(keys, combo))}
            check = getattr(registry.get(name), "check_params", None)
            if check is not None:
                try:
                    check(merged)
                except (TypeError, ValueError) as err:
                    raise SpecError(f"{spot} '{name}': {err}") from None
            out.append(Component(name, merged))
    return out


def _defense_params(table: Any, registry, where: str) -> dict[str, dict]:
    """A scenario's `defense_params = { name = { param = value } }`: settings that belong to this scenario."""
    if not isinstance(table, dict) or any(not isinstance(v, dict) for v in table.values()):
        raise SpecError(f"{where}: defense_params must be a table of tables, e.g. defense_params.sensecrypt = "
                        "{ ratio_cap = 0.03 }")
    for name in table:
        if name not in registry:
            from bench.registry import UnknownName
            raise SpecError(f"{where} defense_params: {UnknownName('defense', name, registry.names())}")
    return table


def _override(component: Component, params: dict | None, registry, where: str) -> Component:
    """The component with a scenario's own parameters laid over the suite's, validated again."""
    if not params:
        return component
    merged = {**component.params, **params}
    check = getattr(registry.get(component.name), "check_params", None)
    if check is not None:
        try:
            check(merged)
        except (TypeError, ValueError) as err:
            raise SpecError(f"{where} defense_params '{component.name}': {err}") from None
    return Component(component.name, merged)


def parse_suite(data: dict[str, Any], source: str = "") -> Suite:
    from bench.registry import ATTACKS, DATASETS, DEFENSES, MODELS

    where = f"suite {source or '<inline>'}"
    top = ["name", "description", "notes", "figures", "scenarios", "defenses", "attacks"]
    unknown = set(data) - set(top)
    if unknown:
        key = sorted(unknown)[0]
        close = difflib.get_close_matches(key, top, n=1)
        raise SpecError(f"{where}: unknown key '{key}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    name = data.get("name")
    if not isinstance(name, str):
        raise SpecError(f"{where}: missing 'name'")
    for key in ("scenarios", "defenses", "attacks"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise SpecError(f"{where}: needs at least one [[{key}]] table")
    scenarios = []
    for i, table in enumerate(data["scenarios"]):
        local = {k: v for k, v in table.items() if k not in ("defenses", "attacks", "defense_params")}
        scenario = build(Scenario, local, f"{where} scenarios[{i}]")
        for kind, registry, value in (("dataset", DATASETS, scenario.dataset), ("model", MODELS, scenario.model)):
            if value not in registry:
                from bench.registry import UnknownName
                raise SpecError(f"{where} scenarios[{i}]: {UnknownName(kind, value, registry.names())}")
        scenarios.append((scenario, table))
    names = [s.name for s, _ in scenarios]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: scenario names must be unique")
    defenses = _components(data["defenses"], "defense", DEFENSES, where)
    attacks = _components(data["attacks"], "attack", ATTACKS, where)
    cells = []
    for i, (scenario, table) in enumerate(scenarios):  # narrow the grid by name or full label "name(k=v, ...)"
        only_d = table.get("defenses")
        only_a = table.get("attacks")
        overrides = _defense_params(table.get("defense_params", {}), DEFENSES, f"{where} scenarios[{i}]")
        for d in defenses:
            if only_d is not None and d.name not in only_d and d.label not in only_d:
                continue
            d = _override(d, overrides.get(d.name), DEFENSES, f"{where} scenarios[{i}]")
            for a in attacks:
                if only_a is not None and a.name not in only_a and a.label not in only_a:
                    continue
                cell = Cell(name, scenario, d, a)
                if cell not in cells:  # overlapping sweeps name the same cell once
                    cells.append(cell)
    from leaderboards.figures import check_figure
    figures = tuple(data.get("figures", []))
    for i, fig in enumerate(figures):
        try:
            check_figure(fig)
        except ValueError as err:
            raise SpecError(f"{where} figures[{i}]: {err}") from None
    return Suite(name, str(data.get("description", "")), tuple(cells), source, str(data.get("notes", "")), figures)


def load_suite(ref: str | Path) -> Suite:
    """A built-in suite name or a path to a TOML file."""
    from bench.registry import SUITES

    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise SpecError(f"suite file '{path}' does not exist; pass a built-in name ({', '.join(SUITES.names())}) "
                            "or an existing .toml path")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise SpecError(f"suite file '{path}' is not valid TOML: {err}") from None
        return parse_suite(data, str(path))
    try:
        suite_path = SUITES.get(str(ref))
    except KeyError as err:
        raise SpecError(str(err)) from None
    return parse_suite(tomllib.loads(Path(suite_path).read_text()), str(ref))
