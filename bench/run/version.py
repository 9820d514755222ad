"""What a stored result was computed with: the package version and a fingerprint of what the cell ran.

A record lists the hash of each component its computation used (`environment.components`) and a fingerprint over
them (`fingerprint_of`, bench/protocol/records.py, which refuses a record whose fingerprint is not that hash):

- `harness`: every module bench/run/cells.py imports to compute a cell and every metric module (each metric
  scores every cell), whole files, a static import closure (bench/run/closure.py);
- one per registry entry the cell used (`defense dp-fedavg`, `defense plaintext`, `attack idlg`, `dataset mnist`,
  `model mlp`): those its config names, those a parameter of theirs names, given or by default (DP-FedAvg's
  `inner = "plaintext"`), and every entry the registries handed out while it computed (bench/registry.py logs
  them). Each is the source of the top-level definitions the registered object reaches, across the project
  modules it imports from, and the statements those modules run at import (`definitions`, bench/run/closure.py),
  less the harness: an edit to one model's factory stales that model's cells, one to CIFAR's reader no MNIST cell;
- `plugin DIST`: an installed plugin that took part (a registry entry of it, or a metric of it that computes):
  its version and the hash of its sources;
- `library NAME`: python, torch, numpy, opacus and tenseal, by public version (a local build tag such as +cpu or
  +cu130 is left out: a CPU and a CUDA wheel of one release compute the same code; the environment keeps the
  full build, the CPU and the numerical settings, bench/run/numerics.py);
- `data KEY`: each data file the cell read, by a digest of its bytes (bench/data/loading.py).

A stored record is current when each component it lists has today's value (`outdated`): the code re-hashed,
the libraries installed, the data files where this machine has them. What a cell uses is decided by the code
of what it used and its config, so a record that lists its components needs no prediction: `leakbench run`
recomputes a stale cell, `leakbench site` names the component that made it stale. The leaderboard renderer and the
modules that only identify a cell (suite parsing, ids, digests) are in no component: re-rendering or re-parsing
never changes a number, and a change to what a cell runs changes its config and so its id. Hashes are computed
once per process (a process computes with the code it imported). `code_fingerprint` (the whole tree) keys caches
that any edit invalidates.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import platform
from importlib.metadata import Distribution, PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any

from bench.protocol.records import fingerprint_of
from bench.run.closure import closure, definitions, definitions_text, module_path, package_modules

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
LIBRARIES = ("torch", "numpy", "opacus", "tenseal")   # and python
OLDER = "code of before per-component fingerprints"   # what a record without component hashes is stale by
GROUPS = tuple(f"leakbench.{kind}" for kind in ("datasets", "models", "defenses", "attacks", "metrics", "suites"))
ROLES = ("dataset", "model", "defense", "attack")      # the registry entries a component key names


def package_version() -> str:
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
    """Every distribution with a leakbench entry point -> "VERSION SOURCE-HASH", without importing any (read each
    time: a plugin reinstalled while a process runs is seen)."""
    dists: dict[str, Distribution] = {}
    for group in GROUPS:
        for ep in entry_points(group=group):
            if getattr(ep, "dist", None) is not None:
                dists.setdefault(ep.dist.metadata["Name"], ep.dist)
    return {name: f"{dist.version} {plugin_sources(dist)}" for name, dist in sorted(dists.items())}


@functools.lru_cache(maxsize=None)
def library_versions() -> dict[str, str]:
    """`library NAME` -> its public version (without a local build tag such as +cu130), python's included."""
    out = {"library python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[f"library {name}"] = version(name).split("+")[0]
        except PackageNotFoundError:
            out[f"library {name}"] = "not installed"
    return out


def _registry(role: str):
    from bench.registry import KINDS
    return KINDS[role + "s"]


def resolved(cell) -> set[tuple[str, str]]:
    """(kind, name) of the registry entries a cell's config resolves to: its dataset, model, defense and attack, and
    every defense or attack a parameter of theirs names, given or by its default, and theirs in turn."""
    from bench.registry import ATTACKS, DEFENSES

    sc = cell.scenario
    out = {("datasets", sc.dataset), ("models", sc.model)}
    todo = [("defenses", cell.defense.name, cell.defense.params), ("attacks", cell.attack.name, cell.attack.params)]
    while todo:
        kind, name, params = todo.pop()
        registry = DEFENSES if kind == "defenses" else ATTACKS
        if (kind, name) in out or name not in registry:
            continue
        out.add((kind, name))
        for value in _strings({**_defaults(kind, name), **params}):
            named = value.split("(")[0]
            todo += [(r.kind, named, {}) for r in (DEFENSES, ATTACKS) if named in r]
    return out


@functools.lru_cache(maxsize=None)
def _defaults(kind: str, name: str) -> dict[str, Any]:
    """The constructor's (a factory's) parameters that have defaults, with them."""
    from bench.registry import KINDS
    obj = KINDS[kind].get(name)
    try:
        signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        return {}
    return {k: p.default for k, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def cell_components(cell, plugins: dict[str, str] | None = None, root: str = str(ROOT),
                    used=None) -> dict[str, str]:
    """The hash of each component that computes `cell` (module docstring): what its config resolves to, and what
    `used` (bench/registry.py's Usage: the entries handed out and the files read while it computed) adds.
    `plugins` replaces the installed plugins' hashes (distribution -> "VERSION SOURCE-HASH")."""
    from bench.registry import METRICS, unlogged

    entries = resolved(cell) | (used.entries if used is not None else set())
    parts, dists = {"harness": harness_hash(root)}, set()
    with unlogged():
        for kind, name in sorted(entries):
            role = kind[:-1]
            if role not in ROLES or name not in _registry(role):
                continue   # a metric (the harness, or its plugin below); a name refused at load
            entry = _registry(role).entry(name)
            if entry.origin is not None:
                parts[f"{role} {name}"] = f"plugin {entry.origin.dist}"
                dists.add(entry.origin.dist)
            else:
                parts[f"{role} {name}"] = entry_hash(role, name, root)
        dists |= {e.origin.dist for e in METRICS.entries()   # a metric that reads a run value computes nothing
                  if e.origin is not None and not hasattr(e.obj.compute, "reads_run")}
    if dists:
        installed = installed_plugins() if plugins is None else plugins
        parts |= {f"plugin {d}": installed.get(d, "not installed") for d in sorted(dists)}
    parts |= library_versions()
    return parts | {f"data {k}": v for k, v in sorted((used.files if used is not None else {}).items())}


def cell_fingerprint(cell, plugins: dict[str, str] | None = None,
                     components: dict[str, str] | None = None) -> str:
    """One hash over the cell's components (`cell_components`): it changes exactly when one of them does."""
    return fingerprint_of(cell_components(cell, plugins) if components is None else components)


def stale_components(stored: dict[str, str] | None, current: dict[str, str]) -> list[str]:
    """The components whose hashes differ between two lists of them; a record computed before per-component
    hashes names no component."""
    if not isinstance(stored, dict):
        return [OLDER]
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))


