"""The body of both stores: every query and every rule of the contract, written once.

A back-end (`sqlite.py`, `postgres.py`) supplies only what differs: how a
transaction and a read are opened (and which driver errors become `StoreError`),
the DDL of each schema version and where the version is kept, and three pieces
of SQL (`_FOR_UPDATE`, `_FOR_SHARE`: row locks, empty on SQLite whose write
transactions are serialized anyway; `_NOW`: the database's clock in seconds).
Queries use `?` placeholders; the PostgreSQL back-end translates them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sia_grpc.api import pb
from sia_grpc.controller.stores.contract import (
    LEASE,
    MAX_TERM,
    SCHEMA_VERSION,
    Compacted,
    EventQuery,
    Fenced,
    JobExists,
    Lease,
    NotFound,
    RequestConflict,
    StoredJob,
    StoreError,
    job_event,
)
from sia_grpc.controller.stores.rows import (
    MAX_INT,
    append_changelog,
    check_lease_args,
    decode_token,
    encode_token,
    meta,
    select_in,
    set_meta,
    stamped,
    trim,
)


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
        self._revision = meta(conn, "revision")

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

    def create_jobs(self, items: Sequence[tuple[pb.Job, str]], *, term: int = 0
                    ) -> list[tuple[pb.Job, bool] | StoreError]:
        """Store new jobs in one transaction (the server group-commits concurrent creates).

        Per (job, request_id): the stored copy (job.revision set; the argument is not
        modified) and True; or, for a request_id already used with an equal spec, the
        existing job and False (no new revision); or RequestConflict (request_id used
        with a different spec) or JobExists (job_id taken). One item's error does not
        fail the others. A failure of the transaction itself raises StoreError and
        commits nothing. Each new job's JOB_SUBMITTED event (of `term`) is recorded
        with it.
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
            by_request = dict(select_in(conn, "SELECT request_id, job FROM jobs WHERE"
                                         " request_id", {r for _, r in items if r}))
            taken = {row[0] for row in select_in(conn, "SELECT job_id FROM jobs WHERE job_id",
                                                  {job.job_id for job, _ in items})}
            rows, log, submitted = [], [], []
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
                stored, blob = stamped(job, revision)
                rows.append((stored.job_id, stored.status.state, stored.spec.tenant,
                             request_id or None, revision, blob))
                log.append((revision, pb.JobEvent.KIND_CREATED, stored.job_id, blob))
                submitted.append(job_event(stored, pb.EVENT_KIND_JOB_SUBMITTED, term,
                                           f"submitted to queue {stored.spec.queue or 'default'}"))
                taken.add(stored.job_id)
                if request_id:
                    by_request[request_id] = blob
                out.append((stored, True))
            if rows:
                conn.executemany(
                    "INSERT INTO jobs (job_id, state, tenant, request_id, revision, job)"
                    " VALUES (?, ?, ?, ?, ?, ?)", rows)
                append_changelog(conn, log)
                self._record(conn, submitted)
            set_meta(conn, "revision", revision)
        self._bump(revision)
        return out

    def put_jobs(self, items: Sequence[tuple[pb.Job, bytes | None]],
                 events: Sequence[pb.Event] = (), rounds: Sequence[pb.Round] = ()
                 ) -> list[int]:
        """Update existing jobs in one transaction; returns each one's new revision.

        The revision is stamped into the stored blob (the argument is not modified).
        extra=None keeps the stored extra. An unknown job_id is a caller bug: NotFound,
        and nothing in the batch is written. `events` (each copy with the next event
        id) and published `rounds` (the newest `rounds_limit` kept) are recorded in the same
        transaction: a batch's history is written with its state.
        """
        if not items and not events and not rounds:
            return []
        revisions: list[int] = []
        with self._write(f"commit updates to {len(items)} jobs") as conn:
            revision = self._next_revisions(conn)
            rows, log = [], []
            for job, extra in items:
                revision += 1
                stored, blob = stamped(job, revision)
                rows.append((stored.status.state, stored.spec.tenant, revision, blob, extra,
                             stored.job_id))
                log.append((revision, pb.JobEvent.KIND_UPDATED, stored.job_id, blob))
                revisions.append(revision)
            cursor = conn.executemany(  # (one round trip: a pipeline, on PostgreSQL)
                "UPDATE jobs SET state = ?, tenant = ?, revision = ?, job = ?,"
                " extra = coalesce(?, extra) WHERE job_id = ?", rows) if rows else None
            if cursor is not None and cursor.rowcount != len(rows):
                ids = [job.job_id for job, _ in items]
                found = {row[0] for row in select_in(
                    conn, "SELECT job_id FROM jobs WHERE job_id", set(ids))}
                missing = next(i for i in ids if i not in found)
                raise NotFound(f"job {missing!r} not found")
            append_changelog(conn, log)
            self._record(conn, events)
            self._add_rounds(conn, rounds)
            set_meta(conn, "revision", revision)
        self._bump(revision)
        return revisions

    def delete_job(self, job_id: str, *, term: int = 0, at: float = 0.0) -> int:
        """Remove a job; returns the revision of its KIND_DELETED changelog entry.

        The entry carries the job's last version, restamped with the delete revision;
        its JOB_DELETED event (of `term`, at `at`) is recorded with it.
        """
        with self._write(f"delete job {job_id!r}") as conn:
            revision = self._next_revisions(conn)
            row = conn.execute("SELECT job FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"job {job_id!r} not found")
            revision += 1
            _, blob = stamped(pb.Job.FromString(row[0]), revision)
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            append_changelog(conn, [(revision, pb.JobEvent.KIND_DELETED, job_id, blob)])
            deleted = job_event(pb.Job.FromString(blob), pb.EVENT_KIND_JOB_DELETED, term,
                                "deleted")
            deleted.time.FromNanoseconds(int(at * 1e9))
            self._record(conn, [deleted])
            set_meta(conn, "revision", revision)
        self._bump(revision)
        return revision

    def _record(self, conn, events: Sequence[pb.Event]) -> None:
        """Append `events` to the history, each with the next event id (the ids
        locked against every other writer until commit, like the revisions)."""
        if not events:
            return
        first = meta(conn, "event_id", self._FOR_UPDATE) + 1
        rows = []
        for event_id, event in enumerate(events, start=first):
            stored = pb.Event()
            stored.CopyFrom(event)
            stored.id = event_id
            rows.append((event_id, stored.kind, stored.job_id, stored.node, stored.queue,
                         stored.SerializeToString(deterministic=True)))
        conn.executemany("INSERT INTO events (id, kind, job_id, node, queue, event)"
                         " VALUES (?, ?, ?, ?, ?, ?)", rows)
        set_meta(conn, "event_id", first + len(rows) - 1)

    def _next_revisions(self, conn) -> int:
        """The last revision, locked against every other writer until commit."""
        return meta(conn, "revision", self._FOR_UPDATE)

    def compact(self) -> int:
        """Keep only the newest `changelog_limit` changelog entries, and as many
        events; returns how many changelog entries went."""
        with self._write("compact the changelog") as conn:
            dropped = trim(conn, "changelog", "revision", "compacted_through",
                            self.changelog_limit, self._FOR_UPDATE)
            trim(conn, "events", "id", "events_compacted_through", self.changelog_limit,
                  self._FOR_UPDATE)
        return dropped

    def set_drain(self, node: str, reason: str | None) -> None:
        """Record that `node` is drained for `reason`, or (None) that it is not."""
        with self._write(f"record the drain of node {node!r}") as conn:
            if reason is None:
                conn.execute("DELETE FROM drains WHERE node = ?", (node,))
            else:
                conn.execute("INSERT INTO drains (node, reason) VALUES (?, ?) ON CONFLICT"
                             " (node) DO UPDATE SET reason = excluded.reason", (node, reason))

    def _add_rounds(self, conn, rounds: Sequence[pb.Round]) -> None:
        """Record published rounds, oldest first; the oldest beyond `rounds_limit` go
        in the same transaction (the table never outgrows it)."""
        if not rounds:
            return
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
        after = decode_token(page_token)
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
        return jobs, encode_token(rows[-1][0]) if more else ""

    def events_since(self, revision: int, limit: int = 1000) -> list[tuple[int, int, pb.Job]]:
        """Up to `limit` changes after `revision`, ascending: (revision, kind, job).

        kind is a pb.JobEvent kind value. Raises Compacted when some of those changes
        were already dropped from the changelog.
        """
        if revision >= MAX_INT:  # beyond the database's integers (a client's uint64)
            return []
        with self._read(f"read changes since revision {revision}") as conn:
            rows = conn.execute(
                "SELECT revision, kind, job FROM changelog WHERE revision > ?"
                " ORDER BY revision LIMIT ?", (revision, limit)).fetchall()
            # After the rows, not before: a compaction between the two reads shows
            # here, rather than as a silent gap in the rows.
            through = meta(conn, "compacted_through")
        if revision < through:
            raise Compacted(f"changes after revision {revision} were compacted "
                            f"(the changelog starts after revision {through})")
        return [(rev, kind, pb.Job.FromString(blob)) for rev, kind, blob in rows]

    def cluster_events(self, where: EventQuery, after_id: int = 0, limit: int = 100, *,
                       newest: bool = False) -> list[pb.Event]:
        """Up to `limit` events after `after_id` that match `where`, oldest first: the
        first ones after it, or (`newest`) the newest ones. Raises Compacted when some
        events after `after_id` were already dropped (an `after_id` of 0 never does:
        it asks for what is kept)."""
        if after_id >= MAX_INT:
            return []
        sql, args = ["id > ?"], list[int | str]([after_id])
        for column, value in (("job_id", where.job_id), ("node", where.node),
                              ("queue", where.queue)):
            if value:
                sql.append(f"{column} = ?")
                args.append(value)
        if where.kinds:
            sql.append(f"kind IN ({', '.join('?' * len(where.kinds))})")
            args.extend(int(k) for k in where.kinds)
        if where.tenant:  # its jobs' events, and those about no job
            sql.append("(job_id = '' OR substr(job_id, 1, ?) = ?)")
            args.extend((len(where.tenant) + 1, where.tenant + "/"))
        order = "DESC" if newest else "ASC"
        with self._read("read events") as conn:
            rows = conn.execute(f"SELECT event FROM events WHERE {' AND '.join(sql)}"
                                f" ORDER BY id {order} LIMIT ?", (*args, limit)).fetchall()
            through = meta(conn, "events_compacted_through")
        if after_id and after_id < through:
            raise Compacted(f"events after id {after_id} were compacted (the history "
                            f"starts after id {through})")
        events = [pb.Event.FromString(blob) for (blob,) in rows]
        return events[::-1] if newest else events

    # -- the lease --------------------------------------------------------------------

    def try_acquire(self, holder: str, ttl_s: float, *, address: str = "",
                    name: str = LEASE) -> int | None:
        """Take lease `name` for `ttl_s` seconds if it is free or expired: its new term
        (the last one + 1, never reused); None while another holds it (or `holder`
        itself: a holder renews, it does not acquire twice)."""
        check_lease_args(holder, ttl_s)
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
        check_lease_args(holder, ttl_s)
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

