"""Exports beside each page, and reading them back.

results.json: one object per cell with its config, environment (package version, code
fingerprint), status, reason, metrics and details. results.csv: one row per cell with the
parameters flattened into columns (scenario.*, defense.*, attack.*) and one column per metric.
pages.json: each suite's page info (notes, figures, paper rows), so a directory re-renders alone.
`load_frame` reads either file into a pandas DataFrame; `compare` diffs two output directories.
Every record read back is checked first (bench/protocol/records.py): an export is a file anyone can edit.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.protocol.records import VOLATILE_ENV, check_record, verified

RECORD_KEYS = ("cell_id", "suite", "scenario", "defense", "defense_params", "attack", "attack_params", "status",
               "reason", "metrics", "details", "config", "environment")
IDENTITY = ("cell_id", "suite", "scenario", "defense", "attack", "status", "metrics")   # what every record must hold


def flat(rec: dict[str, Any]) -> dict[str, Any]:
    """One flat row: identity, status, flattened parameters and scenario config, metrics."""
    row = {k: rec.get(k) for k in ("cell_id", "suite", "scenario", "defense", "attack", "status", "reason")}
    for prefix, params in (("defense", rec.get("defense_params", {})), ("attack", rec.get("attack_params", {}))):
        row.update({f"{prefix}.{k}": v for k, v in sorted(params.items())})
    scenario = (rec.get("config") or {}).get("scenario", {})
    row.update({f"scenario.{k}": (json.dumps(v, sort_keys=True) if isinstance(v, dict) else v)
                for k, v in sorted(scenario.items()) if k != "name"})
    env = rec.get("environment") or {}
    row.update({f"env.{k}": env[k] for k in ("leakbench", "fingerprint") if k in env})
    row.update(rec.get("metrics", {}))
    return row


def write_exports(records: list[dict[str, Any]], infos: dict[str, dict[str, Any]], out: Path) -> None:
    import pandas as pd

    slim = [{k: r[k] for k in RECORD_KEYS if k in r} for r in records]
    for rec in slim:
        if rec.get("environment"):
            rec["environment"] = {k: v for k, v in rec["environment"].items() if k not in VOLATILE_ENV}
    (out / "results.json").write_text(json.dumps(slim, indent=1, sort_keys=True, default=str) + "\n")
    pd.DataFrame([flat(r) for r in slim]).to_csv(out / "results.csv", index=False)
    (out / "pages.json").write_text(json.dumps(infos, indent=1, sort_keys=True) + "\n")


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of results.json (or of an output directory's), checked: a file that is not an export, or holds
    a record that cannot be trusted (bench/protocol/records.py), is reported in one line, never half read."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results at {path}; pass an output directory of `leakbench run` or its "
                                "results.json")
    records = _json(path)
    bad = "it is not a list of records" if not isinstance(records, list) else next(
        (f"record {i} lacks {', '.join(k for k in IDENTITY if k not in r) if isinstance(r, dict) else 'everything'}"
         for i, r in enumerate(records) if not isinstance(r, dict) or any(k not in r for k in IDENTITY)), None)
    if bad:
        raise ValueError(f"{path} is not a LeakBench export ({bad}); restore it from git or move it aside")
    return [check_record(rec, str(path), i) for i, rec in enumerate(records)]


def load_pages(directory: str | Path, records: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """pages.json of an output directory (each suite's page info), {} where there is none; with the directory's
    `records`, each suite's info is checked against them (`check_pages`)."""
    path = Path(directory) / "pages.json"
    if not path.is_file():
        return {}
    pages = _json(path)
    if not isinstance(pages, dict) or not all(isinstance(v, dict) for v in pages.values()):
        raise ValueError(f"{path} is not a LeakBench pages file (expected suite -> page info); restore it from git "
                         "or move it aside")
    if records is not None:
        check_pages(path, pages, records)
    return pages


def check_pages(path: Path, pages: dict[str, dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Each suite's page info as a page reads it: its words are text, and every figure and paper row is a table
    naming what the suite's records hold (as a suite file's are checked at load: leaderboards/figures.py), so a
    bad pages.json is refused in one line (ValueError) before anything is rendered or written."""
    from bench.evaluation.pages import check_figure
    from bench.evaluation.pages import check_paper
    from bench.evaluation.tracks import check_tracks

    for suite, info in pages.items():
        where = f"{path}: suite {suite!r}"
        for key in ("description", "notes"):
            if not isinstance(info.get(key, ""), str):
                raise ValueError(f"{where}: {key} is {type(info[key]).__name__}, not text; restore it from git")
        known = known_columns([r for r in records if r["suite"] == suite])
        try:   # its structure: a run with --only holds records of some of the tracks' scenarios only
            check_tracks(info.get("tracks"), None)
        except ValueError as err:
            raise ValueError(f"{where} {err}; fix it or restore the file from git") from None
        for kind, check in (("figures", check_figure), ("paper", check_paper)):
            specs = info.get(kind, [])
            if not isinstance(specs, list):
                raise ValueError(f"{where}: {kind} is {type(specs).__name__}, not a list; restore it from git")
            for i, spec in enumerate(specs):
                try:
                    check(spec, known)
                except ValueError as err:
                    raise ValueError(f"{where} {kind}[{i}]: {err}; fix it or restore the file from git") from None


def known_columns(records: list[dict[str, Any]]) -> dict[str, set[str]]:
    """What a figure or paper row over these records may name (bench/run/mistakes.py's known_names, for stored
    records): their scenarios, defenses, attacks, metrics, and the parameters they set."""
    metrics = {k for r in records for k in r["metrics"]}
    params = {k for r in records for kind in ("defense_params", "attack_params") for k in r.get(kind) or {}}
    return {"scenario": {r["scenario"] for r in records}, "defense": {r["defense"] for r in records},
            "attack": {r["attack"] for r in records}, "metric": metrics,
            "column": metrics | params | {"scenario", "defense", "attack"}}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); restore it from git or move it aside") from None


def load_frame(path: str | Path):
    """results.json (or an output directory) as a DataFrame: one row per cell, parameters and metrics as columns."""
    import pandas as pd
    return pd.DataFrame([flat(r) for r in load_records(path)])


def compare(a: str | Path, b: str | Path) -> list[dict[str, Any]]:
    """Per-cell metric deltas (b - a) for cells present in both, matched by cell id; status changes too."""
    return differences(a, b)[0]


def differences(a: str | Path, b: str | Path) -> tuple[list[dict[str, Any]], int]:
    """`compare`'s rows and how many cells the two directories share; none shared is refused (ValueError): two
    unrelated directories would otherwise read as "no difference". A row of a cell unverified on either side (no
    valid digest: bench/protocol/records.py) is marked so in its label."""
    left = {r["cell_id"]: r for r in load_records(a)}
    right = load_records(b)
    common = [rec for rec in right if rec["cell_id"] in left]
    if not common:
        raise ValueError(f"{a} and {b} share no cell (matched by cell id: {len(left)} and {len(right)} cells); "
                         "compare two runs of the same suite or scenarios")
    rows = []
    for rec in common:
        old = left[rec["cell_id"]]
        label = f"{rec['scenario']}/{rec['defense']}/{rec['attack']}" + (
            "" if verified(old) and verified(rec) else " [unverified]")   # the reading rule: marked, not trusted
        if old["status"] != rec["status"]:
            rows.append({"cell": label, "metric": "status", "a": old["status"], "b": rec["status"], "delta": None})
        for key in sorted(set(old["metrics"]) & set(rec["metrics"])):
            x, y = old["metrics"][key], rec["metrics"][key]
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x != y:
                rows.append({"cell": label, "metric": key, "a": x, "b": y, "delta": y - x})
    return rows, len({rec["cell_id"] for rec in common})