def current_value(key: str, data_root: Path | None = None, root: str = str(ROOT)) -> str | None:
    """Today's value of a component a record lists: its code hashed now, the installed version, the data file's
    digest on this machine (None where it is not here); "unknown" for a key this code does not make."""
    from bench.registry import unlogged

    role, _, name = key.partition(" ")
    if key == "harness":
        return harness_hash(root)
    if role in ROLES:
        with unlogged():
            if name not in _registry(role):
                return "not registered"
            entry = _registry(role).entry(name)
        return f"plugin {entry.origin.dist}" if entry.origin is not None else entry_hash(role, name, root)
    if role == "plugin":
        return installed_plugins().get(name, "not installed")
    if role == "library":
        return library_versions().get(key, "unknown")
    if role == "data":
        from bench.data.loading import file_digest, find_data
        path = find_data(name, data_root)
        return None if path is None else file_digest(path)
    return "unknown"


def outdated(components: dict[str, str], data_root: Path | None = None, absent: bool = True,
             root: str = str(ROOT), value=None) -> list[str]:
    """The components whose value today differs from the stored one; a data file this machine lacks counts when
    `absent` (a run must recompute what it cannot check), else not (a page cannot tell). `value`: key -> today's
    value, where a caller keeps them for many records."""
    out = []
    for key, stored in sorted(components.items()):
        now = value(key) if value is not None else current_value(key, data_root, root)
        if now != stored and (now is not None or absent):
            out.append(key)
    return out


