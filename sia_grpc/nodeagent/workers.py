"""Worker processes: spawned so they never outlive the agent, waited for without
threads, signalled as process groups.

Every worker is the leader of its own session and process group
(`start_new_session`), so a Ctrl-C at the agent's terminal does not reach it and
a signal to the group also reaches whatever it forked (data-loader workers). On
Linux it also gets PR_SET_PDEATHSIG = SIGKILL (set by a small launcher that then
execs the command, see `_LAUNCHER`): when the agent dies, even by SIGKILL, the
kernel kills the worker. (The parent-death signal follows the *thread* that
spawned it; the agent spawns from its event-loop thread, which lives as long as
the agent.) Children a worker forks are not covered by it, but are
in the worker's process group, which every stop sweeps with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EXIT_CANNOT_CONFINE", "EXIT_CANNOT_EXEC", "Confinement", "WorkerProcess",
           "describe_exit", "log_tail", "spawn_worker", "wait_exit"]

_POLL_S = 0.05  # exit polling, only where pidfd is not available


@dataclass(eq=False)
class WorkerProcess:
    """One worker: a process leading its own process group."""

    popen: subprocess.Popen[bytes]
    rank: int  # global rank (0 for a profiling pass)
    local_rank: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def signal_group(self, sig: int) -> None:
        """`sig` to the worker's process group (its pgid is its pid); nothing if gone."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    async def wait(self) -> int:
        return await wait_exit(self.popen)

    def kill_and_reap(self, timeout_s: float = 5.0) -> None:
        """SIGKILL the group and reap the worker, blocking at most `timeout_s`
        (for paths that cannot await: cancellation, close)."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout_s)


# Run in the child before the worker's own program, as the agent's user: a check
# that the agent did not die before the child took hold, then what confines it
# (`Confinement`): its cgroups (joined before anything else runs, so nothing of it
# is ever outside them), the CPU affinity, the switch to the job's user (groups
# dropped, then gid, then uid, all three of each, and checked), no new privileges,
# the parent-death signal (after the switch: changing credentials clears it), a
# private umask and folder; then exec, through the sandbox's argv when there is one.
# Everything is imported before the switch: the job's user may not be able to read
# this interpreter's standard library. A separate interpreter (isolated, without
# site: ~10 ms) rather than a `preexec_fn`, because a preexec_fn makes subprocess
# fork() instead of vfork(), and fork() in a process running gRPC runs gRPC's fork
# handlers, which gRPC supports only before any gRPC work (here a server is up).
_LAUNCHER = """
import ctypes, json, os, signal, sys
cfg, argv = json.loads(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
def fail(what):
    print(f"sia launcher: {what}", file=sys.stderr, flush=True)
    os._exit(126)
if os.getppid() != cfg["parent"]:
    os._exit(1)
try:
    for procs in cfg.get("cgroups", ()):
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
except OSError as exc:
    fail(f"cannot join the job's cgroup: {exc}")
if cfg.get("cpus"):
    os.sched_setaffinity(0, cfg["cpus"])
if "uid" in cfg:
    uid, gid = cfg["uid"], cfg["gid"]
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        fail(f"cannot switch to the job's user {uid}:{gid}: {exc}")
    if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups():
        fail("the switch to the job's user did not take")
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: its /proc is its own, not root's
if cfg.get("no_new_privs") and libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    fail("cannot set no_new_privs")
if libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
    print("sia launcher: no parent-death signal", file=sys.stderr, flush=True)
if os.getppid() != cfg["parent"]:
    os._exit(1)
os.umask(cfg.get("umask", 0o022))
if cfg.get("cwd"):
    os.chdir(cfg["cwd"])
if cfg.get("sandbox"):  # the sandbox's first step restores them (isolation/sandbox.py)
    for name in ("SIGTERM", "SIGINT"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
argv = cfg.get("sandbox", []) + argv
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    print(f"sia launcher: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)
"""
_LINUX = sys.platform.startswith("linux")
EXIT_CANNOT_EXEC = 127  # the launcher could not exec the command
EXIT_CANNOT_CONFINE = 126  # the launcher could not confine the worker: it never ran


@dataclass(frozen=True)
class Confinement:
    """What confines one worker (`isolation`): its user, the cgroup.procs files it
    joins before it runs, its folder and the sandbox's argv to exec through."""

    uid: int | None = None
    gid: int | None = None
    cgroups: tuple[str, ...] = ()
    cwd: str | None = None
    sandbox: tuple[str, ...] = ()

    def launcher_config(self, parent: int, cpus: Sequence[int] | None) -> dict[str, Any]:
        cfg: dict[str, Any] = {"parent": parent, "cpus": list(cpus or ()),
                               "cgroups": list(self.cgroups), "sandbox": list(self.sandbox)}
        if self.uid is not None:
            cfg.update(uid=self.uid, gid=self.gid if self.gid is not None else self.uid,
                       no_new_privs=True, umask=0o077)
        if self.cwd:
            cfg["cwd"] = self.cwd
        return cfg


def spawn_worker(argv: Sequence[str], env: Mapping[str, str], log_path: Path, *,
                 rank: int = 0, local_rank: int = 0, cpus: Sequence[int] | None = None,
                 confine: Confinement | None = None) -> WorkerProcess:
    """Start `argv` with `env`, stdout and stderr appended to `log_path`, in its own
    session, killed with the agent, pinned to `cpus` when given and confined by
    `confine` (all Linux only). A command that cannot be executed exits with
    EXIT_CANNOT_EXEC, one that could not be confined with EXIT_CANNOT_CONFINE (its
    log says why); OSError if even the launcher cannot start."""
    if not argv:
        raise ValueError("argv: empty")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if _LINUX:
        cfg = (confine or Confinement()).launcher_config(os.getpid(), cpus)
        full = [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg), *argv]
    elif confine is not None:
        raise OSError("worker confinement needs Linux")
    else:
        full = list(argv)
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        popen = subprocess.Popen(
            full, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
    return WorkerProcess(popen, rank, local_rank, log_path)


async def wait_exit(popen: subprocess.Popen[bytes]) -> int:
    """The process's exit status, once it ends (negative: killed by that signal).

    A pidfd watched by the event loop where Linux has one (no thread, no polling
    delay), else polling. Only this reaps the process: nothing here calls
    waitpid(-1)."""
    loop = asyncio.get_running_loop()
    fd = -1
    if popen.returncode is None and hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(popen.pid)
    if fd >= 0:
        try:
            ended: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not ended.done():
                    ended.set_result(None)

            try:
                loop.add_reader(fd, readable)
            except NotImplementedError:  # a loop without add_reader
                pass
            else:
                try:
                    if popen.poll() is None:
                        await ended
                finally:
                    loop.remove_reader(fd)
        finally:
            os.close(fd)
    while (code := popen.poll()) is None:
        await asyncio.sleep(_POLL_S)
    return code


def describe_exit(code: int) -> str:
    """"exit code 3", "killed by SIGKILL"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def log_tail(path: Path, lines: int = 20, max_chars: int = 2000) -> str:
    """The last `lines` lines of a worker log (at most `max_chars`), "" if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - 4 * max_chars, 0))
            data = f.read()
    except OSError:
        return ""
    text = "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
    return text[-max_chars:]
