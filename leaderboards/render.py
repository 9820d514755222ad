"""Leaderboards rendered from the store only: results.json, results.csv, index.html, plots.

Output is deterministic for a given store (no timestamps, stable ordering, PNGs without
metadata) so it can be snapshot-tested. Tables: one per scenario, defenses as rows,
each attack's privacy columns, then utility and cost; blocked cells show their reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from bench.registry import METRICS
from bench.store import Store
from leaderboards.figures import draw

TEMPLATES = Path(__file__).parent / "templates"
RECORD_KEYS = ("cell_id", "suite", "scenario", "defense", "defense_params", "attack", "attack_params", "status",
               "reason", "metrics", "details")
PRIMARY_PRIVACY = ("psnr", "lnacc", "leacc", "label_acc", "kde_mi")


@dataclass(frozen=True)
class Column:
    key: str          # metric name
    attack: str | None
    header: str
    unit: str
    arrow: str
    lower_is_better: bool | None


def defense_label(rec: dict[str, Any]) -> str:
    params = rec["defense_params"]
    return rec["defense"] + ("(" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")" if params else "")


def attack_label(rec: dict[str, Any]) -> str:
    params = rec["attack_params"]
    return rec["attack"] + ("(" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")" if params else "")


def scenario_table(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Columns and rows of one scenario's table."""
    schema = {e.name: e.obj for e in METRICS.entries()}
    attacks = list(dict.fromkeys(attack_label(r) for r in records))
    columns: list[Column] = []
    for att in attacks:
        present = {k for r in records if attack_label(r) == att for k in r["metrics"]}
        before = len(columns)
        for name, m in schema.items():
            if m.kind == "privacy" and name in present:
                columns.append(Column(name, att, f"{att} · {name}", m.unit, m.arrow, m.lower_is_better))
        if len(columns) == before:  # no metric (e.g. every cell failed): a status column keeps its reasons visible
            columns.append(Column("status", att, f"{att} · status", "", "", None))
    present = {k for r in records for k in r["metrics"]}
    for kind in ("utility", "cost"):
        for name, m in schema.items():
            if m.kind == kind and name in present:
                columns.append(Column(name, None, name, m.unit, m.arrow, m.lower_is_better))
    rows = []
    for dlabel in dict.fromkeys(defense_label(r) for r in records):
        mine = [r for r in records if defense_label(r) == dlabel]
        by_attack = {attack_label(r): r for r in mine}
        run = next((r for r in mine if r["metrics"]), mine[0])
        cells = []
        for col in columns:
            rec = by_attack.get(col.attack) if col.attack else run
            cells.append(_cell(rec, col, schema))
        rows.append({"defense": dlabel, "topology": run["details"].get("key_topology", ""),
                     "colluders": run["details"].get("decrypts_single_upload", ""), "cells": cells})
    return {"columns": columns, "rows": rows}


