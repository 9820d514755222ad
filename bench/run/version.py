"""What a stored result was computed with: the package version and a fingerprint of the code per component.

A cell's numbers depend on the harness (every module bench/run/cells.py imports to compute a cell, and every
metric module, since each metric scores every cell) and on the modules of its own defense, attack, dataset and
model with the project modules those import (a static import closure, bench/run/closure.py: the same in every
process and on every machine), plus every installed plugin that computed it (its defense, attack, dataset or
model, a plugin a parameter names, a plugin metric that computes a value): the plugin's distribution, version and
the hash of its sources. The record keeps each component's hash (`environment.components`) and a fingerprint over
all of them. A stored cell whose fingerprint differs from the running code's is stale and `leakbench run`
recomputes it: editing one attack's module stales that attack's cells, one defense's its rows, the harness
every cell. The leaderboard renderer and the modules that only identify a cell (suite parsing, ids, digests)
are in no component: re-rendering or re-parsing never changes a number, and a change to what a cell runs
changes its config and so its id. `code_fingerprint` (the whole tree) keys caches that any edit invalidates.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
from importlib.metadata import Distribution, entry_points
from pathlib import Path
from typing import Any

from bench.run.closure import closure, module_path, package_modules

ROOT = Path(__file__).resolve().parents[2]   # the folder holding bench/, defenses/, attacks/, metrics/
RESULT_PACKAGES = ("bench", "defenses", "attacks", "metrics")
# where a cell's computation starts: bench/run/cells.py runs the group and scores each attack; every metric module
# scores every cell
HARNESS_ROOTS = ("bench.run.cells",)
PLUGIN_PACKAGES = ("defenses", "attacks")
# imported on the way but only identify, bound or render a cell: a change there changes a cell's config (and
# so its id) or its page, never its numbers
IDENTIFY_ONLY = ("leaderboards", "bench.run.spec", "bench.run.limits", "bench.run.mistakes", "bench.run.leases",
                 "bench.run.version", "bench.run.closure", "bench.protocol.records")
OLDER = "code of before per-component fingerprints"   # what a record without component hashes is stale by
GROUPS = tuple(f"leakbench.{kind}" for kind in ("datasets", "models", "defenses", "attacks", "metrics", "suites"))


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("leakbench")
    except PackageNotFoundError:  # run from a checkout without installing
        return "0+checkout"


@functools.lru_cache(maxsize=None)
def code_fingerprint(root: str = str(ROOT)) -> str:
    """sha256 over (relative path, content) of every .py file of the result packages, 16 hex digits."""
    digest = hashlib.sha256()
    for package in RESULT_PACKAGES:
        for path in sorted(Path(root, package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def plugin_sources(dist: Distribution) -> str:
    """sha256 (16 hex digits) of the .py files of every top-level package or module the distribution's
    leakbench entry points name, found without importing them (an edit changes it; reinstalling does not)."""
    digest = hashlib.sha256()
    tops = sorted({ep.value.split(":")[0].split(".")[0] for ep in dist.entry_points if ep.group in GROUPS})
    for top in tops:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):   # a broken plugin: the registry reports it, its cells cannot run
            spec = None
        if spec is None:
            digest.update(f"{top}: not found\0".encode())
            continue
        if spec.submodule_search_locations:
            files = sorted(p for base in spec.submodule_search_locations for p in Path(base).rglob("*.py"))
            bases = list(spec.submodule_search_locations)
        else:
            files, bases = ([Path(spec.origin)] if spec.origin and Path(spec.origin).is_file() else []), []
        for path in files:
            rel = next((str(path.relative_to(b)) for b in bases if path.is_relative_to(b)), path.name)
            digest.update(f"{top}/{rel}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def installed_plugins() -> dict[str, str]:
    """Every distribution with a leakbench entry point -> "VERSION SOURCE-HASH", without importing any."""
    dists: dict[str, Distribution] = {}
    for group in GROUPS:
        for ep in entry_points(group=group):
            if getattr(ep, "dist", None) is not None:
                dists.setdefault(ep.dist.metadata["Name"], ep.dist)
    return {name: f"{dist.version} {plugin_sources(dist)}" for name, dist in sorted(dists.items())}


def cell_plugins(cell) -> dict[str, str]:
    """The plugins that computed `cell`: distribution -> "VERSION SOURCE-HASH"."""
    from bench.registry import METRICS

    dists = {entry.origin.dist for _, entry in _named(cell) if entry.origin is not None}
    dists |= {e.origin.dist for e in METRICS.entries()   # a metric that reads a run value computes nothing
              if e.origin is not None and not hasattr(e.obj.compute, "reads_run")}
    installed = installed_plugins() if dists else {}
    return {d: installed.get(d, "not installed") for d in sorted(dists)}


def cell_components(cell, plugins: dict[str, str] | None = None, root: str = str(ROOT)) -> dict[str, str]:
    """The hash of each part of the code that computes `cell`: the harness, its defense (with the defenses and
    attacks its parameters name), its attack (likewise), dataset and model, and every plugin taking part."""
    plugins = cell_plugins(cell) if plugins is None else plugins
    parts = {"harness": harness_hash(root)}
    named = _named(cell)
    for role in ("defense", "attack", "dataset", "model"):
        modules = sorted({_module(entry) for r, entry in named if r == role and entry.origin is None})
        parts[role] = component_hash(tuple(modules), root) if modules else "plugin"
    return parts | {f"plugin {dist}": value for dist, value in plugins.items()}


def cell_fingerprint(cell, plugins: dict[str, str] | None = None,
                     components: dict[str, str] | None = None) -> str:
    """One hash over the cell's components (`cell_components`): it changes exactly when one of them does."""
    components = cell_components(cell, plugins) if components is None else components
    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()[:16]


