"""Suite definitions (TOML), the leaderboard renderer and its template.

Every `suites/*.toml` file is a built-in suite registered under its file name.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from bench.registry import SUITES

SUITE_DIR = Path(__file__).parent / "suites"

for _path in sorted(SUITE_DIR.glob("*.toml")):
    _desc = tomllib.loads(_path.read_text()).get("description", "")
    SUITES.add(_path.stem, _path, _desc)