def moved(env: dict[str, Any] | None, data_root: Path | None = None, absent: bool = True, value=None) -> list[str]:
    """What makes a stored record not the running code's: [OLDER] for a record without component hashes,
    ["fingerprint"] where its fingerprint is not their hash, else the components that differ today (`outdated`)."""
    components = (env or {}).get("components")
    if not isinstance(components, dict):
        return [OLDER]
    if (env or {}).get("fingerprint") != fingerprint_of(components):
        return ["fingerprint"]
    return outdated(components, data_root, absent, value=value)


def is_current(env: dict[str, Any] | None, data_root: Path | None = None) -> bool:
    """Whether a stored record's environment says the running code computed it: its fingerprint is the hash of its
    components and each component is today's (a data file this machine lacks makes it stale)."""
    return not moved(env, data_root)


@functools.lru_cache(maxsize=None)
def harness_modules(root: str = str(ROOT)) -> frozenset[str]:
    """The harness: every module a cell's computation imports (bench/run/cells.py's closure) and every metric
    module, outside the plugin packages and the modules that only identify a cell."""
    return closure(Path(root), (*HARNESS_ROOTS, *package_modules(Path(root), "metrics")),
                   stop=(*PLUGIN_PACKAGES, *IDENTIFY_ONLY))


@functools.lru_cache(maxsize=None)
def harness_hash(root: str = str(ROOT)) -> str:
    """sha256 (16 hex digits) of the harness modules' sources; once per process, like `entry_hash`: a process
    computes with the code it imported, and a suite's thousands of cells then read the files once, not each."""
    digest = hashlib.sha256()
    for module in sorted(harness_modules(root)):
        path = module_path(Path(root), module)
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def entry_hash(role: str, name: str, root: str = str(ROOT)) -> str:
    """sha256 (16 hex digits) of the definitions a built-in registry entry reaches (bench/run/closure.py), less the
    harness and the modules that only identify a cell."""
    from bench.registry import unlogged

    with unlogged():
        obj = _registry(role).get(name)
    module, top = _where(obj)
    harness = harness_modules(root)

    def stop(mod: str) -> bool:
        return mod in harness or any(mod == s or mod.startswith(s + ".") for s in IDENTIFY_ONLY)

    reached = definitions(Path(root), module, top, stop) if module_path(Path(root), module) else {}
    return hashlib.sha256(f"{role} {name}\0".encode() + definitions_text(Path(root), reached)).hexdigest()[:16]


def _where(obj: Any) -> tuple[str, str | None]:
    """(module, top-level name) that defines a registered object (a class, a factory, a closure a factory made);
    None for the name: the whole module (a module registered as such, an object made at import)."""
    if inspect.ismodule(obj):
        return obj.__name__, None
    target = obj if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj)
    qualname = getattr(target, "__qualname__", "")
    top = qualname.split(".")[0]
    return target.__module__, (None if not top or top.startswith("<") else top)


def clear_caches() -> None:
    """Forget every hash computed in this process (a test that edits a copy of the tree)."""
    from bench.run import closure as closures
    for cached in (code_fingerprint, library_versions, harness_modules, harness_hash, entry_hash,
                   _defaults, closures._imports, closures._source):
        cached.cache_clear()


def staleness(records: list[dict[str, Any]], data_root: str | None = None) -> dict[str, list[str]]:
    """Each record's stale components against the running code, by cell id: [] where it is current; the
    components whose value differs (every one, for a record older than per-component hashes; a data file this
    machine lacks is not counted: a page cannot tell); ["config"] where today's schema cannot rebuild its cell."""
    from bench.data.loading import DataError, resolve_data_root
    from bench.federation.scenario import Scenario
    from bench.run.spec import Cell, Component
    from bench.run.upgrade import upgrade

    try:
        where = resolve_data_root(data_root)
    except DataError:
        where = None
    value = functools.lru_cache(maxsize=None)(lambda key: current_value(key, where))   # once per key here
    out: dict[str, list[str]] = {}
    for rec in records:
        env = rec.get("environment") or {}
        try:
            config = upgrade(rec["config"])
            Cell(rec.get("suite", ""), Scenario(**config["scenario"]), Component(**config["defense"]),
                 Component(**config["attack"]))
        except (TypeError, ValueError, KeyError):   # another schema's config, or a component no longer registered
            out[rec["cell_id"]] = ["config"]
            continue
        out[rec["cell_id"]] = moved(env, where, absent=False, value=value)
    return out
