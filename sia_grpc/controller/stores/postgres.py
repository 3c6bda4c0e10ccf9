"""The shared store: jobs, their changelog and the controllers' lease in PostgreSQL.

Selected by a DSN (`store = "postgresql://user@host/db"`), for controllers that
must survive the loss of a machine: the database is the one every platform team
already runs, replicates and backs up. The queries and the rules are
`sql.SqlStore`'s, shared with the SQLite store; what differs here:

- Connections come from a psycopg 3 `ConnectionPool` (autocommit; each call opens
  its own transaction), used synchronously from the controller's store thread like
  the SQLite store (docs/architecture.md, "Stores", says why not async).
- Writers are serialized by a row lock on the revision (`FOR UPDATE`), so
  revisions are gap-free and committed in order even with two controllers on one
  database; a fenced write takes a share lock on its lease row, so an acquire
  waits for it.
- The lease's clock is the database's (`clock_timestamp()`), never a controller's.
- The password is never part of a message: `name` (in errors and logs) is the DSN
  with it redacted.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from sia_grpc.controller.stores.contract import StoreError
from sia_grpc.controller.stores.sql import SqlStore

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

# The same tables, columns and versions as sqlite.py's. seq is an identity: a
# sequence never hands out a number twice, so a page token stays a valid resume point.
_SCHEMA = """
CREATE TABLE meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO meta (key, value) VALUES ('revision', 0), ('compacted_through', 0);
CREATE TABLE jobs (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     text NOT NULL UNIQUE,
    state      integer NOT NULL,
    tenant     text NOT NULL,
    request_id text,
    revision   bigint NOT NULL,
    job        bytea NOT NULL,
    extra      bytea NOT NULL DEFAULT ''::bytea
);
CREATE UNIQUE INDEX jobs_by_request ON jobs (request_id) WHERE request_id IS NOT NULL;
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_tenant ON jobs (tenant, seq);
CREATE TABLE changelog (
    revision bigint PRIMARY KEY,
    kind     integer NOT NULL,
    job_id   text NOT NULL,
    job      bytea NOT NULL
);
"""

_MIGRATIONS = {
    2: "CREATE TABLE drains (node text PRIMARY KEY, reason text NOT NULL);",
    3: """
CREATE TABLE rounds (
    seq   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    round bytea NOT NULL
);
""",
    4: """
CREATE TABLE lease (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    address    text NOT NULL,
    term       bigint NOT NULL,
    expires_at double precision NOT NULL
);
""",
    5: """
