"""Results store: one SQLite row per finished cell, each committed in its own transaction.

A killed run loses no finished cell and a rerun skips them (failed cells are retried, and
cells whose recorded components differ from the running code's are recomputed: bench/run/version.py).
A file that is not a readable store is reported, never silently replaced.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells (
    cell_id TEXT PRIMARY KEY, scenario TEXT NOT NULL, defense TEXT NOT NULL, defense_params TEXT NOT NULL,
    attack TEXT NOT NULL, attack_params TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL,
    metrics TEXT NOT NULL, details TEXT NOT NULL, config TEXT NOT NULL, environment TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS membership (
    suite TEXT NOT NULL, cell_id TEXT NOT NULL, position INTEGER NOT NULL, PRIMARY KEY (suite, cell_id));
"""
FINISHED = ("ok", "blocked", "diverged")   # outcomes; only "failed" cells are retried


class StoreError(RuntimeError):
    """The store file cannot be used; the message says why and what to do."""


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self._create()
            self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as err:
            if getattr(self, "_db", None) is not None:
                self._db.close()   # a WAL store's -wal/-shm files go with the last connection
            reason = " ".join(str(err).split())[:200]   # one line, even for multi-line integrity reports
            raise StoreError(f"results store '{self.path}' is corrupted or not a LeakBench store ({reason}); "
                             "move it aside or pass another --out (it was left untouched)") from None

    def _create(self) -> None:
        """Check, and create the tables of a new store, in one locked transaction: a concurrent run
        opening the same new file waits instead of seeing half a schema; a foreign file is checked
        before anything is written, and the rollback leaves it untouched."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._check() is None:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(statement)
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _check(self) -> str | None:
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return None
        if "cells" not in tables or "meta" not in tables:
            raise sqlite3.DatabaseError("it has no LeakBench tables")
        ok = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if ok != "ok":
            raise sqlite3.DatabaseError(f"integrity check: {ok}")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {row and row[0]} != {SCHEMA_VERSION}")
        return row[0]

    def close(self) -> None:
        self._db.close()

    def set_membership(self, suite: str, cell_ids: Iterable[str], info: dict[str, Any] | None = None) -> None:
        """The cells that make up a suite now (cells of its earlier versions stay stored but leave
        its leaderboard), and the suite's page info: notes, figures."""
        with self._tx():
            self._db.execute("DELETE FROM membership WHERE suite=?", (suite,))
            if info is not None:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 (f"suite:{suite}", json.dumps(info, sort_keys=True)))
            for pos, cid in enumerate(cell_ids):
                self._db.execute("INSERT OR REPLACE INTO membership VALUES (?, ?, ?)", (suite, cid, pos))

    def members(self, suite: str) -> list[str]:
        """The stored cells that make up a suite's leaderboard now (a member not computed yet is left out)."""
        return [r[0] for r in self._db.execute("SELECT m.cell_id FROM membership m JOIN cells c USING (cell_id) "
                                                "WHERE m.suite=? ORDER BY m.position", (suite,))]

    def set_info(self, suite: str, info: dict[str, Any]) -> None:
        """The suite's page info alone (cells run one at a time keep their membership)."""
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                             (f"suite:{suite}", json.dumps(info, sort_keys=True)))

    def add_member(self, suite: str, cell_id: str) -> None:
        """Append one cell to a suite (cells run one at a time, e.g. from pytest)."""
        with self._tx():
            row = self._db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM membership WHERE suite=?",
                                   (suite,)).fetchone()
            self._db.execute("INSERT OR IGNORE INTO membership VALUES (?, ?, ?)", (suite, cell_id, row[0]))

    def finished(self, cell_id: str, current: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """A stored finished cell (computed by the running code, when `current` is given to tell)."""
        return self.state(cell_id, current) == "done"

    def state(self, cell_id: str, current: Callable[[dict[str, Any]], bool] | None = None) -> str:
        """'new' (not stored or failed), 'stale' (its environment is not the running code's by `current`, or it is
        unsealed: an unverified record, bench/protocol/records.py, is never done) or 'done'."""
        row = self._db.execute("SELECT status, environment FROM cells WHERE cell_id=?", (cell_id,)).fetchone()
        if row is None or row[0] not in FINISHED:
            return "new"
        if current is None:
            return "done"
        try:
            env = json.loads(row[1])
        except (TypeError, ValueError):
            return "stale"
        return "done" if isinstance(env, dict) and env.get("digest") is not None and current(env) else "stale"

    def put(self, record: dict[str, Any]) -> None:
        """Write one cell in its own transaction."""
        cols = ("cell_id", "scenario", "defense", "defense_params", "attack", "attack_params", "status", "reason",
                "metrics", "details", "config", "environment")
        values = [record[c] if isinstance(record[c], str) else json.dumps(record[c], sort_keys=True, default=str)
                  for c in cols]
        with self._tx():
            self._db.execute(f"INSERT OR REPLACE INTO cells ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                             values)

    def seed(self, records: list[dict[str, Any]], infos: dict[str, dict[str, Any]]) -> int:
        """Add exported records (a results.json) that this store lacks, each suite's membership in the exported
        order and its page info: a committed leaderboard resumes where it stands. A stored cell is never replaced
        by an export. Parts an export may leave out are empty: a cell without a fingerprint counts as stale.
        Returns how many cells were added."""
        added = 0
        for rec in records:
            if self._db.execute("SELECT 1 FROM cells WHERE cell_id=?", (rec["cell_id"],)).fetchone() is None:
                self.put({"defense_params": {}, "attack_params": {}, "reason": "", "details": {}, "config": {},
                          "environment": {}} | rec)
                added += 1
            self.add_member(rec["suite"], rec["cell_id"])
        for suite, info in infos.items():
            if info and suite in self.suites():
                self.set_info(suite, info)
        return added

    def records(self, suite: str | None = None) -> list[dict[str, Any]]:
        """Stored cells (of one suite, or all with their suites), in a deterministic order."""
        query = ("SELECT m.suite, c.* FROM membership m JOIN cells c USING (cell_id)"
                 + (" WHERE m.suite=?" if suite else "") + " ORDER BY m.suite, m.position, c.cell_id")
        cur = self._db.execute(query, (suite,) if suite else ())
        names = [d[0] for d in cur.description]
        out = []
        for row in cur.fetchall():
            rec = dict(zip(names, row))
            try:
                for key in ("defense_params", "attack_params", "metrics", "details", "config", "environment"):
                    rec[key] = json.loads(rec[key])
            except (TypeError, ValueError) as err:   # one bad row must not poison every later page
                print(f"leakbench: warning: skipping unreadable record {rec.get('cell_id')!r} in {self.path} "
                      f"({type(err).__name__}); rerun its suite to recompute it", file=sys.stderr)
                continue
            out.append(rec)
        return out

    def suite_info(self, suite: str) -> dict[str, Any]:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (f"suite:{suite}",)).fetchone()
        return json.loads(row[0]) if row else {}

    def suites(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT suite FROM membership ORDER BY suite")]

    def _tx(self):
        db = self._db

        class _Tx:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, exc, tb):
                db.execute("ROLLBACK" if exc_type else "COMMIT")
                return False

        return _Tx()