def stale_components(stored: dict[str, str] | None, current: dict[str, str]) -> list[str]:
    """The components whose code differs between a record's stored hashes and today's; a record computed before
    per-component hashes names no component."""
    if not isinstance(stored, dict):
        return [OLDER]
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))


@functools.lru_cache(maxsize=None)
def harness_modules(root: str = str(ROOT)) -> frozenset[str]:
    """The harness: every module a cell's computation imports (bench/run/cells.py's closure) and every metric
    module, outside the plugin packages and the modules that only identify a cell."""
    return closure(Path(root), (*HARNESS_ROOTS, *package_modules(Path(root), "metrics")),
                   stop=(*PLUGIN_PACKAGES, *IDENTIFY_ONLY))


@functools.lru_cache(maxsize=None)
def harness_hash(root: str = str(ROOT)) -> str:
    """sha256 (16 hex digits) of the harness modules' sources; once per process, like `component_hash`: a process
    computes with the code it imported, and a suite's thousands of cells then read the files once, not each."""
    return _hash_modules(root, harness_modules(root))


@functools.lru_cache(maxsize=None)
def component_hash(modules: tuple[str, ...], root: str = str(ROOT)) -> str:
    """sha256 (16 hex digits) of the modules' import closure, less the harness (hashed on its own)."""
    reached = closure(Path(root), modules, stop=IDENTIFY_ONLY) - harness_modules(root)
    return _hash_modules(root, reached)


def _hash_modules(root: str, modules) -> str:
    digest = hashlib.sha256()
    for module in sorted(modules):
        path = module_path(Path(root), module)
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _module(entry) -> str:
    obj = entry.obj
    return obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None) or type(obj).__module__


def _named(cell) -> list[tuple[str, Any]]:
    """(role, registry entry) of everything the cell names: its defense and attack (and any defense or attack a
    parameter of theirs names, e.g. inner=, match_bytes=), its dataset and its model."""
    from bench.registry import ATTACKS, DATASETS, DEFENSES, MODELS

    named = [("defense", DEFENSES, cell.defense.name), ("attack", ATTACKS, cell.attack.name),
             ("dataset", DATASETS, cell.scenario.dataset), ("model", MODELS, cell.scenario.model)]
    for role, params in (("defense", cell.defense.params), ("attack", cell.attack.params)):
        for value in _strings(params):
            name = value.split("(")[0]
            named += [(role, registry, name) for registry in (DEFENSES, ATTACKS) if name in registry]
    return [(role, registry.entry(name)) for role, registry, name in named if name in registry]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def staleness(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each record's stale components against the running code, by cell id: [] where it is fresh; the components
    whose hashes differ (every one, for a record older than per-component hashes); ["config"] where today's
    schema cannot rebuild its cell."""
    from bench.federation.scenario import Scenario
    from bench.run.spec import Cell, Component
    from bench.run.upgrade import upgrade

    out: dict[str, list[str]] = {}
    for rec in records:
        env = rec.get("environment") or {}
        try:
            config = upgrade(rec["config"])
            cell = Cell(rec.get("suite", ""), Scenario(**config["scenario"]), Component(**config["defense"]),
                        Component(**config["attack"]))
            current = cell_components(cell)
        except (TypeError, ValueError, KeyError):   # another schema's config, or a component no longer registered
            out[rec["cell_id"]] = ["config"]
            continue
        if env.get("fingerprint") == cell_fingerprint(cell, components=current):
            out[rec["cell_id"]] = []
        else:
            out[rec["cell_id"]] = stale_components(env.get("components"), current)
    return out
