"""The committed leaderboards as one site: each suite directory re-rendered from its stored
results (nothing is rerun) and a front page that is the leaderboard: every defense across every
suite, the worst case per attack family with its verdict band, utility and HE cost, each cell
linking to the suite and scenario it comes from (leaderboards/overview.py), then the suite list.
Above it, from the standard suite: one summary per track (leaderboards/summary.py), written beside the page as
summary.json (the same structure, less its presentation), the privacy-utility frontier of each track and of the
sweep suite (leaderboards/frontier.py), and the core grid over every scenario (leaderboards/grid.py).

    leakbench site leaderboards/results [--date YYYY-MM-DD] [--verify N] [--report FILE]

A suite's page info comes from its current definition when the caller passes one (the CLI: the
built-in suite's TOML, so corrected notes reach the page), else from the directory's pages.json.

Every directory is read and checked before anything is written (its records, bench/protocol/records.py; its
pages.json against its records; the metric schema they share; the references in its notes). The front page
judges verified records only (the reading rule: sealed, or reproduced by `leakbench verify`, whose outcome the
caller passes per directory), and its core grid and frontier come from the directories named after their suites
where one holds that suite: a copy under another name never takes their place. Above them it says what was
re-checked: per directory (and per scenario in each entry's `checks`, for whoever groups scenarios), how many
cells `leakbench verify` reproduced, on what machine and when, and how many are as computed (sealed: a checksum
against accidental edits, not a re-check).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from bench.protocol.records import verified
from bench.evaluation.exports import load_pages, load_records
from bench.evaluation.verification import Checked, counts
from leaderboards.frontier import frontier, track_panels
from leaderboards.grid import grid
from leaderboards.notes import resolve
from leaderboards.overview import overview
from leaderboards.render import band_rows, env, provenance, render
from leaderboards.safe import site_href
from bench.evaluation.schema import described, schema_of
from leaderboards.summary import as_json, summarize

STANDARD = "core"   # the suite whose grid heads the front page: every defense x every applicable attack
FRONTIER = "frontier"   # the suite whose sweeps draw the front page's privacy-utility frontier
Info = Callable[[str], "dict[str, Any] | None"]   # a suite's current page info, None when it has none
# records -> each one's components computed by other code than the running code's (bench/run/version.py's staleness)
Stale = Callable[[list], "dict[str, list[str]]"]
Loaded = list[tuple[Path, list[dict[str, Any]]]]


def page_info(suite: str, directory: Path, current: Info | None = None) -> dict[str, Any]:
    """The suite's current page info where the caller has it (a built-in suite's TOML) over what pages.json
    stored (facts only a run knows, such as the grid points no defense applies to, stay as stored)."""
    stored = load_pages(directory).get(suite, {})
    info = current(suite) if current is not None else None
    if info is None:
        return stored
    merged = stored | {k: v for k, v in info.items() if v or k not in stored}   # an empty current fact keeps the run's
    if "chance" in stored:   # known per scenario where its data is present here: the run's stay for the others
        merged["chance"] = stored["chance"] | (info.get("chance") or {})
    return merged


def rerender(directory: str | Path, current: Info | None = None, generated: str | None = None,
             records: list[dict[str, Any]] | None = None, stale: Stale | None = None,
             checked: Checked | None = None) -> dict[str, Any]:
    """Re-render one output directory from its results.json (or the `records` already read from it); a summary
    for the front page, whose records are the verified ones. `stale` says which components of each record differ
    from today's code; `checked` what `leakbench verify` re-checked there (bench/evaluation/verification.py),
    marked cell by cell and listed on the page."""
    directory = Path(directory)
    records = load_records(directory) if records is None else records
    reproduced = checked.reproduced if checked is not None else {}
    suites = list(dict.fromkeys(r["suite"] for r in records))
    infos = {s: page_info(s, directory, current) for s in suites}
    render(records, infos, directory, home="../index.html", generated=generated,
           stale=None if stale is None else stale(records), checked=checked)
    statuses = {s: sum(r["status"] == s for r in records) for s in ("ok", "blocked", "diverged", "failed")}
    info = infos[suites[0]] if suites else {}
    return {"name": directory.name, "href": site_href(directory.name), "suites": suites,
            "description": info.get("description", ""), "cells": len(records),
            "records": [r for r in described(records) if verified(r, reproduced)],
            "paper": bool(info.get("paper")), "scenarios": len({r["scenario"] for r in records}), "infos": infos,
            "checks": checks(records, checked), **statuses}


def checks(records: list[dict[str, Any]], checked: Checked | None) -> dict[str, Any]:
    """What was re-checked in one directory, as the front page states it: its totals, per scenario (so a page that
    groups scenarios into tracks adds them up), and where and when `leakbench verify` ran."""
    per = counts(records, checked)
    total = {k: sum(c[k] for c in per.values()) for k in ("cells", "reproduced", "sealed", "unverified")}
    return {**total, "scenarios": per, "where": checked.where if checked else ""}


def track_checks(checks: dict[str, Any], scenarios: list[str]) -> dict[str, Any]:
    """One track's share of its directory's `checks`: its scenarios' cells added up, and where verify ran."""
    per = [checks["scenarios"][s] for s in scenarios if s in checks["scenarios"]]
    return {**{k: sum(c[k] for c in per) for k in ("cells", "reproduced", "sealed", "unverified")},
            "where": checks["where"]}


