"""The small pieces the stores' SQL is built from (`sql.py`): the meta counters, the
changelog's rows, trimming a table to its newest rows, `IN` lists in chunks, a job's
stored form, page tokens."""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Collection, Sequence

from sia_grpc.api import pb

_TOKEN = re.compile(r"seq:(\d{1,19})")
MAX_INT = 2**63  # beyond both databases' integers
_IN_CHUNK = 500


def meta(conn, key: str, lock: str = "") -> int:
    return conn.execute(f"SELECT value FROM meta WHERE key = ?{lock}", (key,)).fetchone()[0]


def set_meta(conn, key: str, value: int) -> None:
    conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))


def append_changelog(conn, entries: Sequence[tuple[int, int, str, bytes]]) -> None:
    """Append (revision, kind, job_id, job blob) entries to the changelog."""
    conn.executemany("INSERT INTO changelog (revision, kind, job_id, job) VALUES (?, ?, ?, ?)",
                     entries)


def trim(conn, table: str, key: str, mark: str, keep: int, lock: str) -> int:
    """Keep the newest `keep` rows of `table` (by `key`), noting the last dropped key
    in meta `mark`; how many went."""
    meta(conn, mark, lock)
    count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    drop = count - keep
    if drop <= 0:
        return 0
    through = conn.execute(f"SELECT {key} FROM {table} ORDER BY {key} LIMIT 1 OFFSET ?",
                           (drop - 1,)).fetchone()[0]
    conn.execute(f"DELETE FROM {table} WHERE {key} <= ?", (through,))
    set_meta(conn, mark, through)
    return drop


def select_in(conn, query: str, values: Collection) -> list[tuple]:
    """The rows of `query IN (values)`, in chunks (SQLite binds at most 32,766
    parameters to one statement)."""
    values, rows = list(values), []
    for i in range(0, len(values), _IN_CHUNK):
        chunk = values[i:i + _IN_CHUNK]
        rows += conn.execute(f"{query} IN ({', '.join('?' * len(chunk))})", chunk).fetchall()
    return rows


def stamped(job: pb.Job, revision: int) -> tuple[pb.Job, bytes]:
    """A copy of `job` at `revision`, and its serialized form (the caller's is untouched)."""
    stored = pb.Job()
    stored.CopyFrom(job)
    stored.revision = revision
    return stored, stored.SerializeToString(deterministic=True)


def check_lease_args(holder: str, ttl_s: float) -> None:
    if not holder:
        raise ValueError("holder: must be set")
    if not (ttl_s > 0 and math.isfinite(ttl_s)):
        raise ValueError(f"ttl_s: must be a positive number of seconds, got {ttl_s}")


def encode_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def decode_token(token: str) -> int:
    """The creation sequence number a page token resumes after (0 for no token)."""
    if not token:
        return 0
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        match = _TOKEN.fullmatch(raw.decode("ascii"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        match = None
    if match is None or int(match.group(1)) >= MAX_INT:
        raise ValueError("page_token: malformed (pass back next_page_token unchanged)")
    return int(match.group(1))
