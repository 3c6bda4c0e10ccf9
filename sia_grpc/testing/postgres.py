"""A throwaway PostgreSQL server for tests and benchmarks, from the machine's own
binaries (Debian's `postgresql` package, which `make venv` installs where missing).

`PostgresServer()` runs initdb in a fresh temporary directory and starts the server
on a free loopback port; `database()` gives the DSN of a new, empty database;
`stop()` kills the server and removes everything. PostgreSQL refuses to run as
root, so as root the server runs as the `postgres` user the package creates.
Password authentication is on for TCP (scram-sha-256), as on a real server; the
DSNs carry the password.

    python -m sia_grpc.testing.postgres      # one for a benchmark: prints a DSN, then
                                              # runs until Ctrl-C (fsync on: durable)
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from sia_grpc.testing.ports import free_port

__all__ = ["PostgresServer", "stalled_mid_pipeline", "unavailable"]

USER = "sia"
_RUN_AS = "postgres"  # as root: Debian's package makes this user


def _bindir() -> str | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's newest /usr/lib/postgresql/N."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return str(Path(found).resolve().parent)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return str(Path(versions[-1]).parent) if versions else None


def unavailable() -> str | None:
    """Why no server can be started here, or None when one can."""
    if _bindir() is None:
        return ("no PostgreSQL server binaries (initdb, pg_ctl): `make venv` installs "
                "Debian's postgresql package as root; elsewhere, install PostgreSQL")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(_RUN_AS)
        except KeyError:
            return f"running as root and there is no {_RUN_AS!r} user to run PostgreSQL as"
    return None


class PostgresServer:
    def __init__(self, *, durable: bool = False) -> None:
        """Start a server; `durable=False` (tests) turns fsync off: faster, and a
        crash of this machine loses it anyway."""
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        bindir = _bindir()
        assert bindir is not None  # (unavailable() said so)
        self._bin = bindir
        self.root = Path(tempfile.mkdtemp(prefix="sia-pg-"))
        self.password = secrets.token_urlsafe(16)
        self.port = 0
        self._names = itertools.count(1)
        self._as_root = os.geteuid() == 0
        try:
            self._start(durable)
        except BaseException:
            self.stop()
            raise

    def _run(self, *argv: str, **kw) -> subprocess.CompletedProcess:
        cmd = [os.path.join(self._bin, argv[0]), *argv[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", _RUN_AS, "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120,
                              **kw)

    def _start(self, durable: bool) -> None:
        if self._as_root:
            os.chown(self.root, pwd.getpwnam(_RUN_AS).pw_uid, -1)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_root:
            os.chown(pwfile, pwd.getpwnam(_RUN_AS).pw_uid, -1)
        self._run("initdb", "-D", str(self.root / "data"), "-U", USER, "-E", "UTF8",
                  "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
                  "--no-instructions", "--no-sync")
        pwfile.unlink()
        self.port = free_port()
        options = [f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                   f"-c unix_socket_directories={self.root}", "-c max_connections=200"]
        if not durable:
            options += ["-c fsync=off", "-c full_page_writes=off"]
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "log"),
                      "-o", " ".join(options), "-w", "-t", "60", "start")
        except subprocess.CalledProcessError as err:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {err.stdout}{err.stderr}{log}") from err

    def dsn(self, database: str = "postgres", *, password: bool = True) -> str:
        secret = f":{self.password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database; its DSN."""
        import psycopg

        name = f"t{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def restart(self) -> None:
        """Stop the server (fast: sessions are cut) and start it again, on the same port."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "log"),
                  "-m", "fast", "-w", "-t", "60", "restart")

    def stop(self) -> None:
        """Kill the server (nothing in it is kept) and remove its directory."""
        if (self.root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w",
                          "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leaves the `with`: stopped
    with PostgresServer(durable=True) as server, contextlib.suppress(KeyboardInterrupt):
        print(server.database(), flush=True)
        signal.pause()


def stalled_mid_pipeline(dsn: str, application: str):
    """A connection named `application` (say, a controller's store's) that locked the
    store's revision row and was cut off inside a pipeline: its update sent, its Sync
    never. The server waits for the rest and is not "idle in transaction", so
    idle_in_transaction_session_timeout (200 ms here) never ends it. Close it when done."""
    import psycopg  # (the [postgres] extra)
    conn = psycopg.connect(dsn, autocommit=True, application_name=application)
    conn.execute("SET idle_in_transaction_session_timeout = 200")
    pg = conn.pgconn
    for sql in (b"BEGIN", b"SELECT value FROM meta WHERE key = 'revision' FOR UPDATE"):
        pg.send_query(sql)
        while pg.get_result() is not None:
            pass
    pg.enter_pipeline_mode()
    pg.send_query_params(b"UPDATE meta SET value = value WHERE key = 'revision'", None)
    pg.flush()
    return conn


if __name__ == "__main__":
    main()

