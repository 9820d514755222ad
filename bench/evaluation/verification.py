"""What `leakbench verify` re-checked, as a page shows it, and its report file.

A record's digest (bench/protocol/records.py) is a checksum: it catches an accidental edit, not a forgery, since
anyone can reseal an edited record. So a page tells two kinds of cell apart: "as computed (sealed)", a record
whose checksum matches, read as its machine wrote it; and "reproduced by verify on <machine, date>", a record that
`leakbench verify` recomputed from its config with tolerances that keep its verdict and rank
(bench/run/verify.py). A record that is neither is unverified and judges nothing.

The report `leakbench verify --report FILE` writes, so that a folder checked on one machine can be published from
another (`leakbench site --report FILE`, or kept in the folder as `verification.json`, which `site` reads itself):

    {"format": "leakbench-verification/1", "folder": "core", "machine": "...", "date": "YYYY-MM-DD",
     "cells": 553, "outcomes": [{"cell_id", "label", "digest", "state", "chosen", "why", "tolerances",
                                 "differences", "seconds", "machine", "date"}, ...]}

A folder too large to recompute in one sitting is verified in pieces (`--only`, a run stopped and resumed): the
report is rewritten after every cell, a rerun with the same --report resumes it, and each outcome names the
machine (with its torch threads) and the date that recomputed it; the top-level machine and date are those of the
last piece, and an outcome without its own reads as theirs.

It is checked when read like any record file (`check_report`): its fields and their types, and each outcome's
cell id and digest against the folder's records, so a report of other (or since edited) records marks nothing and
is refused in one line naming the fault. A folder's own verification.json is held to the same rule except that
outcomes of records since recomputed (their cell id held with another digest) are left out and counted
(`current_outcomes`): a rerun of a cell makes its old check moot, not the rest of the report false.
"""
from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.evaluation.formats import is_number
from bench.protocol.records import digest, sealed

FORMAT = "leakbench-verification/1"
OWN_REPORT = "verification.json"   # a folder's own report, which `leakbench site` reads with its records
STATES = ("reproduced", "differs", "stale")
HEX16 = re.compile(r"[0-9a-f]{16}")
_TEXT = ("cell_id", "label", "state", "chosen", "why")


@dataclass(frozen=True)
class Checked:
    """One folder's verification: where and when, and each re-checked cell's outcome (report dicts)."""

    folder: str
    machine: str
    date: str
    cells: int
    outcomes: tuple[dict[str, Any], ...]

    @property
    def reproduced(self) -> dict[str, str]:
        """The digests of the records verify reproduced (the reading rule's second way in), each with where and
        when: "machine, date"."""
        return {o["digest"]: f"{o.get('machine') or self.machine}, {o.get('date') or self.date}"
                for o in self.outcomes if o["state"] == "reproduced"}

    @property
    def where(self) -> str:
        """Where and when the outcomes were recomputed (stale ones were not), as a page says it: one machine and
        date, or how many."""
        places = {(o.get("machine") or self.machine, o.get("date") or self.date) for o in self.outcomes
                  if o["state"] != "stale"}
        machines = sorted({m for m, _ in places})
        dates = sorted({d for _, d in places}) or [self.date]
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        return f"{machines[0] if len(machines) == 1 else f'{len(machines)} machine settings'}, {when}"

    def count(self, state: str) -> int:
        return sum(o["state"] == state for o in self.outcomes)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "folder": self.folder, "machine": self.machine, "date": self.date,
                "cells": self.cells, "outcomes": list(self.outcomes)}


def mark(rec: dict[str, Any], checked: Checked | None) -> dict[str, str]:
    """How a page marks one record's cells: reproduced (with where and when), sealed or unverified."""
    if checked is not None and (where := checked.reproduced.get(digest(rec))):
        return {"state": "reproduced", "text": f"reproduced by leakbench verify on {where}"}
    if sealed(rec):
        return {"state": "sealed", "text": "as computed (sealed: its checksum matches, which catches an accidental "
                                           "edit, not a forgery; not re-checked)"}
    return {"state": "unverified", "text": "unverified: neither sealed nor reproduced by leakbench verify"}


def counts(records: list[dict[str, Any]], checked: Checked | None) -> dict[str, dict[str, int]]:
    """Per scenario: its cells, how many were reproduced by verify, how many are as computed (sealed) and how many
    are unverified; the front page adds them up per track."""
    out: dict[str, dict[str, int]] = {}
    for rec in records:
        tally = out.setdefault(rec["scenario"], {"cells": 0, "reproduced": 0, "sealed": 0, "unverified": 0})
        tally["cells"] += 1
        tally[mark(rec, checked)["state"]] += 1
    return out


def tolerance_summary(tolerances: dict[str, str]) -> str:
    """A cell's tolerances in one line: the metrics that share one named together, the exact ones counted."""
    by: dict[str, list[str]] = {}
    for name, text in tolerances.items():
        by.setdefault(text, []).append(name)
    exact = by.pop("exact", [])
    parts = [f"{', '.join(names)} {text}" for text, names in by.items()]
    return "; ".join(parts + ([f"{len(exact)} exact"] if exact else [])) + \
        ("; " if parts or exact else "") + "each verdict band, the verdict, the utility flag and every rank kept"


