"""What a stored result was computed with: the package version and a fingerprint of the code.

The code fingerprint hashes the source of every package that can change a number (harness,
defenses, attacks, metrics); the leaderboard renderer is left out, since re-rendering never
changes a result. A cell's fingerprint adds every installed plugin that computed it (its
defense, attack, dataset and model when they come from a plugin, a plugin a parameter names,
and every plugin metric that computes a value, since it scores every cell): the plugin's distribution, version and the
hash of its sources. A cell computed by built-ins alone carries the code fingerprint itself. A
stored cell whose fingerprint differs from the running code's is stale: `leakbench run`
recomputes it, so editing a plugin recomputes exactly the cells it took part in.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from importlib.metadata import Distribution, entry_points
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]   # the folder holding bench/, defenses/, attacks/, metrics/
RESULT_PACKAGES = ("bench", "defenses", "attacks", "metrics")
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
    from bench.registry import ATTACKS, DATASETS, DEFENSES, METRICS, MODELS

    named = [(DEFENSES, cell.defense.name), (ATTACKS, cell.attack.name), (DATASETS, cell.scenario.dataset),
             (MODELS, cell.scenario.model)]
    for value in _strings(cell.defense.params) + _strings(cell.attack.params):   # e.g. inner=, match_bytes=
        name = value.split("(")[0]
        named += [(registry, name) for registry in (DEFENSES, ATTACKS) if name in registry]
    dists = {registry.entry(name).origin.dist for registry, name in named
             if name in registry and registry.entry(name).origin is not None}
    dists |= {e.origin.dist for e in METRICS.entries()   # a metric that reads a run value computes nothing
              if e.origin is not None and not hasattr(e.obj.compute, "reads_run")}
    installed = installed_plugins() if dists else {}
    return {d: installed.get(d, "not installed") for d in sorted(dists)}


def cell_fingerprint(cell, plugins: dict[str, str] | None = None) -> str:
    """The code fingerprint, combined with the plugins that computed the cell when there are any."""
    plugins = cell_plugins(cell) if plugins is None else plugins
    if not plugins:
        return code_fingerprint()
    blob = json.dumps({"code": code_fingerprint(), "plugins": plugins}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []
