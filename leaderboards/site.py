"""The committed leaderboards as one site: each suite directory re-rendered from its stored
results (nothing is rerun) and a front page that is the leaderboard: every defense across every
suite, the worst case per attack family with its verdict band, utility and HE cost, each cell
linking to the suite and scenario it comes from (leaderboards/overview.py), then the suite list.
Above it, from the standard suite: a one-screen summary (leaderboards/summary.py) of the core grid
(leaderboards/grid.py), and from the sweep suite the privacy-utility frontier (leaderboards/frontier.py).

    leakbench site leaderboards/results [--date YYYY-MM-DD]

A suite's page info comes from its current definition when the caller passes one (the CLI: the
built-in suite's TOML, so corrected notes reach the page), else from the directory's pages.json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from leaderboards.export import load_pages, load_records
from leaderboards.frontier import frontier
from leaderboards.grid import grid
from leaderboards.notes import resolve
from leaderboards.ordering import RULE
from leaderboards.overview import overview
from leaderboards.render import band_rows, env, provenance, render
from leaderboards.safe import site_href
from leaderboards.schema import described
from leaderboards.summary import summarize

STANDARD = "core"   # the suite whose grid heads the front page: every defense x every applicable attack
FRONTIER = "frontier"   # the suite whose sweeps draw the front page's privacy-utility frontier
Info = Callable[[str], "dict[str, Any] | None"]   # a suite's current page info, None when it has none
# records -> each one's components computed by other code than the running code's (bench/run/version.py's staleness)
Stale = Callable[[list], "dict[str, list[str]]"]


def page_info(suite: str, directory: Path, current: Info | None = None) -> dict[str, Any]:
    """The suite's current page info where the caller has it (a built-in suite's TOML) over what pages.json
    stored (facts only a run knows, such as the grid points no defense applies to, stay as stored)."""
    stored = load_pages(directory).get(suite, {})
    info = current(suite) if current is not None else None
    if info is None:
        return stored
    return stored | {k: v for k, v in info.items() if v or k not in stored}   # an empty current fact keeps the run's


def rerender(directory: str | Path, current: Info | None = None, generated: str | None = None,
             records: list[dict[str, Any]] | None = None, stale: Stale | None = None) -> dict[str, Any]:
    """Re-render one output directory from its results.json (or the `records` already read from it); a summary
    for the front page. `stale` says which components of each record differ from today's code."""
    directory = Path(directory)
    records = load_records(directory) if records is None else records
    suites = list(dict.fromkeys(r["suite"] for r in records))
    infos = {s: page_info(s, directory, current) for s in suites}
    render(records, infos, directory, home="../index.html", generated=generated,
           stale=None if stale is None else stale(records))
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "blocked", "diverged", "failed")}
    info = infos[suites[0]] if suites else {}
    return {"name": directory.name, "href": site_href(directory.name), "suites": suites,
            "description": info.get("description", ""), "cells": len(records), "records": described(records),
            "paper": bool(info.get("paper")), "scenarios": len({r["scenario"] for r in records}), "infos": infos,
            **counts}


def build_site(root: str | Path, current: Info | None = None, generated: str | None = None,
               stale: Stale | None = None) -> Path:
    """Re-render every suite directory under root and write root/index.html, the front page; `current` gives a
    suite's page info as its definition has it now (the CLI passes the built-in suites'); `generated` is the
    date the pages print. Every directory's results.json and pages.json are read and checked before any page is
    written: one bad directory leaves the others as they were."""
    root = Path(root)
    dirs = sorted(d for d in root.iterdir() if (d / "results.json").is_file())
    if not dirs:
        raise FileNotFoundError(f"no suite directories with results.json under {root}")
    loaded = [(d, load_records(d), load_pages(d)) for d in dirs]   # pages.json checked here, read by page_info
    for d, records, _ in loaded:   # every reference in every suite's notes resolves, before any page is written
        for suite in dict.fromkeys(r["suite"] for r in records):
            resolve(page_info(suite, d, current).get("notes", ""), [r for r in records if r["suite"] == suite], suite)
    entries = [rerender(d, current, generated, records, stale) for d, records, _ in loaded]
    board = overview(entries)
    standard = next((e for e in entries if e["suites"] == [STANDARD]), None)
    core = grid(standard["name"], standard["records"], standard["infos"][STANDARD]) if standard else None
    sweep = next((e for e in entries if e["suites"] == [FRONTIER]), None)
    html = env().get_template("site.html.j2").render(
        entries=entries, board=board, core=core, summary=summarize(core) if core else None, rule=RULE,
        frontier=frontier(sweep["name"], sweep["records"], sweep["infos"][FRONTIER]) if sweep else None,
        generated=generated, bands=band_rows(), provenance=provenance([r for e in entries for r in e["records"]]))
    (root / "index.html").write_text(html)
    return root / "index.html"
