"""The committed leaderboards as one site: each suite directory re-rendered from its stored
results (nothing is rerun) and a front page that is the leaderboard: every defense across every
suite, the worst case per attack family with its verdict band, utility and HE cost, each cell
linking to the suite and scenario it comes from (leaderboards/overview.py), then the suite list.

    leakbench site leaderboards/results [--date YYYY-MM-DD]

A suite's page info comes from its current definition when the caller passes one (the CLI: the
built-in suite's TOML, so corrected notes reach the page), else from the directory's pages.json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from leaderboards.export import load_pages, load_records
from leaderboards.overview import overview
from leaderboards.render import band_rows, env, provenance, render
from leaderboards.schema import described

Info = Callable[[str], "dict[str, Any] | None"]   # a suite's current page info, None when it has none


def page_info(suite: str, directory: Path, current: Info | None = None) -> dict[str, Any]:
    """The suite's current page info where the caller has it (a built-in suite's TOML), else pages.json."""
    info = current(suite) if current is not None else None
    return info if info is not None else load_pages(directory).get(suite, {})


def rerender(directory: str | Path, current: Info | None = None, generated: str | None = None,
             records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Re-render one output directory from its results.json (or the `records` already read from it); a summary
    for the front page."""
    directory = Path(directory)
    records = load_records(directory) if records is None else records
    suites = list(dict.fromkeys(r["suite"] for r in records))
    infos = {s: page_info(s, directory, current) for s in suites}
    render(records, infos, directory, home="../index.html", generated=generated)
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "blocked", "diverged", "failed")}
    info = infos[suites[0]] if suites else {}
    return {"name": directory.name, "href": f"{directory.name}/index.html", "suites": suites,
            "description": info.get("description", ""), "cells": len(records), "records": described(records),
            "paper": bool(info.get("paper")), "scenarios": len({r["scenario"] for r in records}), **counts}


def build_site(root: str | Path, current: Info | None = None, generated: str | None = None) -> Path:
    """Re-render every suite directory under root and write root/index.html, the front page; `current` gives a
    suite's page info as its definition has it now (the CLI passes the built-in suites'); `generated` is the
    date the pages print. Every directory's results.json and pages.json are read and checked before any page is
    written: one bad directory leaves the others as they were."""
    root = Path(root)
    dirs = sorted(d for d in root.iterdir() if (d / "results.json").is_file())
    if not dirs:
        raise FileNotFoundError(f"no suite directories with results.json under {root}")
    loaded = [(d, load_records(d), load_pages(d)) for d in dirs]   # pages.json checked here, read by page_info
    entries = [rerender(d, current, generated, records) for d, records, _ in loaded]
    board = overview(entries)
    html = env().get_template("site.html.j2").render(
        entries=entries, board=board, generated=generated, bands=band_rows(),
        provenance=provenance([r for e in entries for r in e["records"]]))
    (root / "index.html").write_text(html)
    return root / "index.html"
