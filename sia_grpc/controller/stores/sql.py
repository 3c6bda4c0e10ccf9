"""The body of both stores: every query and every rule of the contract, written once.

A back-end (`sqlite.py`, `postgres.py`) supplies only what differs: how a
transaction and a read are opened (and which driver errors become `StoreError`),
the DDL of each schema version and where the version is kept, and three pieces
of SQL (`_FOR_UPDATE`, `_FOR_SHARE`: row locks, empty on SQLite whose write
transactions are serialized anyway; `_NOW`: the database's clock in seconds).
Queries use `?` placeholders; the PostgreSQL back-end translates them.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sia_grpc.api import pb
from sia_grpc.controller.stores.contract import (
    LEASE,
    MAX_TERM,
    SCHEMA_VERSION,
    Compacted,
    Fenced,
    JobExists,
    Lease,
    NotFound,
    RequestConflict,
    StoredJob,
    StoreError,
)

_TOKEN = re.compile(r"seq:(\d{1,19})")
_MAX_INT = 2**63  # beyond both databases' integers
_IN_CHUNK = 500


class SqlStore:
    """The shared implementation of `JobStore`; see contract.py for the semantics."""

    _FOR_UPDATE = ""
    _FOR_SHARE = ""
    _NOW = ""  # an SQL expression: the database's clock, seconds since the epoch
    _SCHEMA = ""  # version 1
    _MIGRATIONS: dict[int, str] = {}  # version -> the script that brings a store to it
    name = ""  # what errors call this store (its path, or its DSN without the password)

    def __init__(self, *, changelog_limit: int, rounds_limit: int) -> None:
        if changelog_limit < 0:
            raise ValueError("changelog_limit: must be >= 0")
        if rounds_limit < 1:
            raise ValueError("rounds_limit: must be >= 1")
        self.changelog_limit = changelog_limit
        self.rounds_limit = rounds_limit
        self._revision = 0
        self._fence: tuple[str, int] | None = None  # (lease name, term)

    # -- what a back-end supplies -----------------------------------------------------

    def _txn(self, what: str) -> AbstractContextManager[Any]:
        """One write transaction, yielding something with `execute(sql, args)`; any
        failure rolls it back, a driver error raised as StoreError naming `what`."""
        raise NotImplementedError

    def _read(self, what: str) -> AbstractContextManager[Any]:
        """A connection to read from (a driver error raised as StoreError)."""
        raise NotImplementedError

    def _schema_version(self, conn) -> int:
        raise NotImplementedError

    def _set_schema_version(self, conn, version: int) -> None:
        raise NotImplementedError

    # -- schema -----------------------------------------------------------------------

    def _initialise(self, conn) -> None:
        """Create or upgrade the schema; inside a write transaction that excludes
        every other initialiser (another controller may be opening the same store)."""
        version = self._schema_version(conn)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store: {self.name} has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this controller knows; run a newer controller")
        steps = [self._SCHEMA] if version == 0 else []
        steps += [self._MIGRATIONS[v] for v in range(max(version, 1) + 1, SCHEMA_VERSION + 1)]
        for script in steps:
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
        if version != SCHEMA_VERSION:
            self._set_schema_version(conn, SCHEMA_VERSION)
        self._revision = _meta(conn, "revision")

    # -- transactions -----------------------------------------------------------------

    @contextmanager
    def _write(self, what: str) -> Iterator[Any]:
        """A write transaction of the contract: fenced, when this store is.

        The fence is checked last, just before the commit, in the same transaction: a
        lease change waits for the commit (FOR SHARE) or fails the check, as at the
        start, but the share lock lives only for the commit. Checked first, a write
        waiting on another writer's lock held the lease row for its whole wait, and the
        leader's renewal behind it missed its deadline: the leader stepped down."""
        with self._txn(what) as conn:
            yield conn
            if self._fence is not None:
                self._check_fence(conn, *self._fence)

    def _check_fence(self, conn, name: str, term: int) -> None:
        # FOR SHARE: a concurrent acquire (FOR UPDATE) waits for this transaction.
        row = conn.execute(f"SELECT holder, term, expires_at > {self._NOW} FROM lease"
                           f" WHERE name = ?{self._FOR_SHARE}", (name,)).fetchone()
        if row is None or row[1] != term or not row[2]:
            now = ("never taken" if row is None else
                   f"at term {row[1]} ({row[0] or 'nobody'})" if row[1] != term else "expired")
            raise Fenced(f"store: fenced at term {term} of lease {name!r}, which is {now}; "
                         "nothing was written (this controller is no longer the leader)")

    def _bump(self, revision: int) -> None:
        self._revision = max(self._revision, revision)

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
        with self._write(f"commit {len(items)} new jobs") as conn:
            revision = self._next_revisions(conn)
            # What the batch could collide with, in two queries rather than two per job
            # (a round trip each, on PostgreSQL); then the batch's own jobs join them.
            by_request = dict(_select_in(conn, "SELECT request_id, job FROM jobs WHERE"
                                         " request_id", {r for _, r in items if r}))
            taken = {row[0] for row in _select_in(conn, "SELECT job_id FROM jobs WHERE job_id",
                                                  {job.job_id for job, _ in items})}
            rows, log = [], []
            for job, request_id in items:
                if request_id in by_request:
                    existing = pb.Job.FromString(by_request[request_id])
                    if existing.spec == job.spec:
                        out.append((existing, False))
                    else:
                        out.append(RequestConflict(
                            f"request_id {request_id!r} was already used for job "
                            f"{existing.job_id!r} with a different spec"))
                    continue
                if job.job_id in taken:
                    out.append(JobExists(f"job {job.job_id!r} already exists"))
                    continue
                revision += 1
                stored, blob = _stamped(job, revision)
                rows.append((stored.job_id, stored.status.state, stored.spec.tenant,
                             request_id or None, revision, blob))
                log.append((revision, pb.JobEvent.KIND_CREATED, stored.job_id, blob))
                taken.add(stored.job_id)
                if request_id:
                    by_request[request_id] = blob
                out.append((stored, True))
            if rows:
                conn.executemany(
                    "INSERT INTO jobs (job_id, state, tenant, request_id, revision, job)"
                    " VALUES (?, ?, ?, ?, ?, ?)", rows)
                _log(conn, log)
            _set_meta(conn, "revision", revision)
        self._bump(revision)
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
        with self._write(f"commit updates to {len(items)} jobs") as conn:
            revision = self._next_revisions(conn)
            rows, log = [], []
            for job, extra in items:
                revision += 1
                stored, blob = _stamped(job, revision)
                rows.append((stored.status.state, stored.spec.tenant, revision, blob, extra,
                             stored.job_id))
                log.append((revision, pb.JobEvent.KIND_UPDATED, stored.job_id, blob))
                revisions.append(revision)
            cursor = conn.executemany(  # (one round trip: a pipeline, on PostgreSQL)
                "UPDATE jobs SET state = ?, tenant = ?, revision = ?, job = ?,"
                " extra = coalesce(?, extra) WHERE job_id = ?", rows)
            if cursor.rowcount != len(rows):
                ids = [job.job_id for job, _ in items]
                found = {row[0] for row in _select_in(
                    conn, "SELECT job_id FROM jobs WHERE job_id", set(ids))}
                missing = next(i for i in ids if i not in found)
                raise NotFound(f"job {missing!r} not found")
            _log(conn, log)
            _set_meta(conn, "revision", revision)
        self._bump(revision)
        return revisions

    def delete_job(self, job_id: str) -> int:
        """Remove a job; returns the revision of its KIND_DELETED changelog entry.

        The entry carries the job's last version, restamped with the delete revision.
        """
        with self._write(f"delete job {job_id!r}") as conn:
            revision = self._next_revisions(conn)
            row = conn.execute("SELECT job FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"job {job_id!r} not found")
            revision += 1
            _, blob = _stamped(pb.Job.FromString(row[0]), revision)
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            _log(conn, [(revision, pb.JobEvent.KIND_DELETED, job_id, blob)])
            _set_meta(conn, "revision", revision)
        self._bump(revision)
        return revision

    def _next_revisions(self, conn) -> int:
        """The last revision, locked against every other writer until commit."""
        return _meta(conn, "revision", self._FOR_UPDATE)

    def compact(self) -> int:
        """Keep only the newest `changelog_limit` changelog entries; returns how many went."""
        with self._write("compact the changelog") as conn:
            _meta(conn, "compacted_through", self._FOR_UPDATE)
            count = conn.execute("SELECT count(*) FROM changelog").fetchone()[0]
            drop = count - self.changelog_limit
            if drop <= 0:
                return 0
            through = conn.execute(
                "SELECT revision FROM changelog ORDER BY revision LIMIT 1 OFFSET ?",
                (drop - 1,)).fetchone()[0]
            conn.execute("DELETE FROM changelog WHERE revision <= ?", (through,))
            _set_meta(conn, "compacted_through", through)
        return drop

    def set_drain(self, node: str, reason: str | None) -> None:
        """Record that `node` is drained for `reason`, or (None) that it is not."""
        with self._write(f"record the drain of node {node!r}") as conn:
            if reason is None:
                conn.execute("DELETE FROM drains WHERE node = ?", (node,))
            else:
                conn.execute("INSERT INTO drains (node, reason) VALUES (?, ?) ON CONFLICT"
                             " (node) DO UPDATE SET reason = excluded.reason", (node, reason))

    def add_rounds(self, rounds: Sequence[pb.Round]) -> None:
        """Record published rounds, oldest first, in one transaction; the oldest beyond
        `rounds_limit` go in the same transaction (the table never outgrows it)."""
        if not rounds:
            return
        with self._write(f"record {len(rounds)} rounds") as conn:
            conn.executemany("INSERT INTO rounds (round) VALUES (?)",
                             [(r.SerializeToString(deterministic=True),) for r in rounds])
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
        where, args = ["seq > ?"], list[int | str]([after])
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
        if revision >= _MAX_INT:  # beyond the database's integers (a client's uint64)
            return []
        with self._read(f"read changes since revision {revision}") as conn:
            rows = conn.execute(
                "SELECT revision, kind, job FROM changelog WHERE revision > ?"
                " ORDER BY revision LIMIT ?", (revision, limit)).fetchall()
            # After the rows, not before: a compaction between the two reads shows
            # here, rather than as a silent gap in the rows.
            through = _meta(conn, "compacted_through")
        if revision < through:
            raise Compacted(f"changes after revision {revision} were compacted "
                            f"(the changelog starts after revision {through})")
        return [(rev, kind, pb.Job.FromString(blob)) for rev, kind, blob in rows]

    # -- the lease --------------------------------------------------------------------

    def try_acquire(self, holder: str, ttl_s: float, *, address: str = "",
                    name: str = LEASE) -> int | None:
        """Take lease `name` for `ttl_s` seconds if it is free or expired: its new term
        (the last one + 1, never reused); None while another holds it (or `holder`
        itself: a holder renews, it does not acquire twice)."""
        _check_lease_args(holder, ttl_s)
        with self._txn(f"acquire lease {name!r}") as conn:
            conn.execute("INSERT INTO lease (name, holder, address, term, expires_at)"
                         " VALUES (?, '', '', 0, 0) ON CONFLICT (name) DO NOTHING", (name,))
            term, held = conn.execute(f"SELECT term, expires_at > {self._NOW} FROM lease"
                                      f" WHERE name = ?{self._FOR_UPDATE}", (name,)).fetchone()
            if held:
                return None
            conn.execute(f"UPDATE lease SET holder = ?, address = ?, term = ?,"
                         f" expires_at = {self._NOW} + ? WHERE name = ?",
                         (holder, address, term + 1, ttl_s, name))
        return term + 1

    def renew(self, holder: str, term: int, ttl_s: float, *, name: str = LEASE) -> bool:
        """Extend the lease to `ttl_s` from now; False when `holder` no longer holds it
        at `term` (it expired, even if nobody took it since: acquire again)."""
        _check_lease_args(holder, ttl_s)
        with self._txn(f"renew lease {name!r}") as conn:
            return self._update_held(conn, f"expires_at = {self._NOW} + ?", (ttl_s,),
                                     name, holder, term)

    def release(self, holder: str, term: int, *, raise_to: int = 0,
                name: str = LEASE) -> bool:
        """Give the lease up now (it expires; its term stays, so it is never reused);
        False when `holder` did not hold it at `term`, and then nothing changes.

        `raise_to`: the lease's term becomes at least that, so the next acquire takes
        a term above it (a leader that learnt its term was handed out before: the
        database was restored). It only ever raises: `term` is what the row holds
        (the update is conditioned on it), so max(term, raise_to) is never lower."""
        if not 0 <= raise_to < MAX_TERM:  # (the next acquire takes raise_to + 1)
            raise ValueError(f"raise_to: must be in [0, {MAX_TERM}), got {raise_to}")
        with self._txn(f"release lease {name!r}") as conn:
            return self._update_held(conn, f"expires_at = {self._NOW}, term = ?",
                                     (max(term, raise_to),), name, holder, term)

    def _update_held(self, conn, assignment: str, args: tuple, name: str, holder: str,
                     term: int) -> bool:
        cursor = conn.execute(
            f"UPDATE lease SET {assignment} WHERE name = ? AND holder = ? AND term = ?"
            f" AND expires_at > {self._NOW}", (*args, name, holder, term))
        return cursor.rowcount == 1

    def leader(self, *, name: str = LEASE) -> Lease | None:
        """Who holds lease `name` now, or None when it is free or expired."""
        with self._read(f"read lease {name!r}") as conn:
            row = conn.execute(
                f"SELECT holder, address, term, expires_at - {self._NOW} FROM lease"
                f" WHERE name = ? AND expires_at > {self._NOW}", (name,)).fetchone()
        return None if row is None else Lease(row[0], row[1], row[2], float(row[3]))

    def fence(self, term: int | None, *, name: str = LEASE) -> None:
        """From now on, write only while lease `name` is held at `term` (None: unfenced)."""
        self._fence = None if term is None else (name, int(term))

    def end_deposed(self) -> int:
        """End the transactions other controllers hold open on this (fenced) store;
        how many. None can write here but this one (SQLite: the file lock): 0."""
        return 0

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _meta(conn, key: str, lock: str = "") -> int:
    return conn.execute(f"SELECT value FROM meta WHERE key = ?{lock}", (key,)).fetchone()[0]


def _set_meta(conn, key: str, value: int) -> None:
    conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))


