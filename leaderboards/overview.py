"""The front page's table: every defense across every committed suite, one column per attack family.

A family column is whatever families the records carry (reference rows, the floors, excluded). Its
cell is the worst case for the defended client measured anywhere: over every suite, scenario,
configuration of the defense and attack of that family, the headline metric (the first of
tables.HEADLINE the family reports, else its first privacy metric) at its worst, with the verdict
band (bench/evaluation/verdicts.py) of the family's banded metrics at their worst, and a link to the
suite and scenario it comes from. "Blocked by design" only where every attack of the family was
blocked wherever the defense met one.

Utility cost: the largest drop of the scenario's utility metric (accuracy, else perplexity, else
the first utility metric with a direction) below the best row of the same scenario, only in scenarios
that measure utility (bench/evaluation/usefulness.py: the undefended model learns); scenarios with one
defense (however many of its settings) say nothing, and a diverged training reads "diverged at round r".
HE cost: per model, the largest homomorphic-encryption time per round (encrypt + aggregate + decrypt) and
that cell's upload size against the scenario's leanest: a cost depends on the model it encrypts, so one
defense's cost on SmolLM2 never stands beside another's on ResNet-18 as if they compared (the track summaries
give each track's cost on its own model). Utility and HE cost are read from every record of a
defense; only verdicts need a calibrated attack. The untrained model (page info `untrained`) is a
yardstick, not a defense: it has no row.
"""
from __future__ import annotations

import math
from typing import Any

from bench.evaluation.calibration import calibrate, calibrated
from bench.evaluation.formats import is_number, number
from leaderboards.safe import site_href
from bench.evaluation.schema import family, schema_of
from bench.evaluation.usefulness import measures_utility, useless
from bench.evaluation.utility_loss import diverged_round, diverged_text
from leaderboards.tables import FAMILY_ORDER, HEADLINE, attack_label, defense_label, sources
from bench.evaluation.verdicts import BANDS, LEVELS, Verdict, band, worst

UTILITY = ("accuracy", "perplexity", "lm_loss")
HE_TIME = ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s")

DIVERGED_COST = 1e300   # a diverged row's relative cost: worst of all, and a number a browser's sort reads (not 'inf')


def _where(entry: dict[str, Any], rec: dict[str, Any]) -> dict[str, str]:
    label = defense_label(rec)
    return {"href": site_href(entry["name"], fragment=f"{rec['suite']}--{rec['scenario']}"),
            "where": f"{rec['suite']} / {rec['scenario']}", "config": label,
            "params": label[len(rec["defense"]):].strip("()")}


def _headline(recs: list[dict[str, Any]], schema) -> str | None:
    numeric = {k for r in recs if r["status"] == "ok" for k, v in r["metrics"].items()
               if is_number(v) and k in schema and schema[k].kind == "privacy"}
    ranked = [k for k in HEADLINE if k in numeric] or sorted(numeric)
    return ranked[0] if ranked else None


def _family_cell(mine: list[tuple[dict, dict]], key: str, shown, banded: list[str], schema,
                 unjudged: list[tuple[dict, dict]] = ()) -> dict[str, Any]:
    ok = [(e, r) for e, r in mine if r["status"] == "ok" and is_number(r["metrics"].get(key))]
    if ok:
        pick = min if shown.lower_is_better is False else max
        entry, rec = pick(ok, key=lambda er: er[1]["metrics"][key])
        verdict = worst([band(m, r["metrics"].get(m), schema[m].lower_is_better, r["details"], r["metrics"])
                         for m in banded for _, r in mine if r["status"] == "ok"])
        return {"text": number(rec["metrics"][key], shown.unit, shown.fmt), "sort": rec["metrics"][key],
                "verdict": verdict, "by": rec["attack"], "by_full": attack_label(rec), **_where(entry, rec)}
    for status, text in (("diverged", "diverged"), ("failed", "failed")):
        hit = [(e, r) for e, r in mine if r["status"] == status]
        if hit:
            return {"text": text, "sort": "", "verdict": Verdict("", text, hit[0][1]["reason"]), "by": "",
                    **_where(*hit[0])}
    if mine and all(r["status"] == "blocked" for _, r in mine):
        floor = -1e300 if shown.lower_is_better is not False else 1e300
        return {"text": "blocked", "sort": floor, "by": "",
                "verdict": Verdict("blocked", "blocked by design", mine[0][1]["reason"]), **_where(*mine[0])}
    if unjudged:   # measured only by attacks that fail on (or lack) the undefended row of their scenario
        return {"text": "no verdict", "sort": "", "by": "", **_where(*unjudged[0]), "verdict": Verdict(
            "", "no verdict", "no attack of this family breaks the undefended row of a scenario this defense ran in")}
    return {"text": "not run", "sort": "", "verdict": Verdict("", "not run"), "by": "", "href": ""}


