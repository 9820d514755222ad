"""A suite's tracks: named groups of its scenarios, each one setting a deployment lives in, so that every number of
a front-page row comes from the same trained model (RobustBench keeps one board per data set and threat model).

A suite declares them as `[[tracks]]` tables:

    [[tracks]]
    name = "cross-silo images"                  # unique in the suite
    setting = "4 organisations, all in every round, train the seeds' MLP"   # one line
    scenarios = ["mnist-mlp-utility", "mnist-mlp-trained-b8"]   # each scenario in one track at most
    utility = "mnist-mlp-utility"               # whose trained model gives the track's utility and HE cost
    central = { value = [0.956, 0.968], source = "the same MLP trained centrally (suite notes)" }
    notes = { dp-fedavg = "why this row reads as it does" }     # per defense name or full label, one line each

or, for a setting that measures privacy only (no utility column, said so on the page):

    [[tracks]]
    name = "classic CIFAR-10, round 0"
    setting = "..."
    scenarios = [...]
    privacy_only = true

`central` is what the same model reaches trained centrally, a number or a [low, high] range, with its source in
words; the page prints it as stated. A scenario in no track stays on the suite page and in the grid. The same
checks run when a suite loads (bench/run/mistakes.py, one line and exit 2) and when a page reads a stored
pages.json (bench/evaluation/exports.py), so a page never renders a track the loader would refuse.
"""
from __future__ import annotations

import difflib
from typing import Any

from bench.evaluation.formats import is_number
from bench.evaluation.schema import attack_label

KEYS = ("name", "setting", "scenarios", "utility", "privacy_only", "central", "notes")
LONGEST = 300   # characters of a one-line text (a setting, a note, a source)


def _line(value: Any, what: str, spot: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{spot}: '{what}' must be a line of text, got {value!r}")
    if "\n" in value.strip() or len(value) > LONGEST:
        raise ValueError(f"{spot}: '{what}' must be one line of at most {LONGEST} characters; move the rest to "
                         "the suite's notes")
    return value.strip()


def _scenario(name: Any, known: list[str] | None, spot: str, what: str) -> str:
    if not isinstance(name, str) or not name or (known is not None and name not in known):
        close = difflib.get_close_matches(str(name), known or [], n=1)
        raise ValueError(f"{spot}: '{what}' names {name!r}, which is no scenario of the suite"
                         + (f"; did you mean '{close[0]}'?" if close else ""))
    return name


def _central(value: Any, spot: str) -> dict[str, Any]:
    """{"value": number or [low, high], "source": text}."""
    if not isinstance(value, dict) or set(value) != {"value", "source"}:
        raise ValueError(f"{spot}: 'central' must be a table {{ value = 0.96 or [0.95, 0.97], source = \"...\" }}, "
                         f"got {value!r}")
    number = value["value"]
    ranged = isinstance(number, list) and len(number) == 2 and all(is_number(v) for v in number)
    if not (is_number(number) or ranged) or (ranged and number[0] > number[1]):
        raise ValueError(f"{spot}: central value must be a number or [low, high] with low <= high, got {number!r}")
    return {"value": list(number) if ranged else number, "source": _line(value["source"], "central source", spot)}


def check_tracks(tables: Any, scenarios: list[str] | None, defenses: set[str] | None = None) -> list[dict[str, Any]]:
    """The tracks as a page reads them (every key present), or ValueError in one line naming the fault and the fix.
    `scenarios`: the suite's scenario names; `defenses`: the names and full labels a note may name (None: not
    checked, as for a stored pages.json, whose run may hold some of its suite's scenarios only)."""
    if tables is None:
        return []
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ValueError("tracks must be [[tracks]] tables with name, setting and scenarios")
    out, owner = [], {}
    for i, table in enumerate(tables):
        spot = f"tracks[{i}]"
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            close = difflib.get_close_matches(unknown[0], KEYS, n=1)
            raise ValueError(f"{spot}: unknown key '{unknown[0]}'; "
                             + (f"did you mean '{close[0]}'?" if close else f"use {', '.join(KEYS)}"))
        name = _line(table.get("name"), "name", spot)
        spot = f"tracks[{i}] '{name}'"
        if any(t["name"] == name for t in out):
            raise ValueError(f"{spot}: two tracks are named '{name}'; give each its own name")
        listed = table.get("scenarios")
        if not isinstance(listed, list) or not listed:
            raise ValueError(f"{spot}: 'scenarios' must be a non-empty list of the suite's scenario names")
        for s in listed:
            _scenario(s, scenarios, spot, "scenarios")
            if s in owner:
                raise ValueError(f"{spot}: scenario '{s}' is already in track '{owner[s]}'; a scenario belongs to "
                                 "one track at most")
            owner[s] = name
        if len(set(listed)) < len(listed):
            raise ValueError(f"{spot}: 'scenarios' lists a scenario twice")
        only = table.get("privacy_only", False)
        if not isinstance(only, bool):
            raise ValueError(f"{spot}: 'privacy_only' must be true or false, got {only!r}")
        utility, central = table.get("utility"), table.get("central")
        if only and (utility is not None or central is not None):
            raise ValueError(f"{spot}: a privacy-only track measures no utility; drop "
                             f"'{'utility' if utility is not None else 'central'}' or set privacy_only = false")
        if not only:
            if utility is None:
                raise ValueError(f"{spot}: needs 'utility', the scenario whose trained model gives the track's "
                                 "utility and HE cost, or privacy_only = true")
            _scenario(utility, scenarios, spot, "utility")
            if utility not in listed:
                raise ValueError(f"{spot}: its utility scenario '{utility}' is not among its scenarios; add it "
                                 "there or name one of them")
        notes = table.get("notes", {})
        if not isinstance(notes, dict):
            raise ValueError(f"{spot}: 'notes' must be a table of defense = \"one line\", got {notes!r}")
        for key, text in notes.items():
            if defenses is not None and key not in defenses:
                close = difflib.get_close_matches(key, sorted(defenses), n=1)
                raise ValueError(f"{spot}: notes name '{key}', which is no defense of the suite"
                                 + (f"; did you mean '{close[0]}'?" if close else ""))
            _line(text, f"notes.{key}", spot)
        out.append({"name": name, "setting": _line(table.get("setting"), "setting", spot), "scenarios": list(listed),
                    "utility": utility if not only else None, "privacy_only": only,
                    "central": _central(central, spot) if central is not None else None,
                    "notes": {k: v.strip() for k, v in notes.items()}})
    return out


def note_for(track: dict[str, Any], name: str, label: str) -> str | None:
    """The track's note on a row: by its full label, else by its defense's name."""
    notes = track.get("notes") or {}
    return notes.get(label) or notes.get(name) or None


def planned(cells: list[Any]) -> dict[str, list[str]]:
    """Each scenario's attacks as records label them: the cells a row owes its track, whether or not any row has
    run them yet (a scenario nobody ran must still count against every row's coverage)."""
    out: dict[str, dict[str, None]] = {}
    for c in cells:
        rec = {"attack": c.attack.name, "attack_params": c.attack.params, "scenario": c.scenario.name}
        out.setdefault(c.scenario.name, {})[attack_label(rec)] = None
    return {s: list(a) for s, a in out.items()}
