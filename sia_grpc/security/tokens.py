"""Bearer tokens mapped to tenants, stored only as SHA-256 hashes.

The tokens file (TOML):

    [[token]]
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    tenant = "team-a"
    role = "user"          # or "admin": sees and manages every tenant's jobs
    name = "ci"            # optional, for humans and logs
    created = 2026-01-05T09:30:00Z   # optional; `sia tokens add` writes it
    queues = ["research"]  # optional: the only queues its jobs may go to (the
                           # first when a spec names none); absent: any queue
                           # that admits the tenant

A client sends `authorization: Bearer <token>`; the controller hashes it and looks
the hash up. The file never holds a token, so reading it (a backup, a leaked
ConfigMap) gives nobody access. `add_token` (`sia tokens add`) makes a token with
`secrets.token_urlsafe(32)` (256 bits), appends its hash and returns it once;
`list_tokens` (`sia tokens list`) shows the entries without their hashes (an id of
12 hex digits of it instead), and `revoke_token` (`sia tokens revoke`) removes one,
replacing the file atomically with its mode, owner and group kept.

`TokenStore` reloads the file when its mtime, size or inode changes (checked at
most once a second, on use) and on `reload()` (the controller calls it on SIGHUP),
so tokens are added and revoked without a restart. A file that fails to parse is
logged and the previous tokens stay in force: a typo must not lock everyone out,
nor let everyone in.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import structlog

from sia_grpc.names import MAX_ID, is_name

__all__ = ["ROLES", "Principal", "TokenError", "TokenInfo", "TokenStore", "add_token",
           "hash_token", "list_tokens", "revoke_token"]

log = structlog.get_logger("sia.security")

ROLES = ("user", "admin")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*token[ \t]*\]\]", re.MULTILINE)  # a [[token]] line
ID_DIGITS = 12  # of the SHA-256 in hex: a token's id in `sia tokens list`


class TokenError(ValueError):
    """The tokens file is unreadable or malformed; the message names the entry."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant and a role ("admin" sees every tenant)."""

    tenant: str
    role: str = "user"
    name: str = ""  # the token's label, or the agent certificate's CN
    # The queues this token's jobs may go to, the first when a spec names none;
    # empty: any queue that admits the tenant (docs/security.md, "Queues").
    queues: tuple[str, ...] = ()

    @property
    def admin(self) -> bool:
        return self.role == "admin"


ANONYMOUS_ADMIN = Principal(tenant="", role="admin", name="anonymous")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    """One entry of a tokens file as `sia tokens list` shows it (never the hash)."""

    id: str  # the first ID_DIGITS hex digits of the token's SHA-256
    tenant: str
    role: str
    name: str
    created: datetime.datetime | None
    queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    principal: Principal
    created: datetime.datetime | None

    def info(self) -> TokenInfo:
        p = self.principal
        return TokenInfo(self.digest.hex()[:ID_DIGITS], p.tenant, p.role, p.name, self.created,
                         p.queues)


def _parse(path: Path, text: str | None = None) -> list[_Entry]:
    """The entries of the tokens file at `path` (or of `text`, as if it were there)."""
    try:
        data = tomllib.loads(path.read_text() if text is None else text)
    except OSError as exc:
        raise TokenError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TokenError(f"{path}: {exc}") from None
    entries = data.get("token", [])
    unknown = set(data) - {"token"}
    if unknown or not isinstance(entries, list):
        raise TokenError(f"{path}: expected only [[token]] tables, found {sorted(unknown)}")
    out: list[_Entry] = []
    for i, e in enumerate(entries):
        where = f"{path}: token[{i}]"
        if not isinstance(e, dict):
            raise TokenError(f"{where}: not a table")
        extra = set(e) - {"sha256", "tenant", "role", "name", "created", "queues"}
        if extra:
            raise TokenError(f"{where}: unknown keys {sorted(extra)}")
        digest = str(e.get("sha256", "")).lower()
        if not _HEX64.match(digest):
            raise TokenError(f"{where}.sha256: expected 64 hex digits (the token's SHA-256)")
        role = e.get("role", "user")
        if role not in ROLES:
            raise TokenError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        tenant = e.get("tenant", "")
        if not isinstance(tenant, str) or not is_name(tenant, MAX_ID):
            raise TokenError(f"{where}.tenant: {tenant!r} is not a valid tenant name")
        created = e.get("created")
        if created is not None and not isinstance(created, datetime.datetime):
            raise TokenError(f"{where}.created: expected a TOML date-time such as "
                             f"2026-01-05T09:30:00Z, got {created!r}")
        queues = e.get("queues", [])
        if not isinstance(queues, list) or not all(
                isinstance(q, str) and is_name(q, MAX_ID) for q in queues):
            raise TokenError(f"{where}.queues: expected a list of queue names, got {queues!r}")
        out.append(_Entry(bytes.fromhex(digest), Principal(tenant, role, str(e.get("name", "")),
                                                           tuple(queues)), created))
    return out


