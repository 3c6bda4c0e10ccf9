"""The embedded store: jobs and their changelog in one SQLite file (the default).

An accepted job must survive a controller crash, so every mutating call is one
transaction that has committed when the call returns (WAL mode; `synchronous=FULL`
by default, so it also survives power loss). Jobs are stored as serialized `pb.Job`
blobs next to the columns the queries need; `extra` is an opaque per-job blob the
controller owns (its private data for rebuilding estimates after a restart).

One connection, shared by threads under a lock: the controller writes from a single
executor thread, but reads may come from others. sqlite3 errors never escape; they
become `StoreError`, which the server reports as UNAVAILABLE. The queries and the
rules are `sql.SqlStore`'s, shared with the PostgreSQL store.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from sia_grpc.controller.stores.contract import StoreError
from sia_grpc.controller.stores.sql import SqlStore

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

# seq is AUTOINCREMENT so a creation sequence number is never reused, even after the
# newest job is deleted: a page token holding it stays a valid resume point.
# request_id is NULL when empty so the partial unique index only covers real ids.
_SCHEMA = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('revision', 0), ('compacted_through', 0);
CREATE TABLE jobs (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     TEXT NOT NULL UNIQUE,
    state      INTEGER NOT NULL,
    tenant     TEXT NOT NULL,
    request_id TEXT,
    revision   INTEGER NOT NULL,
    job        BLOB NOT NULL,
    extra      BLOB NOT NULL DEFAULT x''
);
CREATE UNIQUE INDEX jobs_by_request ON jobs (request_id) WHERE request_id IS NOT NULL;
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_tenant ON jobs (tenant, seq);
CREATE TABLE changelog (
    revision INTEGER PRIMARY KEY,
    kind     INTEGER NOT NULL,
    job_id   TEXT NOT NULL,
    job      BLOB NOT NULL
);
"""

# Upgrades, by the version they bring a store to (the same as postgres.py's). A store
# of any older version is brought forward on open, in one transaction with the bump.
_MIGRATIONS = {
    2: """
CREATE TABLE drains (
    node   TEXT PRIMARY KEY,
    reason TEXT NOT NULL
) WITHOUT ROWID;
""",
    # Published rounds (serialized pb.Round), oldest first by seq.
    3: """
CREATE TABLE rounds (
    seq   INTEGER PRIMARY KEY,
    round BLOB NOT NULL
);
""",
    # Leases (leader election): expires_at in seconds since the epoch, by _NOW.
    4: """
CREATE TABLE lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    address    TEXT NOT NULL,
    term       INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
""",
    # The cluster's event history (serialized pb.Event), by id (a store revision).
    5: """
CREATE TABLE events (
    id     INTEGER PRIMARY KEY,
    kind   INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    node   TEXT NOT NULL,
    queue  TEXT NOT NULL,
    event  BLOB NOT NULL
);
CREATE INDEX events_by_job ON events (job_id, id);
INSERT INTO meta (key, value) VALUES ('event_id', 0), ('events_compacted_through', 0);
""",
}


class SqliteStore(SqlStore):
    _SCHEMA = _SCHEMA
    _MIGRATIONS = _MIGRATIONS
    # This machine's clock, the only one an embedded store has (millisecond precision).
    _NOW = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str | os.PathLike, *, synchronous: str = "FULL",
                 changelog_limit: int = 100_000, rounds_limit: int = 1000,
                 busy_timeout: float = 5.0) -> None:
        """Open (creating if missing) the store at `path`; ":memory:" for a throwaway one.

        `busy_timeout` (seconds) is how long a write waits for another connection's lock
        before failing with StoreError. `rounds_limit`: published rounds kept.
        """
        synchronous = synchronous.upper()
        if synchronous not in _SYNCHRONOUS:  # interpolated into a PRAGMA: whitelist it
            raise ValueError(f"synchronous: must be one of {', '.join(_SYNCHRONOUS)}")
        super().__init__(changelog_limit=changelog_limit, rounds_limit=rounds_limit)
        self.path = self.name = os.fspath(path)
        self._lock = threading.Lock()
        try:
            # isolation_level=None: no implicit transactions; each call runs its own
            # BEGIN IMMEDIATE ... COMMIT, so what is committed is exactly what returned.
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None,
                check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"store: cannot open {self.path}: {e}") from e
        try:
            self._setup(synchronous, busy_timeout)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _setup(self, synchronous: str, busy_timeout: float) -> None:
        conn = self._conn
        assert conn is not None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as e:
            raise StoreError(f"store: cannot open {self.path}: {e}") from e
        # BEGIN IMMEDIATE: the version is read under the write lock, so another
        # process creating the schema between our open and our lock is seen.
        with self._txn(f"initialise {self.path}") as conn:
            self._initialise(conn)

    def _schema_version(self, conn) -> int:
        return conn.execute("PRAGMA user_version").fetchone()[0]

    def _set_schema_version(self, conn, version: int) -> None:
        conn.execute(f"PRAGMA user_version = {int(version)}")

    # -- transactions and errors ------------------------------------------------------

    @contextmanager
    def _connection(self, what: str) -> Iterator[sqlite3.Connection]:
        """The one connection, under the lock; a sqlite3 error raised as StoreError."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError("store: closed")
            try:
                yield conn
            except sqlite3.Error as e:
                raise StoreError(f"store: cannot {what}: {e}") from e

    @contextmanager
    def _txn(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._connection(what) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

    _read = _connection

    def _rollback(self) -> None:
        conn = self._conn
        # SQLite may already have rolled back on its own (e.g. after SQLITE_FULL).
        # The original error is the one worth reporting, not a failed rollback.
        if conn is not None and conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
