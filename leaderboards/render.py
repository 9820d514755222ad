"""Leaderboard pages rendered from stored records only: index.html, plots, and the exports.

Output is deterministic for given records and arguments (no clock is read here: a generation date
is passed in, stable ordering, PNGs without metadata) so it can be snapshot-tested. One page per
output directory, one section per suite: a header with the way back to the front page (when the
page is part of a site), downloads, generation date and the code that computed the records; a table
of contents; one table per scenario (leaderboards/tables.py) with its plots (leaderboards/plots.py)
and, collapsed, its reconstructions (thumbnails; recovered text beside its reference,
leaderboards/texts.py); the paper-vs-ours table, declared figures and the suite's notes.
Written text reaches the page only as plain text under autoescape or, for notes, through
leaderboards/safe.py's sanitizer; links taken from records through its safe_url.

The reading rule (bench/protocol/records.py `verified`): a record that is not sealed and was not reproduced by
`leakbench verify` is listed under its scenario as unverified, greyed, and takes no part in the table, its
verdicts, ranks, calibration, plots, figures or paper rows; the exports keep it as it was. Every other cell is
marked for what it is (bench/evaluation/verification.py): as computed (sealed: a checksum that catches an
accidental edit, not a forgery) or reproduced by `leakbench verify` on a named machine and date; each scenario
counts both, and a page whose folder was verified lists its verification report.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import jinja2

from bench.protocol.records import verified
from bench.evaluation.exports import write_exports
from bench.evaluation.verification import Checked, counts, mark, tolerance_summary
from leaderboards.figures import draw
from bench.evaluation.formats import human_bytes, human_seconds
from leaderboards.paper import paper_rows
from leaderboards.plots import scenario_plots
from leaderboards.notes import resolve
from leaderboards.safe import notes_html, safe_url, site_href
from bench.evaluation.schema import described, schema_of
from leaderboards.tables import attack_label, clear_not_attacked, defense_label, scenario_table
from leaderboards.texts import recovered_texts
from bench.evaluation.verdicts import BANDS, LEVELS

TEMPLATES = Path(__file__).parent / "templates"
CONFIG_SUMMARY = ("dataset", "model", "num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size",
                  "attack_batch_size", "attack_repeats", "pretrain_epochs")


def cell_name(rec: dict[str, Any]) -> str:
    return f"{rec['scenario']}/{defense_label(rec)}/{attack_label(rec)}"


def anchor(suite: str, scenario: str) -> str:
    """The id of a scenario's section on its suite's page (the front page links to it)."""
    return f"{suite}--{scenario}"


def reconstructions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored thumbnails and recovered texts of the scenario's cells."""
    out = []
    for rec in records:
        if rec["status"] != "ok":
            continue
        thumb = rec["details"].get("thumbnail")
        texts = recovered_texts(rec["details"].get("texts") or [])
        if thumb or texts:
            out.append({"defense": defense_label(rec), "attack": attack_label(rec), "thumbnail": thumb,
                        "texts": texts})
    return out