def check_folders(root: str | Path, current: Info | None = None, standard: str | None = None) -> Loaded:
    """Every suite directory under root with its records, each read and checked (records, pages.json against
    them, their shared metric schema, every reference in every suite's notes) before anything is written: one
    bad directory is refused in one line (ValueError) and leaves every directory as it was; so is a `standard`
    suite (`leakbench site --standard`) that no directory holds."""
    root = Path(root)
    dirs = sorted(d for d in root.iterdir() if (d / "results.json").is_file())
    if not dirs:
        raise FileNotFoundError(f"no suite directories with results.json under {root}")
    loaded = []
    for d in dirs:
        records = load_records(d)
        load_pages(d, records)   # checked here against the records, read again by page_info
        try:
            schema_of(records)
        except ValueError as err:
            raise ValueError(f"{d / 'results.json'}: {err}") from None
        for suite in dict.fromkeys(r["suite"] for r in records):
            resolve(page_info(suite, d, current).get("notes", ""), [r for r in records if r["suite"] == suite], suite)
        loaded.append((d, records))
    held = {r["suite"] for _, records in loaded for r in records}
    if standard is not None and standard not in held:
        raise ValueError(f"--standard {standard!r}: no folder under {root} holds that suite; name one of "
                         f"{', '.join(sorted(held))}")
    return loaded


def _named(entries: list[dict[str, Any]], suite: str) -> dict[str, Any] | None:
    """The directory holding `suite` alone, the one named after it first (a copy elsewhere never takes its place)."""
    return min((e for e in entries if e["suites"] == [suite]), key=lambda e: (e["name"] != suite, e["name"]),
               default=None)


def build_site(root: str | Path, current: Info | None = None, generated: str | None = None,
               stale: Stale | None = None, loaded: Loaded | None = None,
               verifications: dict[Path, Checked] | None = None, standard: str = STANDARD) -> Path:
    """Re-render every suite directory under root and write root/index.html, the front page; `current` gives a
    suite's page info as its definition has it now (the CLI passes the built-in suites'); `generated` is the
    date the pages print; `loaded` what check_folders read (read here when not given); `verifications` what
    `leakbench verify` re-checked per directory; `standard` the suite whose grid and summary head the front
    page (`make demo` builds the main job's site with the default suite there)."""
    root = Path(root)
    loaded = check_folders(root, current) if loaded is None else loaded
    verifications = verifications or {}
    entries = [rerender(d, current, generated, records, stale, verifications.get(d)) for d, records in loaded]
    board = overview(entries)
    head = _named(entries, standard)
    core = grid(head["name"], head["records"], head["infos"][standard]) if head else None
    summary = summarize(head["name"], head["records"], head["infos"][standard]) if head else None
    for track in summary["tracks"] if summary else []:
        track["checks"] = track_checks(head["checks"], track["scenarios"])
    sweep = _named(entries, FRONTIER)
    html = env().get_template("site.html.j2").render(
        entries=entries, board=board, core=core, summary=summary,
        tracks=[track_panels(head["name"], t) for t in summary["tracks"]] if summary else [],
        frontier=frontier(sweep["name"], sweep["records"], sweep["infos"][FRONTIER]) if sweep else None,
        generated=generated, bands=band_rows(), provenance=provenance([r for e in entries for r in e["records"]]))
    (root / "index.html").write_text(html)
    written = root / "summary.json"
    if summary:
        written.write_text(json.dumps(as_json(summary), indent=1, allow_nan=False) + "\n")
    elif written.is_file():
        written.unlink()   # no standard suite here: no summary of one survives
    return root / "index.html"