CREATE TABLE events (
    id     bigint PRIMARY KEY,
    kind   integer NOT NULL,
    job_id text NOT NULL,
    node   text NOT NULL,
    queue  text NOT NULL,
    event  bytea NOT NULL
);
CREATE INDEX events_by_job ON events (job_id, id);
INSERT INTO meta (key, value) VALUES ('event_id', 0), ('events_compacted_through', 0);
""",
}

# A connection whose peer vanished (a pulled cable, a blackholed route, a server
# host that died) sends no FIN or RST: without these, a query on it waits for the
# kernel's retransmissions (~15 min) and an idle one forever. With them it fails in
# seconds: unacknowledged data for tcp_user_timeout ms, or an idle connection whose
# keepalive probes go unanswered (idle + interval * count s). A DSN's own values win.
_TCP_DEFAULTS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 1,
                 "keepalives_count": 3, "tcp_user_timeout": 5000}
# ... and the server's end of the same connection, set per session: a backend whose
# controller vanished inside a transaction holds its row locks until its socket is
# seen dead, by default the kernel's two hours of keepalive silence.
_SERVER_KEEPALIVES = {"tcp_keepalives_idle": "keepalives_idle",
                      "tcp_keepalives_interval": "keepalives_interval",
                      "tcp_keepalives_count": "keepalives_count"}

# Every session's application_name: this, a space and the store's own random tag,
# so a new leader can tell its own sessions from another controller's.
_APPLICATION = "sia-controller"

# Taken by whoever creates or upgrades the schema: two controllers opening a new
# database at once would otherwise both try.
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('sia-grpc store schema'))"


def redact(dsn: str) -> str:
    """The DSN with its password (in the user part or a `password=` parameter) as ***."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{hostinfo}"
    query = [(k, "***" if k == "password" else v)
             for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*/")))


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    return sql.replace("?", "%s")


class _Conn:
    """A psycopg connection that takes the shared SQL's `?` placeholders."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args=()) -> psycopg.Cursor:
        return self._conn.execute(_placeholders(sql), args)

    def executemany(self, sql: str, rows) -> psycopg.Cursor:
        """One statement for many rows, pipelined (one round trip); rowcount: all of them."""
        cursor = self._conn.cursor()
        cursor.executemany(_placeholders(sql), rows)
        return cursor


class PostgresStore(SqlStore):
    _FOR_UPDATE = " FOR UPDATE"
    _FOR_SHARE = " FOR SHARE"
    _NOW = "extract(epoch FROM clock_timestamp())::float8"
    _SCHEMA = _SCHEMA
    _MIGRATIONS = _MIGRATIONS

    def __init__(self, dsn: str, *, password: str | None = None, synchronous: str = "FULL",
                 changelog_limit: int = 100_000, rounds_limit: int = 1000,
                 busy_timeout: float = 5.0, connect_timeout: float = 10.0,
                 pool_size: int = 4) -> None:
        """Open the store in the database `dsn` names, creating or upgrading its tables.

        `password` (from store_password_file) is added to the DSN; without it libpq
        takes the DSN's own, PGPASSWORD or ~/.pgpass. `busy_timeout` (seconds) is how
        long a statement waits for a lock, and a call for a pooled connection, before
        StoreError. `synchronous="OFF"` commits without waiting for the server's WAL
        flush (synchronous_commit=off: a crash of the database may lose the newest
        commits); any other value keeps the server's setting.
        """
        synchronous = synchronous.upper()
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous: must be one of {', '.join(_SYNCHRONOUS)}")
        super().__init__(changelog_limit=changelog_limit, rounds_limit=rounds_limit)
        self.name = redact(dsn)
        self._busy_ms = int(busy_timeout * 1000)
        self._synchronous_off = synchronous == "OFF"
        self._pool: ConnectionPool | None = None
        self._application = f"{_APPLICATION} {uuid.uuid4().hex[:12]}"
        extra = {"password": password} if password is not None else {}
        try:
            given = conninfo_to_dict(dsn)
            defaults = {k: v for k, v in {**_TCP_DEFAULTS,
                                          "connect_timeout": max(1, round(connect_timeout))
                                          }.items() if k not in given}
            conninfo = make_conninfo(dsn, application_name=self._application, **defaults,
                                     **extra)
        except psycopg.Error as e:
            raise StoreError(f"store: cannot open {self.name}: {e}") from e
        tcp = {**_TCP_DEFAULTS, **given}
        self._keepalives = {} if str(tcp["keepalives"]) == "0" else {
            setting: int(str(tcp[param])) for setting, param in _SERVER_KEEPALIVES.items()}
        # First one plain connection: its failure says why (a pool's says only "timeout").
        with self._errors(f"open {self.name}"), psycopg.connect(conninfo, autocommit=True) as c:
            self._configure(c)
            with c.transaction():
                c.execute(_SCHEMA_LOCK)
                self._initialise(_Conn(c))
        pool = ConnectionPool(conninfo, min_size=1, max_size=pool_size, open=False,
                              kwargs={"autocommit": True}, configure=self._configure,
                              # A connection the server dropped (a restart) is replaced
                              # on checkout rather than failing one call.
                              check=ConnectionPool.check_connection,
                              timeout=busy_timeout, name="sia-store")
        with self._errors(f"open {self.name}"):
            pool.open(wait=True, timeout=connect_timeout)
        self._pool = pool

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute(f"SET lock_timeout = {self._busy_ms}")
        # A controller stopped inside a write (SIGSTOP, a VM paused, swapped out) keeps
        # its transaction open and the revision's row lock with it: the other
        # controller, leader once the lease runs out, could write nothing until the
        # stopped one ran again. Its transaction is ended by the server once idle as
        # long as a writer waits for a lock; a running controller never idles inside
        # one (each call is one transaction, its statements back to back).
        conn.execute(f"SET idle_in_transaction_session_timeout = {self._busy_ms}")
        # ... which does not cover a transaction stopped inside a pipeline (before its
        # Sync the server is not "idle"): for that, `end_deposed`, and these.
        for setting, value in self._keepalives.items():
            conn.execute(f"SET {setting} = {value}")
        if self._synchronous_off:
            conn.execute("SET synchronous_commit = off")

    def end_deposed(self) -> int:
        """End every transaction another controller holds open that has taken a row
        lock or written (`backend_xid`): on taking office, a deposed leader's, cut off
        or stopped inside a write. The fence would refuse it at its commit, but until
        then its locks, the revision's among them, hold every write of this leader;
        and one stopped inside a pipeline (`executemany`) is never "idle", so
        idle_in_transaction_session_timeout does not end it. Checked in the same
        transaction that this store still holds its fence's lease (the share lock
        keeps it held meanwhile): a deposed leader ends nobody's."""
        if self._fence is None:
            raise StoreError("store: end_deposed needs a fenced store (a leader's)")
        with self._txn("end a deposed controller's transactions") as conn:
            self._check_fence(conn, *self._fence)
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name LIKE ? AND application_name <> ?"
                " AND backend_xid IS NOT NULL",
                (f"{_APPLICATION} %", self._application)).fetchall()
        return sum(1 for (ended,) in rows if ended)

    def _schema_version(self, conn) -> int:
        if conn.execute("SELECT to_regclass('meta')").fetchone()[0] is None:
            return 0
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return 1 if row is None else row[0]

    def _set_schema_version(self, conn, version: int) -> None:
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) ON CONFLICT"
                     " (key) DO UPDATE SET value = excluded.value", (version,))

    # -- transactions and errors ------------------------------------------------------

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as e:  # (the pool's PoolTimeout is one too)
            # libpq's messages run over lines (a hint on the next): one line here.
            why = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
            raise StoreError(f"store: cannot {what}: {why}") from e

    @contextmanager
    def _connection(self, what: str) -> Iterator[psycopg.Connection]:
        pool = self._pool
        if pool is None:
            raise StoreError("store: closed")
        with self._errors(what), pool.connection() as conn:
            yield conn

    @contextmanager
    def _txn(self, what: str) -> Iterator[_Conn]:
        with self._connection(what) as conn, conn.transaction():
            yield _Conn(conn)

    @contextmanager
    def _write(self, what: str) -> Iterator[_Conn]:
        """`SqlStore._write`; and a leader's write (a fenced one) that waited out its lock
        ends the transactions other controllers hold open (`end_deposed`) before its
        error goes up, so that the caller's next try finds the lock free: whatever
        another controller holds while this one holds the lease is a deposed leader's
        write that its commit would refuse (or a standby's acquire, which retries)."""
        try:
            with super()._write(what) as conn:
                yield conn
        except StoreError as err:
            ended = self._end_blockers(err)
            if not ended:
                raise
            raise StoreError(f"{err}; ended {ended} transaction(s) another controller held "
                             "open (a deposed leader's): try again") from err

    def _end_blockers(self, err: StoreError) -> int:
        """After a failed write: `end_deposed` if it waited out a lock and this store is
        fenced (a leader's); how many it ended (0 if none, or it could not)."""
        if self._fence is None or not isinstance(err.__cause__, psycopg.errors.LockNotAvailable):
            return 0
        try:
            return self.end_deposed()
        except StoreError:  # (fenced now, or not allowed: the first error stands)
            return 0

    @contextmanager
    def _read(self, what: str) -> Iterator[_Conn]:
        with self._connection(what) as conn:
            yield _Conn(conn)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
