"""The record contract: what a stored cell must be before anyone reads it back as a result.

A record read from another place (an export's results.json or another folder's store: `--reuse`, seeding a
store from a committed export, `leakbench site`, `leakbench compare`) is checked by `check_record`; a bad one
is refused in one line naming the file and the cell. The checks, and what each catches:

- types: cell_id, suite, scenario, defense, attack, status and reason are strings, params, config, metrics,
  details and environment dicts, status one of the four outcomes, suite and scenario safe file names;
- identity: the cell id is the content hash of the record's stored config (`config_id`, as a suite computes
  it), and scenario, defense, attack and their params agree with that config; an id kept over another config,
  or a row relabelled, is caught;
- metrics: each is a number (a bool counts), None or text (the "unavailable: <reason>" form, shown as n/a and
  never ranked), and is named in the record's metric schema snapshot, whose entries are well formed (kind,
  direction, unit, a plain number format); a record without a snapshot predates them (left off pages as before);
- privacy: the record of a run whose defense declared itself differentially private
  (`details["differentially_private"]`, written by the engine) reports the epsilon its accountant gives
  (`metrics["epsilon"]`, a finite number >= 0) and the accountant's details (`details["dp"]`: accountant, delta);
  a failed cell, whose run may not have finished, is exempt; records written before the declaration carry none;
- fingerprint: where the record lists the hashes of the code, libraries and data that computed it
  (`environment["components"]`, an object of strings), its fingerprint is their hash (`fingerprint_of`); a
  fingerprint set to make a cell read as current, or components edited under it, is caught;
- digest: a record written by this code carries `environment["digest"]`, a content hash over everything it
  holds but its suite (set by membership), its volatile run id and the notes added when it is copied
  (`NOTES`); a metric, detail, reason, status, config or fingerprint changed after the record was written
  breaks it.

The reading rule (`verified`): a record read back counts as a result only when it is sealed (its digest is
present and matches) or `leakbench verify` reproduced it (bench/run/verify.py). Any other record is
"unverified": it loads (nothing is lost), but a page shows it greyed and judges nothing with it (no verdict,
rank, calibration or front-page cell, leaderboards/render.py), a run never copies or keeps it as done
(bench/run/runner.py: it is stale, and one that claims the running code's fingerprint is refused, since this
code always seals), `compare` marks it, and the schema upgrade never seals it (bench/run/upgrade.py). So a
record whose digest was removed reads like the old undigested records, which are unverified too.

What is not caught: the digest is a checksum against accidental edits, not a signature, so whoever edits a record
and recomputes the digest with this code gets through; only recomputing the cell (`leakbench verify`) catches that.
So a page calls a sealed record "as computed (sealed)" and only a recomputed one "reproduced by verify"
(bench/evaluation/verification.py): a resealed forgery reads sealed, never re-checked.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import string
from typing import Any, Collection

KINDS = ("privacy", "utility", "cost")                 # a metric's kind (bench/protocol/evidence.py)
STATUSES = ("ok", "blocked", "diverged", "failed")
VOLATILE_ENV = ("run_id",)   # which federated run computed a cell: stored, kept out of exports and the digest
NOTES = ("copied_from",)     # details added after a record was computed (where --reuse copied it from)
DIGEST = "digest"            # environment key of the record's content hash
UNDEFENDED = "undefended"    # details key: the cell's defense row carries the trained update unprotected (a bool)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")   # suite and scenario names become file names
_TEXT = ("cell_id", "suite", "scenario", "defense", "attack", "status", "reason")
_DICTS = ("defense_params", "attack_params", "metrics", "details", "config", "environment")
_SCHEMA_TYPES = {"unit": (str,), "kind": (str,), "description": (str,), "fmt": (str,), "display": (str,),
                 "title": (str,), "per_target": (bool,), "timing": (bool,), "lower_is_better": (bool, type(None)),
                 "per_attack": (bool, type(None)), "flag_above": (int, float, type(None))}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def setting_label(name: str, params: dict[str, Any]) -> str:
    """A defense or attack setting as cells, `--only` and a scenario's narrowing list name it: name(k=v, ...)."""
    if not params:
        return name
    return name + "(" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"


