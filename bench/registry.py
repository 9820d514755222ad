"""One small generic registry type, one instance per kind of pluggable thing.

Built-ins register themselves with a decorator in the module that defines them;
outside packages add theirs through entry points (group ``leakbench.<kind>``).
Unknown names fail with the known names and the closest match, so a typo in a
suite file is a one-line fix.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    """Raised for a name no registry entry has; str() is a one-line fix hint."""

    def __init__(self, kind: str, name: str, known: list[str]):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known) or 'none'}"
        self.message = f"unknown {kind} '{name}'; {hint}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    """Name -> object map with decorator registration and entry-point discovery."""

    def __init__(self, kind: str, group: str | None = None):
        self.kind = kind
        self.group = group or f"leakbench.{kind}"
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str | None = None) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            self.add(name, obj, description)
            return obj

        return decorate

    def add(self, name: str, obj: T, description: str | None = None) -> None:
        if name in self._entries and self._entries[name].obj is not obj:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        doc = description or (getattr(obj, "__doc__", None) or "").strip().splitlines()
        if isinstance(doc, list):
            doc = doc[0] if doc else ""
        self._entries[name] = Entry(name, obj, doc)

    def get(self, name: str) -> T:
        discover()
        try:
            return self._entries[name].obj
        except KeyError:
            raise UnknownName(self.kind[:-1] if self.kind.endswith("s") else self.kind,
                              name, self.names()) from None

    def entry(self, name: str) -> Entry[T]:
        """The named entry (its object and one-line description)."""
        self.get(name)
        return self._entries[name]

    def names(self) -> list[str]:
        discover()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        discover()
        for name in sorted(self._entries):
            yield self._entries[name]

    def __contains__(self, name: str) -> bool:
        discover()
        return name in self._entries

    def load_entry_points(self) -> None:
        """Objects are added under the entry point's name; a module entry point registers its own."""
        for ep in entry_points(group=self.group):
            obj = ep.load()
            if ep.name not in self._entries and not inspect.ismodule(obj):
                self.add(ep.name, obj)


DATASETS: Registry[Any] = Registry("datasets")
MODELS: Registry[Any] = Registry("models")
DEFENSES: Registry[Any] = Registry("defenses")
ATTACKS: Registry[Any] = Registry("attacks")
METRICS: Registry[Any] = Registry("metrics")
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
    _discovered = True
    for name in _BUILTIN_MODULES:
        importlib.import_module(name)
    for name in _PLUGIN_PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            importlib.import_module(info.name)
    for registry in KINDS.values():
        registry.load_entry_points()
