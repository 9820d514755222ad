"""One small generic registry type, one instance per kind of pluggable thing.

Built-ins register themselves with a decorator in the module that defines them;
outside packages add theirs through entry points (group ``leakbench.<kind>``).
Unknown names fail with the known names and the closest match, so a typo in a
suite file is a one-line fix.

A plugin is checked against its kind's contract when it loads (the check lives with the
contract, named here as "module:function" so this lowest room imports nothing above it).
A plugin that cannot be imported or breaks its contract is refused, not fatal: every other
component keeps working, `refusals()` lists one line per refused plugin, and looking up
its name raises PluginError with that line.

While a computation runs inside `using()`, every entry a registry hands out is logged, and so is every data
file a loader reads (`note_file`, bench/data/loading.py): a cell's record names what its computation
resolved, defaults and nested components included (bench/run/version.py hashes each).
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    """Raised for a name no registry entry has; str() is a one-line fix hint."""

    def __init__(self, kind: str, name: str, known: list[str]):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known) or 'none'}"
        self.message = f"unknown {kind} '{name}'; {hint}"
        self._args = (kind, name, list(known))
        super().__init__(self.message)

    def __reduce__(self):
        """Rebuilt from its arguments: raised in a pool worker, it must reach the driver as itself (an
        unpicklable exception breaks the whole pool)."""
        return (type(self), self._args)

    def __str__(self) -> str:
        return self.message


class PluginError(Exception):
    """A plugin refused at load (import error or contract violation); str() names it and the fix."""


@dataclass(frozen=True)
class Origin:
    """Where a plugin comes from: its distribution and the entry point that loaded it."""

    dist: str
    version: str
    group: str
    entry_point: str    # "name = module:attr"

    @classmethod
    def of(cls, ep: EntryPoint) -> "Origin":
        dist = getattr(ep, "dist", None)
        name = dist.metadata["Name"] if dist is not None else "an unknown distribution"
        return cls(name, dist.version if dist is not None else "?", ep.group, f"{ep.name} = {ep.value}")

    @property
    def label(self) -> str:
        return f"plugin {self.dist} {self.version}, entry point {self.group}: {self.entry_point}"


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str
    origin: Origin | None = None   # None: built into LeakBench


_loading: Origin | None = None   # the entry point being imported: what it registers is its plugin's


@dataclass
class Usage:
    """What a computation used: (kind, name) of each entry the registries handed out, and each data file it read
    (key -> digest)."""

    entries: set[tuple[str, str]] = field(default_factory=set)
    files: dict[str, str] = field(default_factory=dict)


_usages: list[Usage] = []   # the logs open now, outermost first
_quiet = 0                  # > 0: look-ups that decide nothing of the cell being logged (`unlogged`)


@contextmanager
def using(start: Usage | None = None) -> Iterator[Usage]:
    """Log what the registries hand out and the files loaders read inside the block (into every log open),
    starting from `start` (a group's federated run, shared by its cells)."""
    usage = Usage(set(start.entries), dict(start.files)) if start is not None else Usage()
    _usages.append(usage)
    try:
        yield usage
    finally:
        _usages.remove(usage)


@contextmanager
def unlogged() -> Iterator[None]:
    """Look-ups inside the block are not logged: they serve the other cells of a group, not this one."""
    global _quiet
    _quiet += 1
    try:
        yield
    finally:
        _quiet -= 1


def in_use() -> Usage | None:
    """The innermost open log, if any."""
    return _usages[-1] if _usages else None


def note_file(key: str, digest: str) -> None:
    """A data file the running computation read (its key and digest: bench/data/loading.py)."""
    for usage in _usages:
        usage.files[key] = digest


class Registry(Generic[T]):
    """Name -> object map with decorator registration and entry-point discovery."""

    def __init__(self, kind: str, group: str | None = None, contract: str | None = None):
        self.kind = kind
        self.group = group or f"leakbench.{kind}"
        self.contract = contract           # "module:function" -> fault string or None, for plugins
        self._entries: dict[str, Entry[T]] = {}
        self.refused: dict[str, str] = {}  # name -> one-line reason

    @property
    def singular(self) -> str:
        return self.kind[:-1] if self.kind.endswith("s") else self.kind

    def register(self, name: str, description: str | None = None) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            self.add(name, obj, description)
            return obj

        return decorate

    def add(self, name: str, obj: T, description: str | None = None, origin: Origin | None = None) -> None:
        origin = origin or (self._attribute(name, _loading) if _loading is not None else None)
        if name in self._entries and self._entries[name].obj is not obj:
            if origin is not None:   # a plugin may not shadow a built-in or another plugin
                taken = self._entries[name].origin
                self._refuse(name, origin, f"the name '{name}' is taken by "
                                           f"{taken.label if taken else 'a built-in ' + self.singular}; "
                                           f"rename the entry point")
                return
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        if origin is not None and self.contract is not None:
            fault = _resolve(self.contract)(obj)
            if fault is not None:
                self._refuse(name, origin, fault)
                return
        doc = description or (getattr(obj, "__doc__", None) or "").strip().splitlines()
        if isinstance(doc, list):
            doc = doc[0] if doc else ""
        self._entries[name] = Entry(name, obj, doc, origin)

    def _attribute(self, name: str, loading: Origin) -> Origin:
        """What a plugin's module registers while another of its entry points imports it belongs to the
        distribution's entry point of this kind and name, when it has one."""
        for ep in entry_points(group=self.group, name=name):
            if getattr(ep, "dist", None) is not None and ep.dist.metadata["Name"] == loading.dist:
                return Origin.of(ep)
        return loading

    def _refuse(self, name: str, origin: Origin, reason: str) -> None:
        self.refused[name] = f"{self.singular} '{name}' ({origin.label}) refused: {reason}"

    def get(self, name: str) -> T:
        discover()
        try:
            obj = self._entries[name].obj
        except KeyError:
            raise self.unknown(name) from None
        if _usages and not _quiet:
            for usage in _usages:
                usage.entries.add((self.kind, name))
        return obj

    def unknown(self, name: str) -> Exception:
        """The error for a name with no entry: the plugin's refusal when one was refused under it."""
        discover()
        if name in self.refused:
            return PluginError(self.refused[name])
        return UnknownName(self.singular, name, self.names())

    def entry(self, name: str) -> Entry[T]:
        """The named entry (its object and one-line description)."""
        self.get(name)
        return self._entries[name]

    def names(self) -> list[str]:
        discover()
        return sorted(self._entries)

    def builtins(self) -> list[str]:
        """Names built into LeakBench, whatever plugins are installed."""
        discover()
        return sorted(n for n, e in self._entries.items() if e.origin is None)

    def entries(self) -> Iterator[Entry[T]]:
        discover()
        for name in sorted(self._entries):
            yield self._entries[name]

    def entry(self, name: str) -> Entry[T]:
        self.get(name)
        return self._entries[name]

    def entry_of(self, obj: Any) -> Entry[T] | None:
        """The entry registered for `obj` (an object, or the class of an instance), if any."""
        discover()
        for entry in self._entries.values():
            if entry.obj is obj or entry.obj is type(obj):
                return entry
        return None

    def __contains__(self, name: str) -> bool:
        discover()
        return name in self._entries

    def load_entry_points(self) -> None:
        """Objects are added under the entry point's name; a module entry point registers its own.
        A plugin that fails to import is refused with its one-line error; the rest load."""
        global _loading
        for ep in sorted(entry_points(group=self.group), key=lambda e: e.name):
            origin = Origin.of(ep)
            _loading = origin
            try:
                obj = ep.load()
            except Exception as err:   # reported by refusals() and by any lookup of the name
                _forget(origin)
                text = str(err).strip().splitlines()[0] if str(err).strip() else ""
                self._refuse(ep.name, origin, f"cannot be imported: {type(err).__name__}"
                                              f"{': ' + text if text else ''}; fix or uninstall {origin.dist}")
                continue
            finally:
                _loading = None
            existing = self._entries.get(ep.name)
            if inspect.ismodule(obj) or (existing is not None and existing.obj is obj) or _registered_elsewhere(obj):
                continue   # the plugin's module registered it itself (a decorator, @bench.metric)
            self.add(ep.name, obj, origin=origin)

    def forget_plugins(self) -> None:
        self._entries = {n: e for n, e in self._entries.items() if e.origin is None}
        self.refused.clear()


def _registered_elsewhere(obj: Any) -> bool:
    """An object a module already registered under a name of its own (a decorated class, a @bench.metric function)."""
    return any(e.obj is obj or getattr(e.obj, "compute", None) is obj
               for r in KINDS.values() for e in r._entries.values())


def _forget(origin: Origin) -> None:
    """Drop what a plugin registered before its import failed: nothing of a refused plugin stays."""
    for registry in KINDS.values():
        registry._entries = {n: e for n, e in registry._entries.items() if e.origin != origin}


def _resolve(ref: str) -> Callable[[Any], str | None]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_CONTRACTS = "bench.protocol.contracts"
DATASETS: Registry[Any] = Registry("datasets", contract=f"{_CONTRACTS}:check_dataset")
MODELS: Registry[Any] = Registry("models", contract=f"{_CONTRACTS}:check_model")
DEFENSES: Registry[Any] = Registry("defenses", contract=f"{_CONTRACTS}:check_defense")
ATTACKS: Registry[Any] = Registry("attacks", contract=f"{_CONTRACTS}:check_attack")
METRICS: Registry[Any] = Registry("metrics", contract=f"{_CONTRACTS}:check_metric")
SUITES: Registry[Any] = Registry("suites")
KINDS = {r.kind: r for r in (DATASETS, MODELS, DEFENSES, ATTACKS, METRICS, SUITES)}

_BUILTIN_MODULES = ("bench.data.vision", "bench.data.text", "bench.models.vision", "bench.models.text",
                    "bench.models.llama", "leaderboards")
_PLUGIN_PACKAGES = ("defenses", "attacks", "metrics")   # every module inside registers what it defines
_discovered = False


def discover() -> None:
    """Import the built-in modules, every module of the built-in plugin packages (a new defense, attack
    or metric is one file there) and every installed plugin, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True   # first: a module imported below looks names up
    try:
        for name in _BUILTIN_MODULES:
            importlib.import_module(name)
        for name in _PLUGIN_PACKAGES:
            package = importlib.import_module(name)
            for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
                importlib.import_module(info.name)
        importlib.import_module(_CONTRACTS)
        for registry in KINDS.values():
            registry.load_entry_points()
    except BaseException:   # interrupted (a cell's time limit, Ctrl-C): the next lookup discovers again
        _discovered = False
        raise


def rescan() -> None:
    """Forget every plugin and load the installed ones again (a long-lived process after an install)."""
    discover()
    for registry in KINDS.values():
        registry.forget_plugins()
    for registry in KINDS.values():
        registry.load_entry_points()


def refusals() -> list[str]:
    """One line per refused plugin: its kind, name, distribution, entry point, fault and fix."""
    discover()
    return [line for registry in KINDS.values() for _, line in sorted(registry.refused.items())]