def _utility(records: list[tuple[dict, dict]], schema) -> dict[tuple, dict[str, Any]]:
    """Per (suite, scenario, defense label): its utility cost against the scenario's best row, in the scenarios
    that measure utility."""
    out = {}
    scenarios: dict[tuple, list] = {}
    for entry, rec in records:
        scenarios.setdefault((entry["name"], rec["suite"], rec["scenario"]), []).append((entry, rec))
    for recs in scenarios.values():
        entry0, rec0 = recs[0]
        info = (entry0.get("infos") or {}).get(rec0["suite"], {})
        if not measures_utility([r for _, r in recs], info, rec0["scenario"], defense_label):
            continue   # the undefended model learned nothing here: no row's utility says anything
        flat = useless([r for _, r in recs], info, rec0["scenario"], defense_label)
        recs = [(e, r) for e, r in recs if r["defense"] not in set(info.get("untrained") or ())]
        present = {k for _, r in recs for k, v in r["metrics"].items() if is_number(v)}
        metric = next((m for m in UTILITY if m in present), None) or next(
            (m for m in sorted(present) if schema[m].kind == "utility" and schema[m].lower_is_better is not None), None)
        if metric is None:
            continue
        runs = {}
        for entry, rec in recs:
            if is_number(rec["metrics"].get(metric)) or diverged_round(rec) is not None:
                runs.setdefault(defense_label(rec), (entry, rec))
        finite = [r["metrics"][metric] for _, r in runs.values()
                  if diverged_round(r) is None and is_number(r["metrics"].get(metric))]
        if len({rec["defense"] for _, rec in runs.values()}) < 2 or not finite:
            continue   # one defense's own settings against each other: no cost of the defense
        higher = schema[metric].lower_is_better is False
        best = (max if higher else min)(finite)
        for label, (entry, rec) in runs.items():
            base = {"metric": schema[metric], "best": best, "no_utility": flat.get(label, ""), **_where(entry, rec)}
            if diverged_round(rec) is not None:   # a diverged model's last number is no utility: say so instead
                out[(rec["suite"], rec["scenario"], label)] = {**base, "diverged": diverged_text(rec), "value": None,
                                                               "drop": math.inf, "delta": None,
                                                               "relative": DIVERGED_COST}
                continue
            value = rec["metrics"][metric]
            drop = (best - value) if higher else (value - best)
            out[(rec["suite"], rec["scenario"], label)] = {
                **base, "diverged": "", "value": value, "drop": drop, "delta": value - best,
                "relative": drop / abs(best) if best else drop}
    return out


