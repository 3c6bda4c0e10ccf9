"""The controller's durable state behind one contract (`contract.JobStore`), on two
back-ends: an embedded SQLite file (the default) or a PostgreSQL database (for
controllers that fail over; docs/architecture.md, "Stores")."""

from __future__ import annotations

from sia_grpc.controller.stores.contract import (
    LEASE,
    MAX_TERM,
    SCHEMA_VERSION,
    Compacted,
    EventQuery,
    Fenced,
    JobExists,
    JobStore,
    Lease,
    NotFound,
    RequestConflict,
    StoredJob,
    StoreError,
    job_event,
)
from sia_grpc.controller.stores.sqlite import SqliteStore

__all__ = ["LEASE", "MAX_TERM", "SCHEMA_VERSION", "Compacted", "EventQuery", "Fenced",
           "JobExists", "JobStore", "Lease", "NotFound", "RequestConflict", "SqliteStore",
           "StoreError", "StoredJob", "describe", "is_postgres", "job_event",
           "open_store"]


def is_postgres(target: str) -> bool:
    """Whether `target` names a PostgreSQL database (a DSN) rather than a SQLite file."""
    return str(target).startswith(("postgresql://", "postgres://"))


def describe(target: str) -> str:
    """`target` as it may be logged: a DSN's password redacted."""
    if not is_postgres(target):
        return str(target)
    from sia_grpc.controller.stores.postgres import redact
    return redact(target)


def open_store(target: str, *, password: str | None = None, **options) -> JobStore:
    """The store at `target`: a `postgresql://` (or `postgres://`) DSN opens the
    PostgreSQL store (with `password`, if given), anything else is a SQLite path.
    `options` are the back-end's own (synchronous, changelog_limit, rounds_limit,
    busy_timeout: the same on both)."""
    if is_postgres(target):
        # Imported here: a SQLite controller never loads the driver.
        from sia_grpc.controller.stores.postgres import PostgresStore
        return PostgresStore(target, password=password, **options)
    if password is not None:
        raise ValueError("store_password_file: only for a postgresql:// store")
    return SqliteStore(target, **options)