def load_report(path: str | Path, folders: dict[str, list[dict[str, Any]]]) -> Checked:
    """A report file read and checked against the folder it names (`folders`: folder name -> its records);
    ValueError in one line otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no verification report at {path}; write one with `leakbench verify DIR --report "
                                f"{path}`")
    data = read_json(path)
    folder = data.get("folder") if isinstance(data, dict) else None
    if not isinstance(folder, str) or folder not in folders:
        raise ValueError(f"{path}: the report's folder {folder!r} is none of {', '.join(sorted(folders))}; verify "
                         "that folder or pass the report of one of these")
    return check_report(data, str(path), folders[folder])


def read_json(path: Path) -> Any:
    """A report file's content; ValueError in one line where it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); write it again with `leakbench verify DIR --report "
                         f"{path}`, or move it aside") from None


def check_report(data: Any, where: str, records: list[dict[str, Any]]) -> Checked:
    """The report as a Checked, or ValueError (one line: `where` and the fault) when its fields are not as written
    or an outcome is of a record the folder does not hold as it was checked."""
    fault = _fault(data, {r["cell_id"]: digest(r) for r in records})
    if fault:
        raise ValueError(f"{where}: not a verification report of this folder ({fault}); run `leakbench verify` on "
                         "the folder again with --report")
    return Checked(data["folder"], data["machine"], data["date"], int(data["cells"]), tuple(data["outcomes"]))


def current_outcomes(data: Any, where: str, records: list[dict[str, Any]]) -> tuple[Checked, int]:
    """A folder's own report (or one being resumed) with the outcomes of records since recomputed left out, and
    how many were; ValueError in one line for any other fault, as check_report."""
    held = {r["cell_id"]: digest(r) for r in records}
    outcomes = data.get("outcomes") if isinstance(data, dict) else None
    if isinstance(outcomes, list):
        keep = [o for o in outcomes if not (isinstance(o, dict) and o.get("cell_id") in held
                                            and o.get("digest") != held[o["cell_id"]])]
        data = {**data, "outcomes": keep}
        return check_report(data, where, records), len(outcomes) - len(keep)
    return check_report(data, where, records), 0


def own_reports(loaded: list[tuple[Path, list[dict[str, Any]]]], say: Callable[[str], None]) -> dict[Path, Checked]:
    """Each folder's own report (DIR/verification.json) as `current_outcomes` reads it, the outcomes it left out
    said; folders without one are not in it."""
    out = {}
    for directory, records in loaded:
        path = Path(directory) / OWN_REPORT
        if not path.is_file():
            continue
        out[directory], dropped = current_outcomes(read_json(path), str(path), records)
        if dropped:
            say(f"site: {path}: {dropped} outcome(s) of records since recomputed left out; rerun `leakbench verify "
                f"{directory} --report {path}` to check them again")
    return out


def _fault(data: Any, digests: dict[str, str]) -> str | None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"its format is not {FORMAT!r}"
    for key in ("folder", "machine", "date"):
        if not isinstance(data.get(key), str):
            return f"{key} is not text"
    try:
        datetime.date.fromisoformat(data["date"])
    except ValueError:
        return f"date {data['date'][:20]!r} is not YYYY-MM-DD"
    if not is_number(data.get("cells")) or not isinstance(data.get("outcomes"), list):
        return "it lacks its cell count or its outcomes"
    for i, o in enumerate(data["outcomes"]):
        if not isinstance(o, dict) or not all(isinstance(o.get(k), str) for k in _TEXT):
            return f"outcome {i} lacks one of {', '.join(_TEXT)} as text"
        if o["state"] not in STATES:
            return f"outcome {i}: state {o['state'][:20]!r} is none of {', '.join(STATES)}"
        if not isinstance(o.get("digest"), str) or not HEX16.fullmatch(o["digest"]):
            return f"outcome {i}: its digest is not 16 hex digits"
        if digests.get(o["cell_id"]) != o["digest"]:
            return f"outcome {i}: cell {o['cell_id'][:20]} with digest {o['digest']} is no record of the folder"
        if any(k in o and not isinstance(o[k], str) for k in ("machine", "date")):
            return f"outcome {i}: its machine or date is not text"
        if not isinstance(o.get("tolerances"), dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                                 for k, v in o["tolerances"].items()):
            return f"outcome {i}: its tolerances are not metric -> text"
        if not isinstance(o.get("differences"), list) or not is_number(o.get("seconds")) or not all(
                isinstance(d, list) and len(d) == 4 and isinstance(d[0], str) for d in o["differences"]):
            return f"outcome {i} lacks its differences (what, stored, recomputed, tolerance) or its seconds"
    return None


__all__ = ["Checked", "FORMAT", "OWN_REPORT", "STATES", "check_report", "counts", "current_outcomes", "load_report",
           "mark", "own_reports", "read_json", "tolerance_summary"]
