"""Suite specs: TOML in, frozen validated dataclasses out (one scenario: bench/federation/scenario.py).

A suite is a grid scenarios x defenses x attacks; each point is a Cell whose id is a
stable hash of its full config, so the same config is never computed twice. Every
validation error is one line naming the field, the fault and the closest valid value.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.federation.scenario import Scenario, SpecError, build, check_model_params, check_name, scenario_config
from bench.protocol.records import config_id, setting_label
from bench.run.inherit import base_data, inherit
from bench.run.limits import Limits, check_count, check_depth, check_timeout, read_toml
from bench.run.mistakes import (check_data_fields, check_notes, check_pages, check_track_tables, check_unique,
                                known_names)


@dataclass(frozen=True)
class Component:
    """A named defense or attack with its parameters."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return setting_label(self.name, self.params)


@dataclass(frozen=True)
class Cell:
    suite: str
    scenario: Scenario
    defense: Component
    attack: Component
    # seconds each step of the cell may take (its group's federated run, its attack); a run setting, not part of
    # the work: left out of the config, the id and equality (bench/run/deadline.py)
    timeout_s: float | None = field(default=None, compare=False)

    def config(self) -> dict[str, Any]:
        return {"scenario": scenario_config(self.scenario),
                "defense": dataclasses.asdict(self.defense),
                "attack": dataclasses.asdict(self.attack)}

    @property
    def cell_id(self) -> str:
        """Stable hash of the full config (suite name excluded: the same cell is the same work)."""
        return config_id(self.config())

    @property
    def label(self) -> str:
        """scenario/defense/attack with parameters: what --only matches and failures are listed by."""
        return f"{self.scenario.name}/{self.defense.label}/{self.attack.label}"

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
    paper: tuple[dict, ...] = ()          # numbers a paper reports, shown beside ours (leaderboards/paper.py)
    # (scenario, defense label, reason): grid points a defense cannot apply to (Defense.applicable), left out
    not_applicable: tuple[tuple[str, str, str], ...] = ()
    chance: tuple[tuple[str, float], ...] = ()   # (scenario, 1 / classes) where the task is classification
    unchecked: tuple[str, ...] = ()       # scenarios the load-time checks skipped (no cell selected by --only)
    extends: str = ""                     # the suite whose evaluation this one joins (bench/run/inherit.py)
    added: tuple[str, ...] = ()           # the defense labels it adds to its base's
    tracks: tuple[dict, ...] = ()         # its [[tracks]], checked (bench/evaluation/tracks.py)
    # (scenario, reason): scenarios that measure privacy and cost only, whose pages show no utility (a scenario
    # sized for a cost, e.g. an 8-unit MLP for per-entry Paillier, whose model does not learn the task)
    privacy_only: tuple[tuple[str, str], ...] = ()

    def page_info(self) -> dict[str, Any]:
        """What a page needs beside the records: the notes, and the facts verdicts are judged against (which rows
        are untrained, the n/a grid points, chance accuracy; which row is undefended each record says itself)."""
        from bench.evaluation.tracks import planned
        from bench.registry import DEFENSES

        names = sorted({c.defense.name for c in self.cells} | {d for _, d, _ in self.not_applicable})
        role = {n: (DEFENSES.get(n).reference_row, DEFENSES.get(n).trains) for n in names if n in DEFENSES}
        na: dict[str, dict[str, str]] = {}
        for scenario, defense, reason in self.not_applicable:
            na.setdefault(scenario, {})[defense] = reason
        return {"description": self.description, "notes": self.notes, "figures": list(self.figures),
                "paper": list(self.paper),
                "untrained": [n for n, (ref, trains) in role.items() if ref and not trains],
                "not_applicable": na, "chance": dict(self.chance), "tracks": list(self.tracks),
                "planned": planned(self.cells),
                "privacy_only": dict(self.privacy_only),
                **({"extends": self.extends, "added": list(self.added)} if self.extends else {})}

    @property
    def scenarios(self) -> list[Scenario]:
        seen: dict[str, Scenario] = {}
        for cell in self.cells:
            seen.setdefault(cell.scenario.name, cell.scenario)
        return list(seen.values())


# --------------------------------------------------------------------------- parsing

def _key(value: Any) -> str:
    """Canonical text of parameters, as the cell id hashes them: equal keys, the same work."""
    return json.dumps(value, sort_keys=True, default=str)


