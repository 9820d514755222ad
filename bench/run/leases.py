"""Group claims in the results store, so concurrent runs into one --out federate each group once.

A (scenario, defense) group is the unit of work: its cells share one federated run. Before
federating, a run claims the group in the store's SQLite file (BEGIN IMMEDIATE serializes two
claimers); it releases the claim once the group's cells are stored. A run meeting a live claim
goes on with other groups and comes back to it later; by then the cells are usually finished
and skipped. A claim is stale, and taken over, when its process is gone (same host, pid not
alive) or its heartbeat (renewed with every stored cell) is older than STALE_S.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import time
import uuid
from dataclasses import asdict
from pathlib import Path

STALE_S = 3600.0
_SCHEMA = ("CREATE TABLE IF NOT EXISTS claims (grp TEXT PRIMARY KEY, token TEXT NOT NULL, host TEXT NOT NULL, "
           "pid INTEGER NOT NULL, heartbeat REAL NOT NULL)")


def group_id(cells) -> str:
    """Stable id of a group: the hash of its scenario and defense configs."""
    cell = cells[0]
    blob = json.dumps({"scenario": asdict(cell.scenario), "defense": asdict(cell.defense)}, sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Claims:
    """One runner's handle: a token unique to it, and claim/beat/release on the store's file."""

    def __init__(self, store_path: str | Path, token: str | None = None):
        self.token = token or new_run_id()
        self.host = socket.gethostname()
        self._db = sqlite3.connect(store_path, timeout=60, isolation_level=None)
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def claim(self, grp: str) -> bool:
        """True when this runner now holds `grp` (it was free, stale, or already ours)."""
        now = time.time()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT token, host, pid, heartbeat FROM claims WHERE grp=?", (grp,)).fetchone()
            if row is not None and row[0] != self.token and not self._stale(row, now):
                self._db.execute("COMMIT")
                return False
            self._db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                             (grp, self.token, self.host, os.getpid(), now))
            self._db.execute("COMMIT")
            return True
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def beat(self, grp: str) -> None:
        self._db.execute("UPDATE claims SET heartbeat=? WHERE grp=? AND token=?", (time.time(), grp, self.token))

    def release(self, grp: str) -> None:
        self._db.execute("DELETE FROM claims WHERE grp=? AND token=?", (grp, self.token))

    def _stale(self, row, now: float) -> bool:
        _, host, pid, heartbeat = row
        if now - heartbeat > STALE_S:
            return True
        return host == self.host and not _alive(int(pid))
