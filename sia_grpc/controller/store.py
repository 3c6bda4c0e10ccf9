"""The controller's durable state: jobs and their changelog in an embedded SQLite database.

An accepted job must survive a controller crash, so every mutating call is one
transaction that has committed when the call returns (WAL mode; `synchronous=FULL`
by default, so it also survives power loss). Jobs are stored as serialized `pb.Job`
blobs next to the columns the queries need; `extra` is an opaque per-job blob the
controller owns (its private data for rebuilding estimates after a restart).

Every change takes the next store revision and appends (revision, kind, job) to a
changelog, so `WatchJobs` can resume from the last revision a client saw. The
changelog is trimmed by `compact`; resuming from before the trimmed range raises
`Compacted` (the client must start over from a snapshot). Published scheduling
rounds are kept too (`add_rounds`, the newest `rounds_limit`), so the round history
outlives a restart.

One connection, shared by threads under a lock: the controller writes from a single
executor thread, but reads may come from others. sqlite3 errors never escape; they
become `StoreError`, which the server reports as UNAVAILABLE.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import sqlite3
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from sia_grpc.api import pb

SCHEMA_VERSION = 3

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

# Upgrades, by the version they bring a store to. A store of any older version is
# brought forward on open, in one transaction with the version bump.
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
}

_TOKEN = re.compile(r"seq:(\d{1,19})")


class StoreError(Exception):
    """The store could not do what was asked; the server maps it to UNAVAILABLE."""


class JobExists(StoreError):
    """The job_id is already taken (by a different request)."""


class RequestConflict(StoreError):
    """The request_id was already used with a different spec."""


class NotFound(StoreError):
    """No job with that job_id."""


class Compacted(StoreError):
    """The changelog after the requested revision was already dropped."""


@dataclass(frozen=True)
class StoredJob:
    job: pb.Job  # with job.revision set
    extra: bytes  # controller-owned blob (b"" if never set)


class Store:
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
        if changelog_limit < 0:
            raise ValueError("changelog_limit: must be >= 0")
        if rounds_limit < 1:
            raise ValueError("rounds_limit: must be >= 1")
        self.path = os.fspath(path)
        self.changelog_limit = changelog_limit
        self.rounds_limit = rounds_limit
        self._lock = threading.Lock()
        self._revision = 0
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
        with self._txn(f"initialise {self.path}"):
            # Re-read inside the write transaction: another process may have created
            # the schema between our open and our lock.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"store: {self.path} has schema version {version}, newer than the "
                    f"{SCHEMA_VERSION} this controller knows; run a newer controller")
            steps = [_SCHEMA] if version == 0 else []
            steps += [_MIGRATIONS[v] for v in range(max(version, 1) + 1, SCHEMA_VERSION + 1)]
            for script in steps:
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._revision = self._meta("revision")

    # -- transactions and errors ------------------------------------------------------

    @contextmanager
    def _txn(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; any failure rolls it back and is raised as StoreError.

        The caller holds the lock (or is the constructor).
        """
        conn = self._conn
        if conn is None:
            raise StoreError("store: closed")
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException as e:
            self._rollback()
            if isinstance(e, sqlite3.Error):
                raise StoreError(f"store: cannot {what}: {e}") from e
            raise

    @contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError("store: closed")
            try:
                yield conn
            except sqlite3.Error as e:
                raise StoreError(f"store: cannot {what}: {e}") from e

    def _rollback(self) -> None:
        conn = self._conn
        # SQLite may already have rolled back on its own (e.g. after SQLITE_FULL).
        # The original error is the one worth reporting, not a failed rollback.
        if conn is not None and conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def _meta(self, key: str) -> int:
        return self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]

    def _set_meta(self, key: str, value: int) -> None:
        self._conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))

    # -- writes -----------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The last revision this store committed (0 for an empty store)."""
        return self._revision

    def create_jobs(self, items: Sequence[tuple[pb.Job, str]]
                    ) -> list[tuple[pb.Job, bool] | StoreError]:
        """Store new jobs in one transaction (the server group-commits concurrent creates).

        Per (job, request_id): the stored copy (job.revision set; the argument is not
        modified) and True; or, for a request_id already used with an equal spec, the
        existing job and False (no new revision); or RequestConflict (request_id used
        with a different spec) or JobExists (job_id taken). One item's error does not
        fail the others. A failure of the transaction itself raises StoreError and
        commits nothing.
        """
        for job, _ in items:
            if not job.job_id:
                raise ValueError("job.job_id: must be set")
        if not items:
            return []
        out: list[tuple[pb.Job, bool] | StoreError] = []
        with self._lock, self._txn(f"commit {len(items)} new jobs") as conn:
            revision = self._meta("revision")
            for job, request_id in items:
                if request_id:
                    row = conn.execute("SELECT job FROM jobs WHERE request_id = ?",
                                       (request_id,)).fetchone()
                    if row is not None:
                        existing = pb.Job.FromString(row[0])
                        if existing.spec == job.spec:
                            out.append((existing, False))
                        else:
                            out.append(RequestConflict(
                                f"request_id {request_id!r} was already used for job "
                                f"{existing.job_id!r} with a different spec"))
                        continue
                if conn.execute("SELECT 1 FROM jobs WHERE job_id = ?",
                                (job.job_id,)).fetchone() is not None:
                    out.append(JobExists(f"job {job.job_id!r} already exists"))
                    continue
                revision += 1
                stored = pb.Job()
                stored.CopyFrom(job)
                stored.revision = revision
                blob = stored.SerializeToString(deterministic=True)
                conn.execute(
                    "INSERT INTO jobs (job_id, state, tenant, request_id, revision, job)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (stored.job_id, stored.status.state, stored.spec.tenant,
                     request_id or None, revision, blob))
                self._log(revision, pb.JobEvent.KIND_CREATED, stored.job_id, blob)
                out.append((stored, True))
            self._set_meta("revision", revision)
        self._revision = revision
        return out

    def put_jobs(self, items: Sequence[tuple[pb.Job, bytes | None]]) -> list[int]:
        """Update existing jobs in one transaction; returns each one's new revision.

        The revision is stamped into the stored blob (the argument is not modified).
        extra=None keeps the stored extra. An unknown job_id is a caller bug: NotFound,
        and nothing in the batch is written.
        """
        if not items:
            return []
        revisions: list[int] = []
        with self._lock, self._txn(f"commit updates to {len(items)} jobs") as conn:
            revision = self._meta("revision")
            for job, extra in items:
                revision += 1
                stored = pb.Job()
                stored.CopyFrom(job)
                stored.revision = revision
                blob = stored.SerializeToString(deterministic=True)
                cursor = conn.execute(
                    "UPDATE jobs SET state = ?, tenant = ?, revision = ?, job = ?,"
                    " extra = coalesce(?, extra) WHERE job_id = ?",
                    (stored.status.state, stored.spec.tenant, revision, blob, extra,
                     stored.job_id))
                if cursor.rowcount == 0:
                    raise NotFound(f"job {job.job_id!r} not found")
                self._log(revision, pb.JobEvent.KIND_UPDATED, stored.job_id, blob)
                revisions.append(revision)
            self._set_meta("revision", revision)
        self._revision = revision
        return revisions

    def delete_job(self, job_id: str) -> int:
        """Remove a job; returns the revision of its KIND_DELETED changelog entry.

        The entry carries the job's last version, restamped with the delete revision.
        """
        with self._lock, self._txn(f"delete job {job_id!r}") as conn:
            row = conn.execute("SELECT job FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"job {job_id!r} not found")
            revision = self._meta("revision") + 1
            last = pb.Job.FromString(row[0])
            last.revision = revision
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            self._log(revision, pb.JobEvent.KIND_DELETED, job_id,
                      last.SerializeToString(deterministic=True))
            self._set_meta("revision", revision)
        self._revision = revision
        return revision

    def _log(self, revision: int, kind: int, job_id: str, blob: bytes) -> None:
        self._conn.execute(
            "INSERT INTO changelog (revision, kind, job_id, job) VALUES (?, ?, ?, ?)",
            (revision, kind, job_id, blob))

    def compact(self) -> int:
        """Keep only the newest `changelog_limit` changelog entries; returns how many went."""
        with self._lock, self._txn("compact the changelog") as conn:
            count = conn.execute("SELECT count(*) FROM changelog").fetchone()[0]
            drop = count - self.changelog_limit
            if drop <= 0:
                return 0
            through = conn.execute(
                "SELECT revision FROM changelog ORDER BY revision LIMIT 1 OFFSET ?",
                (drop - 1,)).fetchone()[0]
            conn.execute("DELETE FROM changelog WHERE revision <= ?", (through,))
            self._set_meta("compacted_through", through)
        return drop

    def set_drain(self, node: str, reason: str | None) -> None:
        """Record that `node` is drained for `reason`, or (None) that it is not."""
        with self._lock, self._txn(f"record the drain of node {node!r}") as conn:
            if reason is None:
                conn.execute("DELETE FROM drains WHERE node = ?", (node,))
            else:
                conn.execute("INSERT OR REPLACE INTO drains (node, reason) VALUES (?, ?)",
                             (node, reason))

    def add_rounds(self, rounds: Sequence[pb.Round]) -> None:
        """Record published rounds, oldest first, in one transaction; the oldest beyond
        `rounds_limit` go in the same transaction (the table never outgrows it)."""
        if not rounds:
            return
        blobs = [(r.SerializeToString(deterministic=True),) for r in rounds]
        with self._lock, self._txn(f"record {len(rounds)} rounds") as conn:
            conn.executemany("INSERT INTO rounds (round) VALUES (?)", blobs)
            newest = conn.execute("SELECT max(seq) FROM rounds").fetchone()[0]
            conn.execute("DELETE FROM rounds WHERE seq <= ?", (newest - self.rounds_limit,))

    # -- reads ------------------------------------------------------------------------

    def drains(self) -> dict[str, str]:
        """Drained nodes and their reasons."""
        with self._read("read drained nodes") as conn:
            return dict(conn.execute("SELECT node, reason FROM drains").fetchall())

    def rounds(self, limit: int | None = None) -> list[pb.Round]:
        """The newest `limit` (default `rounds_limit`) published rounds, oldest first."""
        with self._read("read rounds") as conn:
            rows = conn.execute("SELECT round FROM rounds ORDER BY seq DESC LIMIT ?",
                                (limit or self.rounds_limit,)).fetchall()
        return [pb.Round.FromString(blob) for (blob,) in reversed(rows)]

    def get_job(self, job_id: str) -> StoredJob | None:
        with self._read(f"read job {job_id!r}") as conn:
            row = conn.execute("SELECT job, extra FROM jobs WHERE job_id = ?",
                               (job_id,)).fetchone()
        return None if row is None else StoredJob(pb.Job.FromString(row[0]), bytes(row[1]))

    def all_jobs(self) -> list[StoredJob]:
        """Every job with its extra, in creation order (for reloading on startup)."""
        with self._read("read all jobs") as conn:
            rows = conn.execute("SELECT job, extra FROM jobs ORDER BY seq").fetchall()
        return [StoredJob(pb.Job.FromString(job), bytes(extra)) for job, extra in rows]

    def list_jobs(self, *, states: Collection[int] = (), tenant: str = "",
                  page_size: int = 100, page_token: str = "") -> tuple[list[pb.Job], str]:
        """One page of jobs in creation order, and the token for the next ("" if none).

        The token is opaque to clients; a malformed one raises ValueError("page_token: ...").
        """
        if page_size < 1:
            raise ValueError("page_size: must be >= 1")
        after = _decode_token(page_token)
        where, args = ["seq > ?"], [after]
        if states:
            states = [int(s) for s in states]
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(states)
        if tenant:
            where.append("tenant = ?")
            args.append(tenant)
        # One row more than asked: tells whether another page exists, so the last
        # page gets "" rather than a token that leads to an empty page.
        sql = (f"SELECT seq, job FROM jobs WHERE {' AND '.join(where)}"
               " ORDER BY seq LIMIT ?")
        with self._read("list jobs") as conn:
            rows = conn.execute(sql, (*args, page_size + 1)).fetchall()
        more = len(rows) > page_size
        rows = rows[:page_size]
        jobs = [pb.Job.FromString(blob) for _, blob in rows]
        return jobs, _encode_token(rows[-1][0]) if more else ""

    def events_since(self, revision: int, limit: int = 1000) -> list[tuple[int, int, pb.Job]]:
        """Up to `limit` changes after `revision`, ascending: (revision, kind, job).

        kind is a pb.JobEvent kind value. Raises Compacted when some of those changes
        were already dropped from the changelog.
        """
        if revision >= 2**63:  # beyond SQLite's integers (a client's uint64): none is newer
            return []
        with self._read(f"read changes since revision {revision}") as conn:
            through = conn.execute(
                "SELECT value FROM meta WHERE key = 'compacted_through'").fetchone()[0]
            if revision < through:
                raise Compacted(f"changes after revision {revision} were compacted "
                                f"(the changelog starts after revision {through})")
            rows = conn.execute(
                "SELECT revision, kind, job FROM changelog WHERE revision > ?"
                " ORDER BY revision LIMIT ?", (revision, limit)).fetchall()
        return [(rev, kind, pb.Job.FromString(blob)) for rev, kind, blob in rows]

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _encode_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def _decode_token(token: str) -> int:
    """The creation sequence number a page token resumes after (0 for no token)."""
    if not token:
        return 0
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        match = _TOKEN.fullmatch(raw.decode("ascii"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        match = None
    if match is None or int(match.group(1)) >= 2**63:  # beyond SQLite's integers
        raise ValueError("page_token: malformed (pass back next_page_token unchanged)")
    return int(match.group(1))
