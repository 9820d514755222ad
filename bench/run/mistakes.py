"""Suite mistakes that would otherwise run silently and mislead: a setting its data ignores, two scenarios whose
files collide on a case-blind disk, a page's figure or paper row naming what no record will hold. Each is
refused at load in one line with the closest valid value (the duplicated-component check lives with the
component parsing in bench/run/spec.py)."""
from __future__ import annotations

import dataclasses
from typing import Any

from bench.federation.scenario import Scenario, SpecError

DATA_KINDS = ("text", "image")


def data_kind(dataset: str) -> str | None:
    """What a dataset holds as its loader declares it (`loader.modality`: text or image); None when undeclared
    (a plugin's may be), and then nothing is refused."""
    from bench.registry import DATASETS

    kind = getattr(DATASETS.get(dataset), "modality", None)
    return kind if kind in DATA_KINDS else None


def check_data_fields(table: dict[str, Any], dataset: str, where: str) -> None:
    """A scenario key meant for one kind of data (its field's metadata `data`, e.g. seq_len: text), set on the
    other kind, is ignored by the run: refused rather than shown as if it mattered."""
    kind = data_kind(dataset)
    if kind is None:
        return
    for f in dataclasses.fields(Scenario):
        wants = f.metadata.get("data")
        if f.name in table and wants and wants != kind:
            raise SpecError(f"{where}: '{f.name}' applies to {wants} data only and dataset '{dataset}' is {kind} "
                            f"data, so the run would ignore it; leave '{f.name}' out")


def check_unique(name: str, i: int, folded: dict[str, int], where: str) -> None:
    """Scenario names are file names: unique, and unique once case is folded (macOS and Windows disks)."""
    first = folded.setdefault(name.casefold(), i)
    if first != i:
        raise SpecError(f"{where}: scenario names must be unique, also ignoring case: '{name}' repeats "
                        f"scenarios[{first}]'s name (its files would overwrite that scenario's); did you mean "
                        f"'{name}-{i}'?")


def known_names(scenarios: list, defenses: list, attacks: list) -> dict[str, set[str]]:
    """What a figure or paper row of this suite may name: its scenarios, defenses and attacks; metrics; the
    parameters its components set (a record holds those, not the defaults)."""
    from bench.registry import METRICS

    params = {k for c in (*defenses, *attacks) for k in c.params}
    return {"scenario": {s.name for s in scenarios}, "defense": {d.name for d in defenses},
            "attack": {a.name for a in attacks}, "metric": set(METRICS.names()),
            "column": set(METRICS.names()) | params | {"scenario", "defense", "attack"}}


def check_pages(figures: tuple, paper: tuple, known: dict[str, set[str]], where: str) -> None:
    from bench.evaluation.pages import check_figure
    from bench.evaluation.pages import check_paper

    for kind, specs, check in (("figures", figures, check_figure), ("paper", paper, check_paper)):
        for i, spec in enumerate(specs):
            try:
                check(spec, known)
            except ValueError as err:
                raise SpecError(f"{where} {kind}[{i}]: {err}") from None


def check_notes(notes: str, cells: list, suite: str, where: str) -> None:
    """Every `{= CELL METRIC =}` of a suite's notes names exactly one of its cells (leaderboards/notes.py)."""
    from bench.evaluation.pages import NoteError, check_references

    pairs = [(c.label, f"{c.scenario.name}/{c.defense.name}/{c.attack.name}") for c in cells]
    try:
        check_references(notes, pairs, suite)
    except NoteError as err:
        raise SpecError(f"{where}: {err}") from None


def check_track_tables(tables: Any, scenarios: list, defenses: list, where: str) -> tuple[dict, ...]:
    """The suite's [[tracks]] as pages read them (bench/evaluation/tracks.py), refused in one line when a track names
    an unknown scenario, puts a scenario in two tracks, a utility scenario outside the track, ..."""
    from bench.evaluation.tracks import check_tracks

    names = {d.name for d in defenses} | {d.label for d in defenses}
    try:
        return tuple(check_tracks(tables, [s.name for s in scenarios], names))
    except ValueError as err:
        raise SpecError(f"{where} {err}") from None