def _he(records: list[tuple[dict, dict]]) -> dict[tuple, dict[str, Any]]:
    """Per (suite, scenario, defense label): HE seconds per round and upload bytes against the scenario's leanest."""
    lean: dict[tuple, float] = {}
    for _, rec in records:
        up = rec["metrics"].get("upload_bytes")
        if is_number(up) and up > 0:
            k = (rec["suite"], rec["scenario"])
            lean[k] = min(lean.get(k, up), up)
    out = {}
    for entry, rec in records:
        times = [rec["metrics"][k] for k in HE_TIME if is_number(rec["metrics"].get(k))]
        if not times:
            continue
        up = rec["metrics"].get("upload_bytes")
        base = lean.get((rec["suite"], rec["scenario"]))
        out.setdefault((rec["suite"], rec["scenario"], defense_label(rec)), {
            "seconds": sum(times), "upload": up if is_number(up) else None,
            "model": ((rec.get("config") or {}).get("scenario") or {}).get("model") or "?",
            "times": (up / base) if is_number(up) and base else None, **_where(entry, rec)})
    return out


def _judged(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entry's records less those of attacks that fail on their scenario's undefended row (no verdict)."""
    out = []
    for (suite, scenario) in dict.fromkeys((r["suite"], r["scenario"]) for r in entry["records"]):
        recs = [r for r in entry["records"] if r["suite"] == suite and r["scenario"] == scenario]
        out += calibrated(recs, calibrate(recs, attack_label), attack_label)
    return out


def overview(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """entries: one per suite directory, {"name": directory, "records": [...]}. The front page's table."""
    everything = [(e, r) for e in entries for r in e["records"]]
    pairs = [(e, r) for e in entries for r in _judged(e)]
    schema = schema_of([r for _, r in everything])
    fams = {family(r) for _, r in everything} - {"reference", ""}
    fams = sorted(fams, key=lambda f: (FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 9, f))
    columns = []
    for fam in fams:
        recs = [r for _, r in everything if family(r) == fam]
        key = _headline(recs, schema)
        if key is None:
            continue
        # the bands that speak of what the headline speaks of (an image attack's label accuracy is no image leak)
        words = BANDS[key].words if key in BANDS else None
        banded = sorted({k for r in recs for k in r["metrics"] if k in BANDS and k in schema
                         and (words is None or BANDS[k].words == words)})
        columns.append({"family": fam, "key": key, "shown": schema[key], "banded": banded,
                        "direction": "desc" if schema[key].lower_is_better is False else "asc"})
    utility, he = _utility(everything, schema), _he(everything)
    untrained = {d for e in entries for info in (e.get("infos") or {}).values() for d in info.get("untrained") or ()}
    rows = []
    for name in sorted({r["defense"] for _, r in everything} - untrained):
        mine = [(e, r) for e, r in pairs if r["defense"] == name]
        unjudged = [(e, r) for e, r in everything if r["defense"] == name and (e, r) not in mine]
        cells = [_family_cell([(e, r) for e, r in mine if family(r) == c["family"]], c["key"], c["shown"], c["banded"],
                              schema, [(e, r) for e, r in unjudged if family(r) == c["family"]]) for c in columns]
        labels = sorted({(r["suite"], r["scenario"], defense_label(r)) for _, r in mine + unjudged})   # ties: stable
        mine = mine or unjudged   # a defense measured only by uncalibrated attacks keeps its row (no verdict)
        costs = [utility[k] for k in labels if k in utility]
        by_model: dict[str, dict[str, Any]] = {}
        for h in (he[k] for k in labels if k in he and he[k]["seconds"] > 0):   # no HE spent: no HE cost
            if h["model"] not in by_model or h["seconds"] > by_model[h["model"]]["seconds"]:
                by_model[h["model"]] = h
        rows.append({
            "name": name, "sources": next((sources(r, "defense") for _, r in mine if sources(r, "defense")), {}),
            "configs": len({defense_label(r) for _, r in mine}), "suites": sorted({e["name"] for e, _ in mine}),
            "topologies": sorted({r["details"].get("key_topology", "") for _, r in mine} - {""}),
            "cells": cells, "verdict": worst([c["verdict"] for c in cells]),
            "utility": max(costs, key=lambda c: c["relative"]) if costs else None,
            "he": [by_model[m] for m in sorted(by_model)]})
    topologies = sorted({t for row in rows for t in row["topologies"]})
    return {"columns": columns, "rows": rows, "topologies": topologies, "levels": LEVELS}

