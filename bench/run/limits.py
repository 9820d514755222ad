"""Bounds on what a suite may ask for at load, so that a hostile or mistaken file is refused in one line instead
of exhausting the stack, the memory or the hours of a run: its size on disk, how deep its values nest, how many
scenarios and cells it names. Cell and scenario counts are computed before anything is enumerated.

The cell and scenario bounds are defaults (documented in the README): `--max-cells` / `--max-scenarios` or
LEAKBENCH_MAX_CELLS / LEAKBENCH_MAX_SCENARIOS raise them for a suite that really is that large."""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from bench.federation.scenario import SpecError

MAX_CELLS = 20_000          # the largest built-in suite holds a few hundred
MAX_SCENARIOS = 2_000
MAX_DEPTH = 32              # parameters are numbers, strings and short lists; tomllib recurses per level
MAX_BYTES = 16 << 20        # a suite file; the largest built-in one is 32 kB


@dataclass(frozen=True)
class Limits:
    cells: int = MAX_CELLS
    scenarios: int = MAX_SCENARIOS

    @classmethod
    def resolve(cls, cells: int | None = None, scenarios: int | None = None) -> "Limits":
        """The bounds a load uses: the given ones, else the environment's, else the defaults."""
        return cls(_bound("--max-cells", cells, "LEAKBENCH_MAX_CELLS", MAX_CELLS),
                   _bound("--max-scenarios", scenarios, "LEAKBENCH_MAX_SCENARIOS", MAX_SCENARIOS))


def _bound(flag: str, given: int | None, env: str, default: int) -> int:
    if given is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        try:
            given = int(text)
        except ValueError:
            raise SpecError(f"{env}={text[:40]!r} is not a whole number; unset it or set e.g. {env}={default}") \
                from None
        flag = env
    if given < 1:
        raise SpecError(f"{flag} must be >= 1, got {given}; the default is {default}")
    return given


def check_count(where: str, what: str, count: int, limit: int, flag: str, detail: str = "") -> None:
    """Refuse a suite that names more scenarios or cells than the bound, before they are built."""
    if count > limit:
        raise SpecError(f"{where}: {count:,} {what}{detail} exceed the limit of {limit:,}; narrow the suite (fewer "
                        f"sweep values or scenarios), or raise the limit with {flag} N")


_TOKENS = re.compile(r"[\[\]{}\"'#\n]")
_BASIC = {'"': re.compile(r'\\.|"|\n', re.S), '"""': re.compile(r'\\.|"""|\n', re.S)}


def text_depth(text: str, limit: int = MAX_DEPTH) -> tuple[int, int]:
    """(nesting depth of brackets and braces, its line) of TOML text outside strings and comments, without
    recursion; stops at the first line deeper than `limit`."""
    i, n, depth, deepest, line, at = 0, len(text), 0, 0, 1, 1
    while (m := _TOKENS.search(text, i)) is not None:
        c, i = m.group(), m.end()
        if c == "\n":
            line += 1
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, line
                if depth > limit:
                    break
        elif c in "]}":
            depth = max(0, depth - 1)
        else:
            quote = c * 3 if text.startswith(c * 2, i) else c
            i += len(quote) - 1
            if c == "'":
                j = text.find(quote, i)
                end = n if j < 0 else j + len(quote)
                line += text.count("\n", i, end)
                i = end
                continue
            pattern = _BASIC[quote]
            while (s := pattern.search(text, i)) is not None:
                i = s.end()
                line += s.group().count("\n")
                if s.group() == quote or (s.group() == "\n" and quote == '"'):
                    break
            else:
                i = n
    return deepest, at


def data_depth(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first value nested deeper than `limit` tables or lists (None: none is), without
    recursion: json, the cell id and the checks below would otherwise end in a RecursionError."""
    stack = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, dict):
            children = [(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(item)]
        else:
            continue
        if depth + 1 > limit:
            return path or "<top>"
        stack.extend((v, depth + 1, p) for v, p in children)
    return None


def check_depth(where: str, data: Any) -> None:
    path = data_depth(data)
    if path is not None:
        raise SpecError(f"{where}: '{path[:80]}' nests tables or lists deeper than {MAX_DEPTH} levels; parameters "
                        f"are numbers, strings or short lists, so flatten it")


def check_timeout(value: Any, where: str) -> float | None:
    """A cell time limit: seconds > 0 (None: no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise SpecError(f"{where} must be a finite number of seconds > 0, got {value!r}; e.g. 3600 (an hour), or "
                        "leave it out for no limit")
    return float(value)


def read_toml(path: Path) -> dict[str, Any]:
    """A suite file's TOML, refused in one line when it is too large, not UTF-8, nested too deep or not TOML."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise SpecError(f"suite file '{path}' holds {size:,} bytes, over the {MAX_BYTES:,} a suite may; a grid "
                            "that large is written with sweeps")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"suite file '{path}' is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    except OSError as err:
        raise SpecError(f"suite file '{path}' cannot be read ({err.strerror}); check its permissions") from None
    depth, line = text_depth(text)
    if depth > MAX_DEPTH:
        raise SpecError(f"suite file '{path}' line {line}: values nest deeper than {MAX_DEPTH} levels of [ ] and "
                        "{ }; parameters are numbers, strings or short lists, so flatten them")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"suite file '{path}' is not valid TOML: {str(err).splitlines()[0]}") from None
    except RecursionError:   # nesting the scan above does not count (it counts brackets only)
        raise SpecError(f"suite file '{path}' nests its values too deep to read; flatten them") from None