def config_id(config: dict[str, Any]) -> str:
    """A cell's id: sha256 of its full config as canonical JSON, 16 hex digits (the suite name is not in it)."""
    return hashlib.sha256(_canonical(config).encode()).hexdigest()[:16]


def digest(rec: dict[str, Any]) -> str:
    """The record's content hash: every record key but suite, details but `NOTES`, environment but the run id
    and the digest. Taken over the record as stored (a JSON round trip first), so it reads the same back."""
    env = {k: v for k, v in (rec.get("environment") or {}).items() if k not in VOLATILE_ENV + (DIGEST,)}
    details = {k: v for k, v in (rec.get("details") or {}).items() if k not in NOTES}
    content = {k: rec.get(k) for k in ("cell_id", "scenario", "defense", "defense_params", "attack", "attack_params",
                                       "status", "reason", "metrics", "config")}
    stored = json.loads(_canonical(content | {"details": details, "environment": env}))
    return hashlib.sha256(_canonical(stored).encode()).hexdigest()[:16]


def fingerprint_of(components: dict[str, str]) -> str:
    """A cell's fingerprint: sha256 (16 hex digits) over its components' hashes (bench/run/version.py)."""
    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()[:16]


def sealed(rec: dict[str, Any]) -> bool:
    """Whether the record carries a digest that matches its content."""
    env = rec.get("environment")
    return isinstance(env, dict) and env.get(DIGEST) == digest(rec)


def verified(rec: dict[str, Any], reproduced: Collection[str] = frozenset()) -> bool:
    """The reading rule (module docstring): sealed, or reproduced by `leakbench verify` (`reproduced` holds the
    digests, `digest(rec)`, of the records it reproduced)."""
    return sealed(rec) or digest(rec) in reproduced


