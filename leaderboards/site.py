"""The committed leaderboards as one site: each suite directory re-rendered from its stored
results (nothing is rerun) and a landing page linking them.

    leakbench site leaderboards/results

A suite's page info comes from its built-in TOML when the suite is registered (so corrected
notes reach the page), else from the directory's pages.json.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from leaderboards.export import load_records
from leaderboards.render import _env, render


def page_info(suite: str, directory: Path) -> dict[str, Any]:
    from bench.registry import SUITES
    from bench.spec import load_suite

    if suite in SUITES:
        loaded = load_suite(suite)
        info = loaded.page_info()
        info["scenarios"] = {s.name: _asdict(s) for s in loaded.scenarios}
        return info
    stored = directory / "pages.json"
    return json.loads(stored.read_text()).get(suite, {}) if stored.is_file() else {}


def _asdict(scenario) -> dict[str, Any]:
    import dataclasses
    return dataclasses.asdict(scenario)


def rerender(directory: str | Path) -> dict[str, Any]:
    """Re-render one output directory from its results.json; a summary for the landing page."""
    directory = Path(directory)
    records = load_records(directory)
    suites = list(dict.fromkeys(r["suite"] for r in records))
    render(records, {s: page_info(s, directory) for s in suites}, directory)
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "blocked", "diverged", "failed")}
    info = page_info(suites[0], directory) if suites else {}
    return {"name": directory.name, "href": f"{directory.name}/index.html", "suites": suites,
            "description": info.get("description", ""), "cells": len(records),
            "scenarios": len({r["scenario"] for r in records}), **counts}


def build_site(root: str | Path) -> Path:
    """Re-render every suite directory under root and write root/index.html linking them."""
    root = Path(root)
    dirs = sorted(d for d in root.iterdir() if (d / "results.json").is_file())
    if not dirs:
        raise FileNotFoundError(f"no suite directories with results.json under {root}")
    entries = [rerender(d) for d in dirs]
    html = _env().get_template("site.html.j2").render(entries=entries)
    (root / "index.html").write_text(html)
    return root / "index.html"
