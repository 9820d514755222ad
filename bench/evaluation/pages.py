"""A suite's page info as the suite loader checks it: figures, paper rows and note references must name what the
suite's records will hold, or the suite is refused at load in one line (bench/run/mistakes.py). The renderer
(leaderboards/figures.py, paper.py, notes.py) draws and resolves them from the records with the same rules.
"""
from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Any

from bench.evaluation.formats import is_number

FIGURE_KEYS = {"title", "x", "y", "hue", "attack", "scenario", "defense", "where", "logx", "logy", "series"}


def check_figure(spec: Any, known: dict[str, set[str]] | None = None) -> None:
    """The figure's keys and their types; with `known` (the suite's names: leaderboards' check_names), its axes
    and filters too, since an axis no record holds draws nothing, silently. With `series`, x and y only title
    the axes."""
    check_table(spec, "a figure", 'x = "ratio", y = "kde_mi"')
    unknown = set(spec) - FIGURE_KEYS
    if unknown or "x" not in spec or "y" not in spec:
        raise ValueError(f"figure needs x and y and accepts {sorted(FIGURE_KEYS)}; got {sorted(spec)}")
    check_types(spec, ("title", "x", "y", "hue", "series", *IDENTITY), ("logx", "logy"))
    if known is not None:
        axes = ("hue",) if spec.get("series") else ("x", "y", "hue")
        check_names(spec, known, {k: "column" for k in axes})


IDENTITY = ("scenario", "defense", "attack")


def check_table(spec: Any, what: str, example: str) -> None:
    """A figure or paper row is a table of keys (a page's pages.json is anyone's file: [NaN] is no figure)."""
    if not isinstance(spec, dict) or not all(isinstance(k, str) for k in spec):
        raise ValueError(f"{what} must be a table like {{{example}}}, got {type(spec).__name__} {str(spec)[:40]}")


def check_types(spec: dict[str, Any], texts: tuple[str, ...], flags: tuple[str, ...] = ()) -> None:
    """Text keys hold text, flags true or false, `where` a table."""
    for key in texts:
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"{key} must be text, got {type(spec[key]).__name__} {str(spec[key])[:40]}")
    for key in flags:
        if key in spec and not isinstance(spec[key], bool):
            raise ValueError(f"{key} must be true or false, got {type(spec[key]).__name__}")
    if "where" in spec and not isinstance(spec["where"], dict):
        raise ValueError(f"where must be a table of column = value, got {type(spec['where']).__name__}")


def check_names(spec: dict[str, Any], known: dict[str, set[str]], keys: dict[str, str]) -> None:
    """Each of `keys` (spec key -> the kind of name it holds), the identity filters and the `where` keys of a
    figure or paper row name something of the suite: `known` maps scenario, defense, attack, metric and column
    (a metric, a parameter the suite sets, or scenario/defense/attack) to the valid names."""
    wanted = {**{k: k for k in IDENTITY}, **keys}
    for key, kind in wanted.items():
        if spec.get(key) not in (None, "") and spec[key] not in known[kind]:
            raise ValueError(_unknown(f"{key} = {spec[key]!r}", spec[key], known[kind]))
    where = spec.get("where", {})
    for key in where if isinstance(where, dict) else ():
        if key not in known["column"]:
            raise ValueError(_unknown(f"where key {key!r}", key, known["column"]))


def _unknown(what: str, value: Any, valid: set[str]) -> str:
    names = sorted(valid)
    close = difflib.get_close_matches(str(value), names, n=1)
    hint = f"did you mean '{close[0]}'?" if close else \
        f"this suite has {', '.join(names[:12])}" + (", ..." if len(names) > 12 else "")
    return f"{what} names nothing this suite records, so nothing would be drawn or compared; {hint}"


def lookup(rec: dict[str, Any], key: str) -> Any:
    for source in (rec["metrics"], rec["defense_params"], rec["attack_params"]):
        if key in source:
            return source[key]
    return rec.get(key)


PAPER_KEYS = {"metric", "reported", "source", "scenario", "defense", "attack", "where", "note", "baseline",
              "reported_by", "tolerance"}
REPORTERS = ("paper", "official code")
TOLERANCE = 0.1


def reported_range(value: Any) -> tuple[float, float] | None:
    if is_number(value):
        return float(value), float(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(is_number(v) for v in value) \
            and value[0] <= value[1]:
        return float(value[0]), float(value[1])
    return None


def check_paper(spec: dict[str, Any], known: dict[str, set[str]] | None = None) -> None:
    """The row's keys and values; with `known` (the suite's names, leaderboards/figures.py check_names), its
    metric, filters and baseline too: a row naming what no record holds would read "–" beside the paper."""
    check_table(spec, "a [[paper]] row", 'metric = "lnacc", reported = 0.99, source = "..."')
    check_types(spec, ("metric", "source", "note", "reported_by", *IDENTITY))
    unknown = set(spec) - PAPER_KEYS
    base = spec.get("baseline", {})
    if unknown or "metric" not in spec or reported_range(spec.get("reported")) is None or not isinstance(base, dict) \
            or set(base) - {*IDENTITY, "where"} or spec.get("reported_by", "paper") not in REPORTERS \
            or not (is_number(spec.get("tolerance", TOLERANCE)) and spec.get("tolerance", TOLERANCE) >= 0):
        raise ValueError(f"a [[paper]] row needs metric and a numeric reported value (or [lo, hi]), reported_by "
                         f"one of {', '.join(REPORTERS)}, a tolerance >= 0, and accepts "
                         f"{sorted(PAPER_KEYS)} (baseline: a table of scenario/defense/attack/where); got {sorted(spec)}")
    check_types(base, IDENTITY)
    if known is not None:
        check_names(spec, known, {"metric": "metric"})
        check_names(base, known, {})


REFERENCE = re.compile(r"\{=\s*(.*?)\s*=\}", re.DOTALL)


class NoteError(ValueError):
    """A reference in a suite's notes that names no cell, several, or a metric the cell lacks."""


def parsed_reference(match: re.Match, suite: str) -> tuple[list[str], str]:
    """A reference's words (CELL METRIC [ci]) and where it stands, for errors; NoteError when malformed."""
    words = match.group(1).split()
    where = f"notes of suite '{suite}': {match.group(0)}"
    if len(words) not in (2, 3) or (len(words) == 3 and words[2] != "ci"):
        raise NoteError(f"{where} must read {{= scenario/defense/attack METRIC =}} (or METRIC ci, or status)")
    return words, where


def named_cells(cell: str, full: dict[str, Any], bare: dict[str, list]) -> list:
    """What a reference's CELL names: its full label, the same with names only, or a glob over full labels."""
    if cell in full:
        return [full[cell]]
    return bare.get(cell) or [v for k, v in full.items() if fnmatch.fnmatchcase(k, cell)]


def check_references(text: str, cells: list[tuple[str, str]], suite: str) -> None:
    """At suite load: every reference names exactly one of the suite's cells, given as (full label, label with
    names only) pairs; NoteError in one line otherwise. Its metric is checked when the page renders."""
    full = {label: label for label, _ in cells}
    bare: dict[str, list] = {}
    for label, names in cells:
        bare.setdefault(names, []).append(label)
    for match in REFERENCE.finditer(text):
        words, where = parsed_reference(match, suite)
        hits = named_cells(words[0], full, bare)
        if len(hits) != 1:
            some = ", ".join(sorted(hits)[:3])
            raise NoteError(f"{where} names {len(hits)} cells of the suite{': ' + some if some else ''}; name "
                            "exactly one (its full label, as `leakbench run --dry-run` lists it)")
