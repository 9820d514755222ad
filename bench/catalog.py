"""What `leakbench list` prints, without importing torch: a catalog of every registered thing.

Building it imports every package (seconds); it is cached under $LEAKBENCH_CACHE (default
~/.cache/leakbench) keyed by the code fingerprint, the built-in suite files, the installed plugins'
entry points and each plugin's distribution, version and source hash (the key of a cell's
fingerprint, bench/run/version.py), so it is rebuilt exactly when one of them changes. Defenses and
attacks list their parameters with defaults; attacks their family and threat model; metrics their kind,
unit and direction. The plugins refused at load are kept with it, one line each, for `leakbench list` to print.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from bench.run.version import ROOT, code_fingerprint, installed_plugins

KIND_NAMES = ("datasets", "models", "defenses", "attacks", "metrics", "suites")


def cache_dir() -> Path:
    return Path(os.environ.get("LEAKBENCH_CACHE") or Path.home() / ".cache" / "leakbench")


def catalog_key() -> str:
    digest = hashlib.sha256(code_fingerprint().encode())
    for path in sorted((ROOT / "leaderboards" / "suites").glob("*.toml")):
        digest.update(path.name.encode() + path.read_bytes())
    for kind in KIND_NAMES:
        for ep in sorted(entry_points(group=f"leakbench.{kind}"), key=lambda e: e.name):
            digest.update(f"{kind}:{ep.name}={ep.value}".encode())
    for dist, version in installed_plugins().items():
        digest.update(f"plugin:{dist}={version}".encode())
    return digest.hexdigest()[:16]


def _params(obj: Any) -> dict[str, str]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return {}
    return {n: ("required" if p.default is inspect.Parameter.empty else repr(p.default))
            for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def build() -> dict[str, list[Any]]:
    from bench.registry import KINDS, refusals

    out: dict[str, list[Any]] = {"refused": refusals()}
    for kind in KIND_NAMES:
        rows = []
        for entry in KINDS[kind].entries():
            row: dict[str, Any] = {"name": entry.name, "description": entry.description}
            if kind in ("defenses", "attacks"):
                row["params"] = _params(entry.obj)
            if kind == "attacks":
                row["family"] = getattr(entry.obj, "family", "")
                row["threat_model"] = getattr(entry.obj, "threat_model", "passive")
            if kind == "metrics":
                m = entry.obj
                row.update(kind=m.kind, unit=m.unit, better={"↓": "lower", "↑": "higher"}.get(m.arrow, "-"))
            rows.append(row)
        out[kind] = rows
    return out


def load() -> dict[str, list[Any]]:
    """The cached catalog for the running code, built (and cached where writable) when missing."""
    path = cache_dir() / f"catalog-{catalog_key()}.json"
    if path.is_file():
        return json.loads(path.read_text())
    data = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:  # a read-only home still lists, just not fast next time
        pass
    return data


def lines(kind: str) -> list[str]:
    out = []
    for row in load()[kind]:
        if kind == "metrics":
            unit = row["unit"] or "-"
            out.append(f"{row['name']:24s} {row['kind']:8s} unit {unit:5s} {row['better']:6s} {row['description']}")
            continue
        family = f" [{row['family']}]" if row.get("family") else ""
        threat = f" (threat model: {row['threat_model']})" if row.get("threat_model") else ""
        out.append(f"{row['name']:24s} {row['description']}{family}{threat}")
        if row.get("params"):
            out.append(" " * 25 + ", ".join(f"{k}={v}" for k, v in row["params"].items()))
    return out