class TokenStore:
    """The tokens of one file, reloaded when it changes. Thread-safe."""

    def __init__(self, path: str | Path, *, check_every: float = 1.0) -> None:
        self.path = Path(path)
        self.check_every = check_every
        self._lock = threading.Lock()
        self._entries: list[tuple[bytes, Principal]] = []
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self.reload(strict=True)

    def __len__(self) -> int:
        return len(self._entries)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, *, strict: bool = False) -> bool:
        """Read the file again; True if it loaded. With `strict`, a bad file raises
        (startup); otherwise it is logged and the previous tokens are kept."""
        stamp = self._file_stamp()
        try:
            entries = [(e.digest, e.principal) for e in _parse(self.path)]
        except TokenError as err:
            if strict:
                raise
            log.error("tokens file not reloaded; keeping the previous tokens", error=str(err))
            with self._lock:
                self._stamp = stamp  # do not retry a bad file on every call
            return False
        with self._lock:
            self._entries, self._stamp = entries, stamp
            self._checked = time.monotonic()
        log.info("tokens loaded", path=str(self.path), tokens=len(entries))
        return True

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_every:
            return
        self._checked = now
        if self._file_stamp() != self._stamp:
            self.reload()

    def lookup(self, token: str) -> Principal | None:
        """The principal of `token`, or None. Every entry is compared, in constant
        time each, so the time taken says nothing about which hash was close."""
        self._maybe_reload()
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, digest) and found is None:
                found = principal
        return found


def add_token(path: str | Path, tenant: str, *, admin: bool = False, name: str = "",
              queues: tuple[str, ...] | list[str] = (),
              now: datetime.datetime | None = None) -> str:
    """Make a token for `tenant` (bound to `queues`, if any), append its hash to `path`
    (created 0600), return it."""
    if not is_name(tenant, MAX_ID):
        raise TokenError(f"tenant: {tenant!r} is not a valid tenant name "
                         "(letters, digits, '-', '.', '_'; at most 63)")
    for q in queues:
        if not is_name(q, MAX_ID):
            raise TokenError(f"queues: {q!r} is not a valid queue name "
                             "(letters, digits, '-', '.', '_'; at most 63)")
    if name and not re.match(r"^[\w .@-]{1,64}$", name):
        raise TokenError(f"name: {name!r}: letters, digits, ' ', '.', '@', '-' only")
    p = Path(path)
    if p.exists():
        _parse(p)  # never append to a file we could not read back
    token = secrets.token_urlsafe(32)
    entry = (f'\n[[token]]\nsha256 = "{hash_token(token)}"\ntenant = "{tenant}"\n'
             f'role = "{"admin" if admin else "user"}"\n')
    if name:
        entry += f'name = "{name}"\n'
    if queues:
        entry += f"queues = {json.dumps(list(queues))}\n"  # (names: a JSON list is TOML)
    created = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
    entry += f"created = {created.replace(microsecond=0, tzinfo=None).isoformat()}Z\n"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(entry)
    return token


def list_tokens(path: str | Path) -> list[TokenInfo]:
    """The tokens of the file at `path`, in file order."""
    return [e.info() for e in _parse(Path(path))]


def revoke_token(path: str | Path, which: str) -> list[TokenInfo]:
    """Remove the token named `which` (or whose id starts with it, 6 hex digits at
    least) from the file at `path`; the entries removed. A name that several tokens
    share is refused, listing their ids. The file is replaced atomically, keeping its
    mode, owner and group (the controller must still be able to read it)."""
    p = Path(path)
    entries = _parse(p)
    text = p.read_text()
    ids = [e.digest.hex() for e in entries]
    match = [i for i, e in enumerate(entries) if e.principal.name == which]
    if not match and len(which) >= 6 and re.fullmatch(r"[0-9a-fA-F]+", which):
        match = [i for i, h in enumerate(ids) if h.startswith(which.lower())]
    if not match:
        raise TokenError(f"{p}: no token named {which!r} (nor with an id starting so); "
                         "`sia tokens list` shows them")
    if len(match) > 1:
        raise TokenError(f"{p}: {len(match)} tokens match {which!r} (ids "
                         f"{', '.join(ids[i][:ID_DIGITS] for i in match)}); revoke one by its id")
    head, blocks = _blocks(text)
    if len(blocks) != len(entries):  # e.g. a [[token]] written as an inline array
        raise TokenError(f"{p}: cannot find each [[token]] table on its own line; "
                         "delete the entry by hand")
    kept = head + "".join(b for i, b in enumerate(blocks) if i not in match)
    if _parse(p, kept) != [e for i, e in enumerate(entries) if i not in match]:
        raise TokenError(f"{p}: removing the entry would change others; delete it by hand")
    _replace(p, kept)
    return [entries[i].info() for i in match]


def _blocks(text: str) -> tuple[str, list[str]]:
    """The text before the first [[token]] line, and each [[token]] table's text
    (from its header to the next one)."""
    starts = [m.start() for m in _HEADER.finditer(text)]
    ends = [*starts[1:], len(text)]
    blocks = [text[a:b] for a, b in zip(starts, ends, strict=True)]
    return (text[:starts[0]] if starts else text), blocks


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` at once (readers see the old file or the new one), with
    the old file's mode, owner and group."""
    st = os.stat(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError:
                raise TokenError(f"{path}: cannot keep its owner and group; run this as "
                                 "its owner or as root") from None
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