def seal(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with its digest in its environment (the cell scorer calls it on every record it writes)."""
    rec["environment"] = {**rec["environment"], DIGEST: digest(rec)}
    return rec


class RecordError(ValueError):
    """A record that cannot be trusted; the message names the file and the cell."""


def dp_fault(epsilon: Any, dp: Any) -> str | None:
    """What a differentially private run's report lacks: the accountant's epsilon, or its details (accountant,
    delta); None when both are there."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < 0:
        return f"reports no accountant epsilon (epsilon is {epsilon!r})"
    if not isinstance(dp, dict) or not isinstance(dp.get("accountant"), str) or not isinstance(dp.get("delta"), float):
        return "reports no accountant details (dp: its accountant and delta)"
    return None


def check_record(rec: Any, where: str, index: int = 0) -> dict[str, Any]:
    """The record, or RecordError (one line: `where`, the cell and the fault). See the module docstring."""
    if not isinstance(rec, dict):
        raise RecordError(f"{where}: record {index} is {type(rec).__name__}, not a record")
    cell = rec.get("cell_id")
    fault = _fault(rec)
    if fault:
        name = f"cell {cell}" if isinstance(cell, str) else f"record {index}"
        raise RecordError(f"{where}: {name} cannot be trusted ({fault}); restore the file from git or recompute "
                          "the cell")
    return rec


def _fault(rec: dict[str, Any]) -> str | None:
    for key in _TEXT:
        if key in rec and not isinstance(rec[key], str):
            return f"{key} is {type(rec[key]).__name__}, not a string"
    for key in _DICTS:
        if key in rec and not isinstance(rec[key], dict):
            return f"{key} is {type(rec[key]).__name__}, not an object"
    if "config" not in rec:
        return "it has no config, so its cell id cannot be checked"
    if rec.get("status") not in STATUSES:
        return f"status {rec.get('status')!r} is none of {', '.join(STATUSES)}"
    for key in ("suite", "scenario"):
        if not NAME_RE.fullmatch(rec.get(key, "")) or ".." in rec[key]:
            return f"{key} {rec.get(key)!r} is not a safe name"
    if not all(isinstance(rec.get("details", {}).get(note, ""), str) for note in NOTES):
        return "a note in its details is not text"
    if not isinstance(rec.get("details", {}).get(UNDEFENDED), (bool, type(None))):
        return f"its details' {UNDEFENDED!r} is not true, false or null"
    return _identity(rec) or _metrics(rec) or _privacy(rec) or _environment(rec)


def _privacy(rec: dict[str, Any]) -> str | None:
    details = rec.get("details", {})
    if details.get("differentially_private") is not True or rec["status"] == "failed":
        return None
    fault = dp_fault(rec["metrics"].get("epsilon"), details.get("dp"))
    return f"its defense is differentially private but the record {fault}" if fault else None


def _identity(rec: dict[str, Any]) -> str | None:
    config = rec["config"]
    if config_id(config) != rec["cell_id"]:
        return f"its cell id is not the hash of its config ({config_id(config)}): id or config was changed"
    parts = [config.get(k) for k in ("scenario", "defense", "attack")]
    if not all(isinstance(p, dict) for p in parts):
        return "its config lacks the scenario, defense or attack"
    scenario, defense, attack = parts
    if scenario.get("name") != rec["scenario"]:
        return f"scenario {rec['scenario']!r} is not its config's {scenario.get('name')!r}"
    for kind, part in (("defense", defense), ("attack", attack)):
        if part.get("name") != rec[kind] or part.get("params", {}) != rec.get(f"{kind}_params", {}):
            return f"{kind} {rec[kind]!r} with its params is not its config's {part.get('name')!r}"
    return None


def _metrics(rec: dict[str, Any]) -> str | None:
    details = rec.get("details", {})
    for name, value in rec["metrics"].items():
        if not (value is None or isinstance(value, (int, float, str))):
            return f"metric {name!r} is {type(value).__name__}, not a number or text"
    if "metric_schema" not in details:
        return None
    schema = details["metric_schema"]
    if not isinstance(schema, dict):
        return "its metric schema is not an object"
    missing = sorted(set(rec["metrics"]) - set(schema))
    if missing:
        return f"metric {missing[0]!r} is not in its metric schema"
    for name, entry in schema.items():
        fault = _schema_entry(entry)
        if fault:
            return f"metric schema of {name!r}: {fault}"
    return None


def _schema_entry(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    for key in ("unit", "kind", "lower_is_better"):
        if key not in entry:
            return f"no {key}"
    for key, types in _SCHEMA_TYPES.items():
        value = entry.get(key)
        if key in entry and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
            return f"{key} is {type(value).__name__}"
    if entry["kind"] not in KINDS:
        return f"kind {entry['kind']!r} is none of {', '.join(KINDS)}"
    if "fmt" in entry and not _plain_format(entry["fmt"]):
        return f"format {entry['fmt']!r} is not one number field like '{{:.3f}}'"
    return None


def _plain_format(fmt: str) -> bool:
    """One replacement field with a short spec and no attribute access, conversion or nesting: '{:.3f}'."""
    try:
        fields = [f for f in string.Formatter().parse(fmt) if f[1] is not None]
        return len(fields) == 1 and fields[0][1] == "" and fields[0][3] is None and len(fields[0][2]) <= 8 and \
            "{" not in fields[0][2] and isinstance(fmt.format(1.5), str)
    except (ValueError, TypeError, IndexError):
        return False


def _environment(rec: dict[str, Any]) -> str | None:
    env = rec.get("environment", {})
    fingerprint, components = env.get("fingerprint"), env.get("components")
    if fingerprint is not None and not isinstance(fingerprint, str):
        return f"fingerprint is {type(fingerprint).__name__}, not a string"
    if components is not None and not (isinstance(components, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in components.items())):
        return f"its components are {type(components).__name__}, not an object of component hashes"
    if DIGEST in env and env[DIGEST] != digest(rec):
        return "its content does not match its digest: a metric, detail, status or fingerprint was changed after " \
               "it was written"
    if components is not None and fingerprint != fingerprint_of(components):
        return f"its fingerprint {fingerprint} is not the hash of its components ({fingerprint_of(components)}): " \
               "forged, or its components edited"
    return None
