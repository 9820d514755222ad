"""Paper-vs-ours rows (RobustBench's idea): a suite TOML may state what a paper reports,

    [[paper]]
    metric = "lnacc"             # a metric name
    reported = 0.99              # the paper's number
    source = "iLRG Table 2"      # where it is reported
    scenario = "..."             # optional filters on the stored records, as in [[figures]]
    defense = "plaintext"
    attack = "ilrg"
    where = { ratio = 0.1 }      # optional filter on metrics or parameters

and the page shows reported, ours (mean over the matching stored cells) and their ratio.
"""
from __future__ import annotations

from typing import Any

from leaderboards.figures import lookup

PAPER_KEYS = {"metric", "reported", "source", "scenario", "defense", "attack", "where", "note"}


def check_paper(spec: dict[str, Any]) -> None:
    unknown = set(spec) - PAPER_KEYS
    if unknown or "metric" not in spec or not isinstance(spec.get("reported"), (int, float)):
        raise ValueError(f"a [[paper]] row needs metric and a numeric reported value and accepts "
                         f"{sorted(PAPER_KEYS)}; got {sorted(spec)}")


def paper_rows(specs: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for spec in specs:
        values = [lookup(r, spec["metric"]) for r in records if r["status"] == "ok"
                  and not any(spec.get(k) and r[k] != spec[k] for k in ("scenario", "defense", "attack"))
                  and all(lookup(r, k) == v for k, v in spec.get("where", {}).items())]
        values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        ours = sum(values) / len(values) if values else None
        where = ", ".join(f"{k}={spec[k]}" for k in ("scenario", "defense", "attack") if spec.get(k))
        where += "".join(f", {k}={v}" for k, v in spec.get("where", {}).items())
        rows.append({"metric": spec["metric"], "source": spec.get("source", ""), "where": where.strip(", "),
                     "reported": spec["reported"], "ours": ours, "cells": len(values), "note": spec.get("note", ""),
                     "ratio": ours / spec["reported"] if ours is not None and spec["reported"] else None})
    return rows
