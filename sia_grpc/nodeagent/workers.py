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
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EXIT_CANNOT_EXEC", "WorkerProcess", "describe_exit", "log_tail", "spawn_worker",
           "wait_exit"]

_POLL_S = 0.05  # exit polling, only where pidfd is not available


@dataclass(eq=False)
class WorkerProcess:
    """One worker: a process leading its own process group."""

    popen: subprocess.Popen[bytes]
    rank: int  # global rank (0 for a profiling pass)
    local_rank: int
    log_path: Path
    exited_at: float | None = field(default=None)  # loop time of its exit

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


# Run in the child before the worker's own program: the parent-death signal, a
# check that the agent did not die before it took hold, the CPU affinity, then
# exec. A separate interpreter (isolated, without site: ~10 ms) rather than a
# `preexec_fn`, because a preexec_fn makes subprocess fork() instead of vfork(),
# and fork() in a process running gRPC runs gRPC's fork handlers, which gRPC
# supports only before any gRPC work (here a server is up).
_LAUNCHER = """
import ctypes, os, sys
parent, cpus, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception as exc:
    print(f"sia launcher: no parent-death signal: {exc}", file=sys.stderr, flush=True)
if os.getppid() != parent:
    os._exit(1)
if cpus:
    os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    print(f"sia launcher: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)
"""
_LINUX = sys.platform.startswith("linux")
EXIT_CANNOT_EXEC = 127  # the launcher could not exec the command


def spawn_worker(argv: Sequence[str], env: Mapping[str, str], log_path: Path, *,
                 rank: int = 0, local_rank: int = 0,
                 cpus: Sequence[int] | None = None) -> WorkerProcess:
    """Start `argv` with `env`, stdout and stderr appended to `log_path`, in its own
    session, killed with the agent and pinned to `cpus` when given (both Linux
    only). A command that cannot be executed exits with EXIT_CANNOT_EXEC (its
    log says why); OSError if even the launcher cannot start."""
    if not argv:
        raise ValueError("argv: empty")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if _LINUX:
        full = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()),
                ",".join(str(c) for c in cpus or ()), *argv]
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
            ended = loop.create_future()
            try:
                loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
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
