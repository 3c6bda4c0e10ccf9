"""Bearer tokens mapped to tenants, stored only as SHA-256 hashes.

The tokens file (TOML):

    [[token]]
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    tenant = "team-a"
    role = "user"          # or "admin": sees and manages every tenant's jobs
    name = "ci"            # optional, for humans and logs

A client sends `authorization: Bearer <token>`; the controller hashes it and looks
the hash up. The file never holds a token, so reading it (a backup, a leaked
ConfigMap) gives nobody access. `add_token` (`sia tokens add`) makes a token with
`secrets.token_urlsafe(32)` (256 bits), appends its hash and returns it once.

`TokenStore` reloads the file when its mtime, size or inode changes (checked at
most once a second, on use) and on `reload()` (the controller calls it on SIGHUP),
so tokens are added and revoked without a restart. A file that fails to parse is
logged and the previous tokens stay in force: a typo must not lock everyone out,
nor let everyone in.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import structlog

__all__ = ["ROLES", "Principal", "TokenError", "TokenStore", "add_token", "hash_token"]

log = structlog.get_logger("sia.security")

ROLES = ("user", "admin")
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # as spec.tenant (validation.py)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class TokenError(ValueError):
    """The tokens file is unreadable or malformed; the message names the entry."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant and a role ("admin" sees every tenant)."""

    tenant: str
    role: str = "user"
    name: str = ""  # the token's label, or the agent certificate's CN

    @property
    def admin(self) -> bool:
        return self.role == "admin"


ANONYMOUS_ADMIN = Principal(tenant="", role="admin", name="anonymous")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _parse(path: Path) -> list[tuple[bytes, Principal]]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise TokenError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TokenError(f"{path}: {exc}") from None
    entries = data.get("token", [])
    unknown = set(data) - {"token"}
    if unknown or not isinstance(entries, list):
        raise TokenError(f"{path}: expected only [[token]] tables, found {sorted(unknown)}")
    out: list[tuple[bytes, Principal]] = []
    for i, e in enumerate(entries):
        where = f"{path}: token[{i}]"
        if not isinstance(e, dict):
            raise TokenError(f"{where}: not a table")
        extra = set(e) - {"sha256", "tenant", "role", "name"}
        if extra:
            raise TokenError(f"{where}: unknown keys {sorted(extra)}")
        digest = str(e.get("sha256", "")).lower()
        if not _HEX64.match(digest):
            raise TokenError(f"{where}.sha256: expected 64 hex digits (the token's SHA-256)")
        role = e.get("role", "user")
        if role not in ROLES:
            raise TokenError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        tenant = e.get("tenant", "")
        if not isinstance(tenant, str) or not _TENANT.match(tenant):
            raise TokenError(f"{where}.tenant: {tenant!r} is not a valid tenant name")
        out.append((bytes.fromhex(digest), Principal(tenant, role, str(e.get("name", "")))))
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
            entries = _parse(self.path)
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


def add_token(path: str | Path, tenant: str, *, admin: bool = False, name: str = "") -> str:
    """Make a token for `tenant`, append its hash to `path` (created 0600), return it."""
    if not _TENANT.match(tenant):
        raise TokenError(f"tenant: {tenant!r} is not a valid tenant name "
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
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(entry)
    return token