def _components(tables: list[dict[str, Any]], kind: str, registry, where: str,
                limit: int) -> tuple[list[Component], dict[int, list[str]]]:
    """Each table: name, params, an optional sweep {param: [values]} expanded as a product, and an optional
    `scenarios` list that confines its settings to those scenarios (returned by position, kept out of the
    component so that cell ids do not see it). Overlapping sweeps name a setting once; a table that adds no
    setting (the same name and params as earlier ones) is a mistake, refused, and so are more settings than
    `limit` (counted before they are expanded)."""
    out: list[Component] = []
    confined: dict[int, list[str]] = {}
    seen: dict[tuple[str, str], int] = {}   # (name, params key) -> the table that named it first
    for i, table in enumerate(tables):
        spot = f"{where} {kind}s[{i}]"
        if not isinstance(table, dict):
            raise SpecError(f"{spot}: must be a table like [[{kind}s]] name = \"...\", "
                            f"got {type(table).__name__} {table!r}")
        unknown = set(table) - {"name", "params", "sweep", "scenarios"}
        if unknown:
            raise SpecError(f"{spot}: unknown key '{sorted(unknown)[0]}'; use name, params, sweep or scenarios")
        only = table.get("scenarios")
        if only is not None and (not isinstance(only, list) or not only or not all(isinstance(v, str) for v in only)):
            raise SpecError(f"{spot}: 'scenarios' must be a non-empty list of scenario names, got {only!r}")
        name = table.get("name")
        if name is None:
            raise SpecError(f"{spot}: missing 'name'; known: {', '.join(registry.names())}")
        if not isinstance(name, str):
            raise SpecError(f"{spot}: 'name' must be a string, got {type(name).__name__} {name!r}")
        if name not in registry:
            raise SpecError(f"{spot}: {registry.unknown(name)}")
        params = table.get("params", {})
        sweep = table.get("sweep", {})
        if not isinstance(params, dict) or not isinstance(sweep, dict):
            raise SpecError(f"{spot}: 'params' and 'sweep' must be tables")
        bad = [k for k, v in sweep.items() if not isinstance(v, list) or not v]
        if bad:
            raise SpecError(f"{spot}: sweep '{bad[0]}' must be a non-empty list, got {sweep[bad[0]]!r}")
        for k, values in sweep.items():
            keys = [_key(v) for v in values]
            if len(set(keys)) < len(keys):
                twice = next(v for v, n in zip(values, keys) if keys.count(n) > 1)
                raise SpecError(f"{spot}: sweep '{k}' lists {twice!r} twice; did you mean "
                                f"{list(dict(zip(keys, values)).values())!r}?")
        keys = sorted(sweep)
        check_count(spot, f"{kind} settings", len(out) + math.prod(len(sweep[k]) for k in keys), limit, "--max-cells")
        new = 0
        for combo in itertools.product(*(sweep[k] for k in keys)):
            merged = {**params, **dict(zip(keys, combo))}
            if (name, _key(merged)) in seen:
                continue
            check = getattr(registry.get(name), "check_params", None)
            if check is not None:
                try:
                    check(merged)
                except Exception as err:   # any constructor failure is a load-time fault of the suite
                    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    raise SpecError(f"{spot} '{name}'{_plugin(registry, name)}: {text}") from None
            seen[(name, _key(merged))] = i
            if only is not None:
                confined[len(out)] = only
            out.append(Component(name, merged))
            new += 1
        if not new:
            first = seen[(name, _key({**params, **{k: sweep[k][0] for k in keys}}))]
            raise SpecError(f"{spot}: names {kind} '{Component(name, params).label}' with the same params as "
                            f"{kind}s[{first}], so it adds no cell; remove it or change its params")
    return out, confined


def _plugin(registry, name: str) -> str:
    """' (plugin DIST VERSION, entry point ...)' when `name` comes from an installed plugin, else ''."""
    origin = registry.entry(name).origin
    return f" ({origin.label})" if origin is not None else ""


def _defense_params(table: Any, registry, where: str) -> dict[str, dict]:
    """A scenario's `defense_params = { name = { param = value } }`: settings that belong to this scenario."""
    if not isinstance(table, dict) or any(not isinstance(v, dict) for v in table.values()):
        raise SpecError(f"{where}: defense_params must be a table of tables, e.g. defense_params.sensecrypt = "
                        "{ ratio_cap = 0.03 }")
    for name in table:
        if name not in registry:
            raise SpecError(f"{where} defense_params: {registry.unknown(name)}")
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
        except Exception as err:   # any constructor failure is a load-time fault of the suite
            text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise SpecError(f"{where} defense_params '{component.name}'{_plugin(registry, component.name)}: {text}") \
                from None
    return Component(component.name, merged)


def _index(components: list[Component]) -> dict[str, list[int]]:
    """Positions of the components by name and by full label "name(k=v, ...)": what a scenario's narrowing
    list may say."""
    index: dict[str, list[int]] = {}
    for pos, c in enumerate(components):
        index.setdefault(c.name, []).append(pos)
        if c.label != c.name:
            index.setdefault(c.label, []).append(pos)
    return index