def copied(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The scenario's cells copied from another output folder (--reuse) rather than computed for this page:
    source folder -> their defense · attack labels."""
    out: dict[str, list[str]] = {}
    for rec in records:
        source = rec["details"].get("copied_from")
        if source:
            out.setdefault(str(source), []).append(f"{defense_label(rec)} · {attack_label(rec)}")
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


def provenance(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which package version and code fingerprint computed how many of the records."""
    seen = Counter(((r.get("environment") or {}).get("leakbench", "?"), (r.get("environment") or {}).get(
        "fingerprint", "?")) for r in records)
    return [{"version": v, "fingerprint": f, "cells": n} for (v, f), n in sorted(seen.items())]


def code_state(records: list[dict[str, Any]], stale: dict[str, list[str]] | None) -> dict[str, Any] | None:
    """What code computed the records, per component (bench/run/version.py): the hashes each component's cells
    carry, and, where `stale` says so (cell id -> components whose code differs from today's, computed by the
    caller against the running code), which cells are stale and which component made them so."""
    if stale is None:
        return None
    hashes: dict[str, Counter] = {}
    by_component: dict[str, list[str]] = {}
    for rec in records:
        config = rec.get("config") or {}
        scenario = config.get("scenario") or {}
        names = {"harness": "harness", "defense": f"defense {rec.get('defense')}",
                 "attack": f"attack {rec.get('attack')}", "dataset": f"dataset {scenario.get('dataset')}",
                 "model": f"model {scenario.get('model')}"}
        for key, value in ((rec.get("environment") or {}).get("components") or {}).items():
            hashes.setdefault(names.get(key, key), Counter())[str(value)] += 1
        for key in stale.get(rec["cell_id"], []):
            by_component.setdefault(names.get(key, key), []).append(cell_name(rec))
    stale_cells = sum(1 for r in records if stale.get(r["cell_id"]))
    return {"cells": len(records), "stale_cells": stale_cells,
            "stale": [{"component": k, "cells": sorted(v)} for k, v in sorted(by_component.items())],
            "components": [{"component": k, "hashes": ", ".join(f"{h} ({n})" for h, n in sorted(c.items()))}
                           for k, c in sorted(hashes.items())]}


def _config(config: dict[str, Any] | None) -> str:
    if not config:
        return ""
    return " · ".join(f"{k.replace('_', ' ')} {config[k]}" for k in CONFIG_SUMMARY if config.get(k) not in (None, ""))


def unverified_rows(records: list[dict[str, Any]], schema) -> list[dict[str, Any]]:
    """Records a page lists without judging them (the reading rule): who, status and their values as stored."""
    return [{"defense": defense_label(r), "attack": attack_label(r), "status": r["status"], "reason": r["reason"],
             "stored": " · ".join(f"{schema[k].header} {schema[k].format(v)}" if k in schema else f"{k} {v}"
                                  for k, v in r["metrics"].items() if v is not None)} for r in records]


def suite_page(suite: str, records: list[dict[str, Any]], info: dict[str, Any], out: Path,
               stale: dict[str, list[str]] | None = None, checked: Checked | None = None) -> dict[str, Any]:
    """One suite's section; `checked`: what `leakbench verify` reproduced (the reading rule) and where."""
    reproduced = checked.reproduced if checked is not None else {}
    tables = []
    everything, records = records, [r for r in records if verified(r, reproduced)]
    schema = schema_of(everything)
    tally = counts(everything, checked)
    for scen in dict.fromkeys(r["scenario"] for r in everything):
        recs = [r for r in records if r["scenario"] == scen]
        table = scenario_table(recs, info)
        marks = {r["cell_id"]: mark(r, checked) for r in recs}
        for row in table["rows"]:
            for cell in row["cells"]:
                cell["check"] = marks.get(cell.get("cell_id"))
        config = next((r["config"]["scenario"] for r in everything if r["scenario"] == scen and
                       (r.get("config") or {}).get("scenario")), info.get("scenarios", {}).get(scen))
        recon = reconstructions(recs)
        texts = [r["texts"] for r in recon if r["texts"]]
        tables.append({"scenario": scen, "id": anchor(suite, scen), "config": config, "summary": _config(config),
                       **table, "plots": scenario_plots(table, recs, out, f"{suite}--{scen}"),
                       "reconstructions": recon, "unattacked": clear_not_attacked(recs), "copied": copied(recs),
                       "not_applicable": (info.get("not_applicable") or {}).get(scen, {}),
                       "unverified": unverified_rows([r for r in everything if r["scenario"] == scen and
                                                      not verified(r, reproduced)], schema),
                       "checks": tally[scen],
                       "text_summary": (f"{sum(t['exact'] for t in texts)}/{sum(t['total'] for t in texts)} "
                                        "sentences exact") if texts else "",
                       "thumbs": sum(1 for r in recon if r["thumbnail"])})
    figures = []
    for i, spec in enumerate(info.get("figures", [])):
        name = f"plots/{suite}--figure{i}.png"
        if draw(spec, records, out / name):
            figures.append({"path": name, "title": spec.get("title", f"{spec['y']} vs {spec['x']}")})
    failures = [{"label": cell_name(r), "reason": r["reason"]} for r in records if r["status"] == "failed"]
    paper = paper_rows(info.get("paper", []), records)
    for row in paper:
        row["href"] = f"#{anchor(suite, row['scenario'])}" if row["scenario"] else ""
    return {"name": suite, "tables": tables, "failures": failures, "description": info.get("description", ""),
            "notes": notes_html(resolve(info.get("notes", ""), everything, suite,
                                        lambda r: verified(r, reproduced))),
            "figures": figures, "paper": paper, "paper_notes": any(p["note"] for p in paper),
            "provenance": provenance(everything), "compute": compute_summary(everything),
            "code": code_state(everything, stale), "unverified": len(everything) - len(records),
            "checks": {k: sum(t[k] for t in tally.values()) for k in ("cells", "reproduced", "sealed", "unverified")},
            "counts": Counter(r["status"] for r in everything)}


def render(records: list[dict[str, Any]], infos: dict[str, dict[str, Any]], out_dir: str | Path,
           home: str | None = None, generated: str | None = None, stale: dict[str, list[str]] | None = None,
           checked: Checked | None = None) -> Path:
    """Write the exports, plots and index.html of these records into out_dir. `home` is the front page's
    address relative to out_dir (a site's pages link back to it); `generated` the date to print; `stale` each
    cell's components computed by other code than today's (`code_state`); `checked` what `leakbench verify`
    re-checked there (bench/evaluation/verification.py), whose report the page lists."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / "plots").glob("*.png"):  # plots/ belongs to the renderer: no stale plot survives
        old.unlink()
    write_exports(records, infos, out)   # every record, shown or not: re-rendering never drops a result
    records = described(records)
    suites = [suite_page(s, [r for r in records if r["suite"] == s], infos.get(s, {}), out, stale, checked)
              for s in dict.fromkeys(r["suite"] for r in records)]
    title = "LeakBench · " + (suites[0]["name"] if len(suites) == 1 else "leaderboard")
    html = env().get_template("index.html.j2").render(
        suites=suites, title=title, schema=list(schema_of(records).values()), home=home, generated=generated,
        provenance=provenance(records), bands=band_rows(), levels=LEVELS, checked=checked,
        report=verification_rows(checked))
    (out / "index.html").write_text(html)
    return out / "index.html"


def verification_rows(checked: Checked | None) -> list[dict[str, Any]]:
    """The verification report as a page lists it: each re-checked cell, its outcome, why it was chosen, the
    tolerances it was compared at."""
    if checked is None:
        return []
    return [{"label": o["label"], "state": o["state"], "chosen": o["chosen"], "why": o["why"],
             "tolerance": tolerance_summary(o["tolerances"]), "seconds": o["seconds"]} for o in checked.outcomes]


def band_rows() -> list[dict[str, Any]]:
    """The verdict bands as a page lists them (bench/evaluation/verdicts.py)."""
    return [{"metric": m, "leak": b.leak, "partial": b.partial, "words": b.words} for m, b in BANDS.items()]


def write_outputs(store, out_dir: str | Path, stale: dict[str, list[str]] | None = None,
                  generated: str | None = None) -> Path:
    """Render every suite in the store; `generated`: the date the page prints."""
    return render(store.records(), {s: store.suite_info(s) for s in store.suites()}, out_dir, stale=stale,
                  generated=generated)


def env() -> jinja2.Environment:
    def fmt(value: Any, spec: str = "{:.3g}") -> str:
        return "–" if value is None else spec.format(value)

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                                     lstrip_blocks=True)
    environment.filters["num"] = fmt
    environment.filters["bytes"] = human_bytes
    environment.filters["seconds"] = human_seconds
    environment.filters["safe_url"] = safe_url     # every href taken from a record (leaderboards/safe.py)
    environment.filters["site_href"] = site_href
    return environment

