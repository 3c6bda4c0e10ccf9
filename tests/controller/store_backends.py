"""The store back-ends the store tests run on (the `backend` fixture, conftest.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sia_grpc.controller.stores import JobStore, open_store


class Backend:
    """One store location (a SQLite file, or a PostgreSQL database) that tests open,
    close and reopen, and reach into with plain SQL behind the store's back."""

    name = ""
    target = ""

    def open(self, **kw) -> JobStore:
        return open_store(self.target, **kw)

    def sql(self, statement: str) -> list[tuple]:
        """Run one statement in its own committed transaction; its rows."""
        raise NotImplementedError

    def schema_version(self) -> int:
        raise NotImplementedError

    def set_schema_version(self, version: int) -> None:
        raise NotImplementedError

    @contextmanager
    def writer_waiting(self) -> Iterator[None]:
        """Another connection holds the write lock the store's writes need."""
        raise NotImplementedError
        yield


class Sqlite(Backend):
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.target = str(path)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.target, isolation_level=None)

    def sql(self, statement: str) -> list[tuple]:
        conn = self._connect()
        try:
            return conn.execute(statement).fetchall()
        finally:
            conn.close()

    def schema_version(self) -> int:
        return self.sql("PRAGMA user_version")[0][0]

    def set_schema_version(self, version: int) -> None:
        self.sql(f"PRAGMA user_version = {version}")

    @contextmanager
    def writer_waiting(self) -> Iterator[None]:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()


class Postgres(Backend):
    name = "postgres"

    def __init__(self, dsn: str) -> None:
        self.target = dsn

    def sql(self, statement: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.target, autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def schema_version(self) -> int:
        return self.sql("SELECT value FROM meta WHERE key = 'schema_version'")[0][0]

    def set_schema_version(self, version: int) -> None:
        self.sql(f"UPDATE meta SET value = {version} WHERE key = 'schema_version'")

    @contextmanager
    def writer_waiting(self) -> Iterator[None]:
        import psycopg

        with psycopg.connect(self.target) as conn:  # a transaction until rollback
            conn.execute("SELECT value FROM meta WHERE key = 'revision' FOR UPDATE")
            yield
            conn.rollback()
