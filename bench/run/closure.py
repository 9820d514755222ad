"""Static import closures of LeakBench's own modules: which source files a component's numbers depend on.

A module's imports are read from its syntax tree (every `import` and `from ... import`, at any depth, so an
import inside a function counts), never by importing it: the closure is the same in every process and on every
machine for the same tree. Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first, so those
belong to the closure too. Only modules of the result packages are followed; third-party imports are left
to the package version the record states.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Iterable

PACKAGES = ("bench", "defenses", "attacks", "metrics", "leaderboards")


def module_path(root: Path, module: str) -> Path | None:
    """The file that defines `module` under `root` (a package's __init__.py), or None."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


@functools.lru_cache(maxsize=None)
def _imports(root: Path, module: str) -> frozenset[str]:
    """The project modules `module` imports (with their parent packages)."""
    path = module_path(root, module)
    if path is None:
        return frozenset()
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            named.add(source)
            named.update(f"{source}.{alias.name}" for alias in node.names)   # `from pkg import submodule`
    found: set[str] = set()
    for name in named:
        parts = name.split(".")
        found.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                     if module_path(root, p) is not None)
    return frozenset(found)


def closure(root: Path, modules: Iterable[str], stop: Iterable[str] = ()) -> frozenset[str]:
    """Every project module reachable from `modules` by imports, not entering those in `stop` (nor below them)."""
    stops = tuple(stop)
    seen: set[str] = set()
    todo = [".".join(m.split(".")[:i]) for m in modules for i in range(1, m.count(".") + 2)]   # parents run first
    while todo:
        module = todo.pop()
        if module in seen or any(module == s or module.startswith(s + ".") for s in stops):
            continue
        if module_path(root, module) is None:
            continue
        seen.add(module)
        todo.extend(_imports(root, module))
    return frozenset(seen)


def package_modules(root: Path, package: str) -> list[str]:
    """Every module of a package directory (its __init__ included), by dotted name."""
    base = root / package
    return sorted(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                  for p in base.rglob("*.py"))
