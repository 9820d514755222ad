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
from typing import Callable, Iterable

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


# -- definitions: which top-level statements of which modules a registered object reaches -------------------
# A module's top-level statements are definitions (def, class, an assignment of names without a call) or run
# for whoever imports it (imports and everything else: a registration, a loop, an assignment with a call: its
# "core"). An object reaches the definitions its source names, and those name in turn, across the project modules
# they import from, plus the core of every module it enters. An object reached only through a lookup by
# string is not seen, except through the registries, which log what they hand out (bench/registry.py).

class _Source:
    """One module's top-level statements: their text, what each binds and names, and which form its core."""

    def __init__(self, root: Path, module: str):
        path = module_path(root, module)
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        self.package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        self.texts: list[str] = []
        self.binds: dict[str, list[int]] = {}
        self.uses: list[tuple[frozenset[str], dict[str, str]]] = []   # (names and dotted names, its own imports)
        self.core: list[int] = []
        self.imported: list[set[str]] = []                              # project modules each statement imports
        for i, node in enumerate(tree.body):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            self.texts.append("\n".join(lines[first - 1:node.end_lineno]))
            own = self._imports(node)
            self.imported.append(set(own.values()))
            self.uses.append((frozenset(_names(node)), own))
            for name in _bound(node):
                self.binds.setdefault(name, []).append(i)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, str):
                continue   # a docstring: words, not code
            if not _definition(node):
                self.core.append(i)
        self.imports = {k: v for node, (_, own) in zip(tree.body, self.uses)
                        if isinstance(node, (ast.Import, ast.ImportFrom)) for k, v in own.items()}

    def _imports(self, node: ast.AST) -> dict[str, str]:
        """Local name -> dotted target of every import inside the statement (at any depth)."""
        out = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                for alias in sub.names:
                    out[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(sub, ast.ImportFrom):
                base = self.package[:len(self.package) - sub.level + 1] if sub.level else []
                source = ".".join(base + ([sub.module] if sub.module else []))
                for alias in sub.names:
                    out[alias.asname or alias.name] = f"{source}.{alias.name}"
        return out


def _definition(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        calls = node.value is not None and any(isinstance(n, ast.Call) for n in ast.walk(node.value))
        return all(isinstance(t, ast.Name) for t in targets) and not calls
    return False


def _bound(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds in its module."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name.split(".")[0]) for a in node.names}
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            out.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(sub.name)
    return out


def _names(node: ast.AST) -> set[str]:
    """Names the statement reads: bare (`f`) or dotted through attributes (`module.f`)."""
    out: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_Attribute(self, sub: ast.Attribute) -> None:
            parts, value = [sub.attr], sub.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                out.add(".".join([value.id, *reversed(parts)]))
            else:
                self.generic_visit(sub)

        def visit_Name(self, sub: ast.Name) -> None:
            out.add(sub.id)

    Visitor().visit(node)
    return out


@functools.lru_cache(maxsize=None)
def _source(root: Path, module: str) -> _Source:
    return _Source(root, module)


def definitions(root: Path, module: str, name: str | None, stop: Callable[[str], bool]) -> dict[str, frozenset[int]]:
    """module -> the indices of its top-level statements that `name` of `module` reaches (None: the whole
    module), with the core of every module entered; modules for which `stop` is true are not entered."""
    reached: dict[str, set[int]] = {}
    todo: list[tuple[str, int]] = []

    def enter(mod: str) -> bool:
        if stop(mod) or module_path(root, mod) is None:
            return False
        if mod not in reached:
            reached[mod] = set()
            parts = mod.split(".")
            for i in range(1, len(parts)):   # importing a.b.c runs a/__init__.py and a/b/__init__.py first
                enter(".".join(parts[:i]))
            todo.extend((mod, i) for i in _source(root, mod).core)
        return True

    def want(mod: str, symbol: str | None) -> None:
        if not enter(mod):
            return
        src = _source(root, mod)
        if symbol is None or symbol not in src.binds:   # the module itself, or an object made at import: all of it
            todo.extend((mod, i) for i in range(len(src.texts)))
            return
        todo.extend((mod, i) for i in src.binds[symbol])
        if symbol in src.imports:   # a name the module imports (a re-export): the definition it names
            resolve(mod, symbol, {})

    def resolve(mod: str, dotted: str, own: dict[str, str]) -> None:
        head, *rest = dotted.split(".")
        src = _source(root, mod)
        target = own.get(head) or src.imports.get(head)
        if target is None:
            for i in src.binds.get(head, ()):
                todo.append((mod, i))
            return
        parts = target.split(".") + rest
        for cut in range(len(parts), 0, -1):   # the longest project module the dotted name starts with
            base = ".".join(parts[:cut])
            if module_path(root, base) is not None:
                want(base, parts[cut] if cut < len(parts) else None)
                return

    want(module, name)
    while todo:
        mod, i = todo.pop()
        if i in reached[mod]:
            continue
        reached[mod].add(i)
        src = _source(root, mod)
        for imported in src.imported[i]:   # an import runs the imported module's core
            parts = imported.split(".")
            for cut in range(len(parts), 0, -1):
                if module_path(root, ".".join(parts[:cut])) is not None:
                    enter(".".join(parts[:cut]))
                    break
        names, own = src.uses[i]
        for dotted in names:
            resolve(mod, dotted, own)
    return {m: frozenset(s) for m, s in reached.items()}


def definitions_text(root: Path, reached: dict[str, frozenset[int]]) -> bytes:
    """The reached statements' source, module by module in name order and in source order within each."""
    out = []
    for mod in sorted(reached):
        src = _source(root, mod)
        out.append(f"# {mod}\n".encode() + "\n".join(src.texts[i] for i in sorted(reached[mod])).encode())
    return b"\0".join(out)
