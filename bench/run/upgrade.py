"""Stored records written under an older scenario schema, kept as the cells they are.

A scenario field added later changes every cell id (the id hashes the whole config), so a resumed leaderboard
would drop every older record, or recompute pages that took hours, though the work they did is the work a cell
of today does with that field at its default. `upgrade` rewrites an older config the way today's schema writes
the same work, by the explicit rules below, and `adopt` stores the records whose upgraded config is a cell of the
suite under that cell's id: config and id rewritten, `details["upgraded_from"]` naming the old id, and the
environment, fingerprint included, as computed. Resealing follows the reading rule (bench/protocol/records.py):
a record whose digest does not match its content is refused (RecordError), never resealed; a record without a
digest is stored unsealed (unverified, as it was); only a sealed record is resealed, and then it also gets what
records written before it lacked and a built-in defense still declares (`fill`: whether its row is undefended).
The old code's fingerprint makes such a record stale, so a full run recomputes it; a run narrowed by --only keeps
it on the page with the fingerprint that computed it. Nothing that changes the work is rewritten: a config no
rule maps onto a cell stays retired.

Rules (older schema -> today's, each the same work):
- `canary`, `canary_norm` absent (before audit trials): "none" and the default norm;
- `canaries` absent (before one-run audits): its default, which only a one-run audit reads;
- `mia_size` 0 in a cell whose attack scores no membership candidates: before the default pool existed, 0 was
  how a scenario without membership inference was written; today it leaves the field unset (None), and a cell
  without a membership attack draws no candidates either way.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from bench.federation.scenario import Scenario
from bench.protocol.records import DIGEST, UNDEFENDED, RecordError, config_id, digest, seal
from bench.registry import ATTACKS, DEFENSES
from bench.run.spec import Cell
from bench.run.store import Store

UPGRADED = "upgraded_from"   # details key: the cell id the record was computed under


def upgrade(config: dict[str, Any]) -> dict[str, Any]:
    """The config as today's schema writes the same work (the input is not changed)."""
    out = copy.deepcopy(config)
    scenario = out.get("scenario") or {}
    defaults = {f.name: f.default for f in dataclasses.fields(Scenario) if f.default is not dataclasses.MISSING}
    for name in ("canary", "canary_norm", "canaries"):
        scenario.setdefault(name, defaults[name])
    attack = (out.get("attack") or {}).get("name")
    if scenario.get("mia_size") == 0 and attack in ATTACKS and not getattr(ATTACKS.get(attack), "needs_membership",
                                                                            False):
        scenario["mia_size"] = None
    out["scenario"] = scenario
    return out


def adopt(store: Store, suite: str, cells: list[Cell], dry_run: bool = False) -> set[str]:
    """Store, under today's ids, the suite's records that no cell matches but whose upgraded config is a cell's;
    returns the old ids adopted (with `dry_run`, those it would adopt, storing nothing). A cell already stored is
    never replaced."""
    wanted = {c.cell_id for c in cells}
    adopted: set[str] = set()
    for rec in store.records(suite):
        if rec["cell_id"] in wanted:
            continue
        config = upgrade(rec["config"])
        cid = config_id(config)
        if cid == rec["cell_id"] or cid not in wanted or store.state(cid) != "new":
            continue
        adopted.add(rec["cell_id"])
        if dry_run:
            continue
        new = {k: v for k, v in rec.items() if k != "suite"} | {
            "cell_id": cid, "config": config, "details": {**rec["details"], UPGRADED: rec["cell_id"]}}
        store.put(reseal(new, rec, f"{store.path}: cell {rec['cell_id']}"))
        store.add_member(suite, cid)
    return adopted


def reseal(new: dict[str, Any], old: dict[str, Any], where: str) -> dict[str, Any]:
    """`new` (a rewrite of the stored record `old`) sealed when `old`'s digest matched its content, unsealed when
    `old` had none; RecordError when `old`'s digest does not match: it was edited after it was written."""
    env = old.get("environment") or {}
    if DIGEST not in env:
        return new
    if env[DIGEST] != digest(old):
        raise RecordError(f"{where} cannot be trusted (its content does not match its digest: it was changed "
                          "after it was written), so it is not upgraded; restore it from git or recompute the cell")
    return seal(fill(new))


def fill(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with what today's records hold and it lacks, where a built-in defense still declares it:
    whether its row is undefended (Defense.undefended, for its stored parameters)."""
    details = rec.get("details") or {}
    name, params = rec.get("defense"), rec.get("defense_params") or {}
    if UNDEFENDED not in details and name in DEFENSES:
        rec["details"] = {**details, UNDEFENDED: bool(DEFENSES.get(name)(**params).undefended())}
    return rec


__all__ = ["UPGRADED", "adopt", "fill", "reseal", "upgrade"]
