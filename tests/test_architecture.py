"""The house as docs/architecture.md describes it: every path it names exists, every import between rooms
goes down its layer table, plugins on one layer stay apart, and no module imports another in a circle."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("bench", "defenses", "attacks", "metrics", "leaderboards")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every project module each module imports, at any depth of its code (lazy imports included)."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in modules else node.module
                    if target in modules:
                        edges[name].add(target)
            elif isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in modules}
    return edges


def _layers() -> list[tuple[int, int, str]]:
    """(layer, row, module prefix) from the doc's room table; a row may name further modules beside its room,
    which then share the row (they may import each other)."""
    rows = re.findall(r"^\| (\d+) \| `([^`]+)` \| (.*)\|$", DOC.read_text(), flags=re.M)
    out = []
    for row, (layer, room, holds) in enumerate(rows):
        for path in [room] + (re.findall(r"beside it ((?:`[^`]+`(?:, | and )?)+)", holds) or [""])[0].split("`")[1::2]:
            module = path.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            out.append((int(layer), row, module))
    return out


def _layer_of(module: str, layers: list[tuple[int, int, str]]) -> tuple[int, int]:
    """(layer, row) of the room holding `module`."""
    matches = [(len(room), layer, row) for layer, row, room in layers if module == room or module.startswith(room + ".")]
    if matches:
        return max(matches)[1:]
    if module.startswith("bench."):   # the old import paths kept for this release sit at the top
        return max((layer, row) for layer, row, _ in layers)
    raise AssertionError(f"{module} is in no room of docs/architecture.md")


def test_every_path_the_architecture_names_exists():
    named = set(re.findall(r"`((?:bench|defenses|attacks|metrics|leaderboards|tests|docs)/[\w/.-]*)`", DOC.read_text()))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    assert len(named) > 30


def test_imports_go_down_the_layers_and_plugins_stay_apart():
    layers = _layers()
    assert [room for _, _, room in layers][:3] == ["bench.registry", "bench.crypto", "bench.protocol"]
    modules = _modules()
    wrong = []
    for source, targets in _imports(modules).items():
        s_layer, s_row = _layer_of(source, layers)
        for target in targets:
            t_layer, t_row = _layer_of(target, layers)
            if t_layer > s_layer or (t_layer == s_layer and t_row != s_row):
                wrong.append(f"{source} (layer {s_layer}) imports {target} (layer {t_layer})")
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(sorted(wrong))


COMMAND_LINE = ("bench.cli", "bench.__main__")   # above both the harness and the renderer


def harness_imports_of_the_renderer(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{source} imports {target}" for source, targets in edges.items()
                  if source.split(".")[0] == "bench" and source not in COMMAND_LINE
                  for target in targets if target.split(".")[0] == "leaderboards")


def test_the_harness_imports_nothing_from_the_renderer():
    """bench/, its command line aside, imports nothing from leaderboards/ (lazy imports included): what both read of
    a record lives in bench/evaluation/, below both, so the harness never runs on the renderer's code."""
    edges = _imports(_modules())
    assert not harness_imports_of_the_renderer(edges)
    # the check can fail: an import of the renderer by the runner is caught, one by the command line is not
    assert harness_imports_of_the_renderer({"bench.run.runner": {"leaderboards.site"},
                                            "bench.cli": {"leaderboards.site"}}) == [
        "bench.run.runner imports leaderboards.site"]


def test_no_module_imports_another_in_a_circle():
    edges = _imports(_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_layer_check_can_fail():
    """An upward import is caught: the checker sees protocol importing the runner as wrong."""
    layers = _layers()
    assert _layer_of("bench.protocol.view", layers)[0] < _layer_of("bench.run.runner", layers)[0]
    assert _layer_of("defenses.dp", layers)[0] == _layer_of("attacks.dager.attack", layers)[0]
    assert _layer_of("defenses.dp", layers)[1] != _layer_of("attacks.dager.attack", layers)[1]


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > 400}
    assert not big, f"modules over 400 lines: {big}"


def test_old_attack_paths_import_until_the_next_release():
    """attacks/ in rooms: each flat path of the previous release still imports (with a warning), the same objects."""
    import importlib
    import warnings

    from attacks import MOVED
    for old, new in MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
        public = [k for k in vars(importlib.import_module(new)) if not k.startswith("__")]
        assert public and all(getattr(module, k) is getattr(importlib.import_module(new), k) for k in public), old