def clear_not_attacked(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per defense: metadata its uploads' views carried (sent in the clear) that no attack read."""
    out: dict[str, list[str]] = {}
    for dlabel in dict.fromkeys(defense_label(r) for r in records):
        listed: dict[str, int] = {}
        read: set[str] = set()
        for rec in records:
            if defense_label(rec) == dlabel:
                for item in rec["details"].get("sent_in_clear", []):
                    listed[item["key"]] = item["bytes"]
                    if item["attacked"]:
                        read.add(item["key"])
        missed = [f"{key} ({size} B)" for key, size in listed.items() if key not in read]
        if missed:
            out[dlabel] = missed
    return out


def _cell(rec: dict[str, Any] | None, col: Column, schema) -> dict[str, Any]:
    if rec is None:
        return {"text": "", "sort": "", "cls": ""}
    if col.attack and rec["status"] != "ok":
        return {"text": rec["reason"] or rec["status"], "sort": "", "cls": rec["status"]}
    if col.key == "status":
        return {"text": rec["status"], "sort": "", "cls": ""}
    value = rec["metrics"].get(col.key)
    text = schema[col.key].format(value)
    sort = value if isinstance(value, (int, float)) else ""
    return {"text": text, "sort": sort, "cls": "na" if isinstance(value, str) else ""}


def _plot(records: list[dict[str, Any]], path: Path) -> str | None:
    """Privacy vs upload cost per defense (Pareto view); None when nothing to plot."""
    points = []
    for rec in records:
        m = rec["metrics"]
        key = next((k for k in PRIMARY_PRIVACY if isinstance(m.get(k), (int, float))), None)
        if key and isinstance(m.get("upload_bytes"), (int, float)) and rec["status"] == "ok":
            points.append({"defense": defense_label(rec), "upload_bytes": m["upload_bytes"],
                           "privacy": m[key], "metric": f"{attack_label(rec)} · {key}"})
    if not points:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(points)
    metrics = frame["metric"].unique()
    fig, ax = plt.subplots(figsize=(9, max(3.6, 0.2 * frame["defense"].nunique() + 1)))
    sns.scatterplot(data=frame, x="upload_bytes", y="privacy", hue="defense",
                    style="metric" if len(metrics) > 1 else None, s=70, ax=ax)
    ax.set_xscale("log")
    ax.set_xlabel("upload bytes per client per round (log)")
    ax.set_ylabel(metrics[0] if len(metrics) == 1 else "leakage (see legend)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path.name


def file_stem(text: str) -> str:
    """A name safe to join under --out: names from an older store may hold '/', '..' or be very long."""
    import hashlib
    import re
    safe = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._+-]+", "-", text)).lstrip(".-")
    if safe == text and len(text) <= 120:
        return text
    return f"{safe[:60]}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def write_outputs(store: Store, out_dir: str | Path) -> Path:
    """Write results.json, results.csv, index.html and plots for every suite in the store."""
    import pandas as pd

    out = Path(out_dir)
    records = store.records()
    slim = [{k: r[k] for k in RECORD_KEYS} for r in records]
    (out / "results.json").write_text(json.dumps(slim, indent=1, sort_keys=True, default=str) + "\n")
    flat = [{**{k: (json.dumps(r[k], sort_keys=True) if isinstance(r[k], dict) else r[k])
                for k in RECORD_KEYS if k not in ("metrics", "details")}, **r["metrics"]} for r in slim]
    pd.DataFrame(flat).to_csv(out / "results.csv", index=False)
    suites = []
    for suite in dict.fromkeys(r["suite"] for r in records):
        mine = [r for r in records if r["suite"] == suite]
        tables = []
        for scen in dict.fromkeys(r["scenario"] for r in mine):
            recs = [r for r in mine if r["scenario"] == scen]
            plot = _plot(recs, out / "plots" / f"{file_stem(f'{suite}--{scen}')}.png")
            tables.append({"scenario": scen, "config": recs[0]["config"].get("scenario", {}),
                           **scenario_table(recs), "plot": f"plots/{plot}" if plot else None,
                           "unattacked": clear_not_attacked(recs)})
        info = store.suite_info(suite)
        figures = []
        for i, spec in enumerate(info.get("figures", [])):
            name = f"plots/{file_stem(f'{suite}--figure{i}')}.png"
            if draw(spec, mine, out / name):
                figures.append({"path": name, "title": spec.get("title", f"{spec['y']} vs {spec['x']}")})
        failures = [{"label": f"{r['scenario']}/{defense_label(r)}/{attack_label(r)}", "reason": r["reason"]}
                    for r in mine if r["status"] == "failed"]
        suites.append({"name": suite, "tables": tables, "failures": failures, "description": info.get("description", ""),
                       "notes": info.get("notes", ""), "figures": figures})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True)
    html = env.get_template("index.html.j2").render(suites=suites, schema=[e.obj for e in METRICS.entries()])
    (out / "index.html").write_text(html)
    return out / "index.html"