def _log(conn, entries: Sequence[tuple[int, int, str, bytes]]) -> None:
    """Append (revision, kind, job_id, job blob) entries to the changelog."""
    conn.executemany("INSERT INTO changelog (revision, kind, job_id, job) VALUES (?, ?, ?, ?)",
                     entries)


def _select_in(conn, query: str, values: Collection) -> list[tuple]:
    """The rows of `query IN (values)`, in chunks (SQLite binds at most 32,766
    parameters to one statement)."""
    values, rows = list(values), []
    for i in range(0, len(values), _IN_CHUNK):
        chunk = values[i:i + _IN_CHUNK]
        rows += conn.execute(f"{query} IN ({', '.join('?' * len(chunk))})", chunk).fetchall()
    return rows


def _stamped(job: pb.Job, revision: int) -> tuple[pb.Job, bytes]:
    """A copy of `job` at `revision`, and its serialized form (the caller's is untouched)."""
    stored = pb.Job()
    stored.CopyFrom(job)
    stored.revision = revision
    return stored, stored.SerializeToString(deterministic=True)


def _check_lease_args(holder: str, ttl_s: float) -> None:
    if not holder:
        raise ValueError("holder: must be set")
    if not (ttl_s > 0 and math.isfinite(ttl_s)):
        raise ValueError(f"ttl_s: must be a positive number of seconds, got {ttl_s}")


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
    if match is None or int(match.group(1)) >= _MAX_INT:
        raise ValueError("page_token: malformed (pass back next_page_token unchanged)")
    return int(match.group(1))
