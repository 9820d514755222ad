"""Leaderboard pages rendered from stored records only: index.html, plots, and the exports.

Output is deterministic for given records (no timestamps, stable ordering, PNGs without
metadata) so it can be snapshot-tested. One page per output directory, one section per suite
(an index at the top links them), one table per scenario (leaderboards/tables.py), its plots
(leaderboards/plots.py), reconstructions (ground truth next to reconstruction; recovered text
next to its reference), notes as Markdown, declared figures and a paper-vs-ours table.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from leaderboards.export import write_exports
from leaderboards.figures import draw
from leaderboards.paper import paper_rows
from leaderboards.plots import scenario_plots
from leaderboards.tables import attack_label, clear_not_attacked, defense_label, scenario_table

TEMPLATES = Path(__file__).parent / "templates"


def markdown(text: str) -> str:
    import markdown as md
    return md.markdown(text or "", extensions=["tables", "fenced_code"])


def cell_name(rec: dict[str, Any]) -> str:
    return f"{rec['scenario']}/{defense_label(rec)}/{attack_label(rec)}"


def reconstructions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored thumbnails and recovered texts of the scenario's cells."""
    out = []
    for rec in records:
        if rec["status"] != "ok":
            continue
        thumb = rec["details"].get("thumbnail")
        texts = rec["details"].get("texts")
        if thumb or texts:
            pairs = []
            for t in texts or []:
                refs = t.get("matched") or t.get("reference") or []
                pairs += [{"recovered": got, "reference": ref, "same": got == ref}
                          for got, ref in zip(t.get("recovered", []), refs)]
            out.append({"defense": defense_label(rec), "attack": attack_label(rec), "thumbnail": thumb,
                        "texts": pairs})
    return out


def compute_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where and for how long the stored cells were computed: each federated run's wall time once, plus each
    cell's attack time per attacked upload times its uploads, summed; the machines the records name."""
    if not records:
        return None
    runs: dict[str, float] = {}
    attacks = 0.0
    for rec in records:
        env, metrics = rec.get("environment") or {}, rec.get("metrics") or {}
        runs.setdefault(env.get("run_id") or rec["cell_id"], float(metrics.get("wall_s") or 0.0))
        repeats = ((rec.get("config") or {}).get("scenario") or {}).get("attack_repeats", 1)
        attacks += float(metrics.get("attack_s") or 0.0) * repeats
    machines = sorted({f"{(r.get('environment') or {}).get('platform', '?')}, "
                       f"{(r.get('environment') or {}).get('cpus', '?')} CPUs, "
                       f"{(r.get('environment') or {}).get('device', 'cpu')}" for r in records})
    return {"hours": (sum(runs.values()) + attacks) / 3600, "runs": len(runs), "cells": len(records),
            "machines": machines}


def suite_page(suite: str, records: list[dict[str, Any]], info: dict[str, Any], out: Path) -> dict[str, Any]:
    tables = []
    for scen in dict.fromkeys(r["scenario"] for r in records):
        recs = [r for r in records if r["scenario"] == scen]
        table = scenario_table(recs)
        config = next((r["config"]["scenario"] for r in recs if (r.get("config") or {}).get("scenario")),
                      info.get("scenarios", {}).get(scen))
        tables.append({"scenario": scen, "config": config, **table,
                       "plots": scenario_plots(table, recs, out, f"{suite}--{scen}"),
                       "reconstructions": reconstructions(recs), "unattacked": clear_not_attacked(recs)})
    figures = []
    for i, spec in enumerate(info.get("figures", [])):
        name = f"plots/{suite}--figure{i}.png"
        if draw(spec, records, out / name):
            figures.append({"path": name, "title": spec.get("title", f"{spec['y']} vs {spec['x']}")})
    failures = [{"label": cell_name(r), "reason": r["reason"]} for r in records if r["status"] == "failed"]
    return {"name": suite, "tables": tables, "failures": failures, "description": info.get("description", ""),
            "notes": markdown(info.get("notes", "")), "figures": figures,
            "paper": paper_rows(info.get("paper", []), records), "compute": compute_summary(records)}


def render(records: list[dict[str, Any]], infos: dict[str, dict[str, Any]], out_dir: str | Path) -> Path:
    """Write the exports, plots and index.html of these records into out_dir."""
    from bench.registry import METRICS

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / "plots").glob("*.png"):  # plots/ belongs to the renderer: no stale plot survives
        old.unlink()
    write_exports(records, infos, out)
    suites = [suite_page(s, [r for r in records if r["suite"] == s], infos.get(s, {}), out)
              for s in dict.fromkeys(r["suite"] for r in records)]
    title = "LeakBench · " + (suites[0]["name"] if len(suites) == 1 else "leaderboard")
    html = _env().get_template("index.html.j2").render(suites=suites, title=title,
                                                        schema=[e.obj for e in METRICS.entries()])
    (out / "index.html").write_text(html)
    return out / "index.html"


def write_outputs(store, out_dir: str | Path) -> Path:
    """Render every suite in the store."""
    return render(store.records(), {s: store.suite_info(s) for s in store.suites()}, out_dir)


def _env() -> jinja2.Environment:
    def fmt(value: Any, spec: str = "{:.3g}") -> str:
        return "–" if value is None else spec.format(value)

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["num"] = fmt
    return env
