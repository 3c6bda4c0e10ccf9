"""One controller per store and per address.

A second controller on the same store file would write beside the first, and one
on the same port would (with gRPC's default SO_REUSEPORT) share the port with it,
clients alternating between the two. So the controller holds an exclusive lock on
`<db>.lock` for its whole life, with who it is written inside, and binds its ports
without SO_REUSEPORT after checking that they are free. Either failure is one line
naming the path or address and, where it can be found, the other holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from sia_grpc.controller.config import ConfigError
from sia_grpc.controller.stores import StoreError
from sia_grpc.security.tls import split_host_port

__all__ = ["InUse", "StoreLock", "check_bindable", "port_holder"]


class InUse(OSError):
    """The store or the address is another process's; the message names the holder."""


class StoreLock:
    """An exclusive `flock` on `<db>.lock`, held until `release()` (or process exit:
    the kernel drops it, so a killed controller never leaves a stale lock)."""

    def __init__(self, db_path: str, holder: str) -> None:
        """Take the lock for `db_path`; `holder` (e.g. "listen 127.0.0.1:50051") is
        written into the lock file for whoever is refused next."""
        self.path = f"{db_path}.lock"
        _check_store_path(db_path)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise StoreError(f"store {db_path}: cannot create its lock file {self.path}: "
                             f"{err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _read(fd) or "holder unknown"
            os.close(fd)
            raise InUse(f"store {db_path}: in use by another sia-controller ({other}); "
                        "stop it, or give this one another --db") from None
        except OSError as err:  # e.g. a file system without locks
            os.close(fd)
            raise StoreError(f"store {db_path}: cannot lock {self.path}: {err.strerror}") from None
        self._fd: int | None = fd
        self._since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.describe(holder)

    def describe(self, holder: str) -> None:
        """Write who holds the lock (`holder`, e.g. the bound listen address) into it."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}, {holder}, "
                                f"since {self._since}\n".encode(), 0)

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race a starting controller)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock


def _read(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 512, 0).decode(errors="replace").strip()
    return ""


def _check_store_path(db_path: str) -> None:
    """ConfigError for the store paths SQLite would only call "unable to open"."""
    path = Path(db_path)
    if path.is_dir():
        raise ConfigError(f"store {db_path}: is a directory; --db takes a file, e.g. "
                          f"{path / 'sia-controller.db'}")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"store {db_path}: {parent} is not a directory")
    if not parent.is_dir():
        raise ConfigError(f"store {db_path}: directory {parent} does not exist")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ConfigError(f"store {db_path}: not readable and writable by this user")
    if not os.access(parent, os.W_OK | os.X_OK):
        # SQLite writes its -wal and -shm files next to the database.
        raise ConfigError(f"store {db_path}: directory {parent} is not writable by this user")


def check_bindable(address: str, what: str) -> None:
    """Raise InUse (or OSError) naming `address` if a listener cannot bind it now.

    Binds a throwaway socket as gRPC would without SO_REUSEPORT (SO_REUSEADDR on,
    so a port left in TIME_WAIT by a previous run is fine). gRPC's own failure
    says only "Failed to bind" and logs a core line; this says why and who.
    """
    host, port = split_host_port(address)
    if port == "0":
        return
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise OSError(f"{what} {address}: cannot resolve {host!r}: {err.strerror}") from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as gRPC binds [::]: both stacks
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                s.bind(sockaddr)
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    raise OSError(f"{what} {address}: cannot bind: {err.strerror}") from None
                other = port_holder(int(port)) or "another process"
                raise InUse(f"{what} {address}: address in use ({other}; another "
                            "sia-controller?)") from None


def port_holder(port: int) -> str | None:
    """"pid N: COMMAND" of the process listening on TCP `port` (Linux /proc; only
    processes this user may inspect), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")  # 0A: LISTEN
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and inodes & _sockets(proc):
            with contextlib.suppress(OSError):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                return f"pid {proc.name}: {cmd.decode(errors='replace').strip()[:200]}"
            return f"pid {proc.name}"
    return None


def _sockets(proc: Path) -> set[str]:
    """The "socket:[inode]" links among a process's descriptors (none if not ours)."""
    out = set()
    with contextlib.suppress(OSError):
        for fd in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):  # closed since the listing
                out.add(os.readlink(fd))
    return out