def _narrowing(table: dict[str, Any], key: str, components: list[Component], index: dict[str, list[int]],
               confined: dict[int, list[str]], where: str) -> list[Component]:
    """A scenario's `defenses`/`attacks` list (each entry names a component of the suite exactly), as the
    components it keeps in suite order; without one, every component not confined to other scenarios."""
    value = table.get(key)
    scenario = table["name"]
    if value is None:
        return [c for pos, c in enumerate(components) if scenario in confined.get(pos, [scenario])]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        raise SpecError(f"{where}: '{key}' must be a non-empty list of names, got {value!r}")
    for entry in value:
        if entry not in index:
            valid = sorted(index)
            close = difflib.get_close_matches(entry, valid, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"the suite's {key}: {', '.join(valid)}"
            raise SpecError(f"{where}: '{key}' names '{entry}', which is not among the suite's {key}; {hint}")
        if not any(scenario in confined.get(pos, [scenario]) for pos in index[entry]):
            raise SpecError(f"{where}: '{key}' names '{entry}', which its own table confines to scenarios "
                            f"{confined[index[entry][0]]}; add '{scenario}' there or drop it from this list")
    return [components[pos] for pos in sorted({pos for entry in value for pos in index[entry]})
            if scenario in confined.get(pos, [scenario])]


TOP_KEYS = ["name", "extends", "description", "notes", "cell_timeout_s", "figures", "paper", "scenarios", "defenses",
            "attacks", "tracks"]
# keys of the table, not the Scenario: they choose or bound its cells, or say how its page reads them, so they are no
# part of a cell's config or id
SCENARIO_ONLY = ("defenses", "attacks", "defense_params", "cell_timeout_s", "privacy_only")


def _head(data: Any, where: str) -> str:
    """The suite's name, after its top-level keys and lists are checked."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: must be a table of name, scenarios, defenses, attacks, got {type(data).__name__}")
    check_depth(where, data)
    unknown = set(data) - set(TOP_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        close = difflib.get_close_matches(key, TOP_KEYS, n=1)
        raise SpecError(f"{where}: unknown key '{key}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    name = data.get("name")
    if name is None:
        raise SpecError(f"{where}: missing 'name'")
    try:
        check_name("suite", name)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None
    for key in ("description", "notes"):
        if key in data and not isinstance(data[key], str):
            raise SpecError(f"{where}: '{key}' must be a string, got {type(data[key]).__name__}")
    for key in ("scenarios", "defenses", "attacks"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise SpecError(f"{where}: needs at least one [[{key}]] table")
    return name


def parse_suite(data: dict[str, Any], source: str = "", limits: Limits | None = None,
                cell_timeout_s: float | None = None) -> Suite:
    """The suite `data` describes, every cell validated. `limits` bounds its scenarios and cells (default:
    Limits.resolve()); `cell_timeout_s` is the time limit of cells whose scenario sets none (default: the
    suite's own `cell_timeout_s`, else none)."""
    from bench.registry import ATTACKS, DATASETS, DEFENSES, MODELS

    where = f"suite {source or '<inline>'}"
    limits = limits or Limits.resolve()
    base = None
    if isinstance(data, dict) and "extends" in data:
        data, base = inherit(data, where, lambda ref: base_data(ref, source, where))
    name = _head(data, where)
    check_count(where, "scenarios", len(data["scenarios"]), limits.scenarios, "--max-scenarios")
    default_timeout = check_timeout(cell_timeout_s, "--cell-timeout") if cell_timeout_s is not None else \
        check_timeout(data.get("cell_timeout_s"), f"{where}: cell_timeout_s")
    scenarios = []
    folded: dict[str, int] = {}   # lower-cased name -> index: names become file names, on case-blind disks too
    for i, table in enumerate(data["scenarios"]):
        spot = f"{where} scenarios[{i}]"
        if not isinstance(table, dict):
            raise SpecError(f"{spot}: must be a table like [[scenarios]] name = \"...\", "
                            f"got {type(table).__name__} {table!r}")
        local = {k: v for k, v in table.items() if k not in SCENARIO_ONLY}
        scenario = build(Scenario, local, spot)
        for registry, value in ((DATASETS, scenario.dataset), (MODELS, scenario.model)):
            if value not in registry:
                raise SpecError(f"{spot}: {registry.unknown(value)}")
        try:
            check_model_params(scenario.model, scenario.model_params)
        except (TypeError, ValueError) as err:
            raise SpecError(f"{spot} model_params{_plugin(MODELS, scenario.model)}: {err}") from None
        check_data_fields(local, scenario.dataset, spot)
        check_unique(scenario.name, i, folded, spot)
        timeout = check_timeout(table.get("cell_timeout_s"), f"{spot}: cell_timeout_s") or default_timeout
        why = table.get("privacy_only")
        if why is not None and (not isinstance(why, str) or not why.strip()):
            raise SpecError(f"{spot}: 'privacy_only' must be text saying why the scenario measures privacy and cost "
                            f"only (its page then shows no utility), got {why!r}")
        scenarios.append((scenario, table, timeout))
    defenses, d_only = _components(data["defenses"], "defense", DEFENSES, where, limits.cells)
    attacks, a_only = _components(data["attacks"], "attack", ATTACKS, where, limits.cells)
    names = [s.name for s, _, _ in scenarios]
    for kind, confined in (("defenses", d_only), ("attacks", a_only)):
        for missing in (n for only in confined.values() for n in only if n not in names):
            close = difflib.get_close_matches(missing, names, n=1)
            raise SpecError(f"{where} {kind}: 'scenarios' names '{missing}', which is no scenario of the suite"
                            + (f"; did you mean '{close[0]}'?" if close else ""))
    by_d, by_a = _index(defenses), _index(attacks)
    plan = []
    for i, (scenario, table, timeout) in enumerate(scenarios):  # narrowing by name or by full label
        spot = f"{where} scenarios[{i}]"
        overrides = _defense_params(table.get("defense_params", {}), DEFENSES, spot)
        chosen = _narrowing(table, "defenses", defenses, by_d, d_only, spot)
        plan.append((scenario, [_override(d, overrides.get(d.name), DEFENSES, spot) for d in chosen],
                     _narrowing(table, "attacks", attacks, by_a, a_only, spot), timeout))
    check_count(where, "cells", sum(len(ds) * len(atts) for _, ds, atts, _ in plan), limits.cells, "--max-cells",
                f" ({len(plan)} scenario(s) x their defenses x attacks)")
    cells, seen = [], set()
    for i, (scenario, ds, atts, timeout) in enumerate(plan):
        keyed = [(a, (a.name, _key(a.params))) for a in atts]
        for d in ds:
            dk = (d.name, _key(d.params))
            for a, ak in keyed:
                if (i, dk, ak) not in seen:   # a scenario's defense_params may make two settings one cell
                    seen.add((i, dk, ak))
                    cells.append(Cell(name, scenario, d, a, timeout))
    known = known_names([s for s, _, _ in scenarios], defenses, attacks)
    figures, paper = tuple(data.get("figures", [])), tuple(data.get("paper", []))
    check_pages(figures, paper, known, where)
    check_notes(str(data.get("notes", "")), cells, name, where)
    tracks = check_track_tables(data.get("tracks"), [s for s, _, _ in scenarios], defenses, where)
    added = ()
    if base is not None:
        inherited = {d.label for d in _components(base["defenses"], "defense", DEFENSES, where, limits.cells)[0]}
        added = tuple(d.label for d in defenses if d.label not in inherited)
    privacy_only = tuple((sc.name, table["privacy_only"].strip()) for sc, table, _ in scenarios
                         if table.get("privacy_only"))
    return Suite(name, str(data.get("description", "")), tuple(cells), source, str(data.get("notes", "")), figures,
                 paper, extends=str(base["name"]) if base is not None else "", added=added, tracks=tracks,
                 privacy_only=privacy_only)


def load_suite(ref: str | Path, limits: Limits | None = None, cell_timeout_s: float | None = None) -> Suite:
    """A built-in suite name or a path to a TOML file (`limits`, `cell_timeout_s`: as parse_suite)."""
    from bench.registry import SUITES

    ref = str(ref)
    if not ref.strip() or "\0" in ref:
        raise SpecError(f"suite {ref!r} is empty or not a valid path; pass a built-in name "
                        f"({', '.join(SUITES.names())}) or a .toml path")
    path = Path(ref)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as err:   # e.g. a name too long for the file system
        raise SpecError(f"suite '{ref[:40]}' cannot be read ({err.strerror}); pass a built-in name or a .toml path") \
            from None
    if path.suffix == ".toml" or exists:
        if is_dir:
            raise SpecError(f"suite '{path}' is a directory; pass a .toml file inside it")
        if not exists:
            raise SpecError(f"suite file '{path}' does not exist; pass a built-in name ({', '.join(SUITES.names())}) "
                            "or an existing .toml path")
        return parse_suite(read_toml(path), str(path), limits, cell_timeout_s)
    try:
        suite_path = SUITES.get(ref)
    except KeyError as err:
        raise SpecError(str(err)) from None
    return parse_suite(read_toml(Path(suite_path)), str(ref), limits, cell_timeout_s)
