"""The `sandbox` level: each worker in a bubblewrap sandbox of its own.

bwrap runs as the job's user (the launcher switches users first), so it builds
the sandbox in an unprivileged user namespace and can bind only what that user
may read: it can never give the job more than the job's uid already has, only
less. The worker sees

    the system (/usr, /etc, /bin, /lib...) and the Python environment the agent
    runs workers with, read-only (`python_paths`), plus what the operator lists
    (`--sandbox-ro`: e.g. the shared folder of training code)
    its own folders read-write: its run folder (HOME, the worker socket) and
    its checkpoint folder, at the paths the environment names
    a private /tmp, and /dev/shm shared only with the job's other workers
    /dev with the basic devices and its own GPUs; /proc of its own pid namespace

and nothing of the agent: not its work directory, its keys or its processes.
The network is the host's (the ranks' rendezvous and NCCL need it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["bwrap_argv", "python_paths"]

_SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")


def python_paths() -> list[str]:
    """The folders the agent's Python needs: its prefixes and every import path
    (site-packages, an editable install's source folder). Not `sys.path[0]`, the
    folder the agent was started in under `python -m` (started from `/`, that would
    bind the whole host), and never `/` itself."""
    import sia_grpc

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(sys.executable).parent),
             str(Path(sia_grpc.__file__).resolve().parent.parent)}
    paths.update(p for p in sys.path[1:] if p and os.path.isdir(p))
    return _outermost(p for p in paths if os.path.abspath(p) != "/")


def _outermost(paths: Iterable[str]) -> list[str]:
    """`paths` without those inside another of them (a bind covers its subfolders)."""
    out: list[str] = []
    for p in sorted({os.path.abspath(p) for p in paths}):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def bwrap_argv(bwrap: str, *, rw: Sequence[str], ro: Sequence[str], devices: Sequence[str],
               shm: str, cwd: str) -> list[str]:
    """The argv prefix that runs a command in the sandbox: `rw` folders bound
    read-write, `ro` (beyond the system and Python) read-only, `devices` (device
    nodes: its GPUs) bound, `shm` as /dev/shm."""
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sia-job"]
    for path in _SYSTEM:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    # The private /tmp first: a Python or code folder under the host's /tmp, bound
    # after it, stays visible (bound before, the tmpfs would hide it).
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in _outermost([*python_paths(), *ro]):
        if not any(path == s or path.startswith(s + "/") for s in _SYSTEM):
            argv += ["--ro-bind", path, path]
    argv += ["--bind", shm, "/dev/shm"]
    for dev in devices:
        if os.path.exists(dev):
            argv += ["--dev-bind", dev, dev]
    for path in rw:
        argv += ["--bind", path, path]
    return [*argv, "--chdir", cwd, "--", sys.executable, "-I", "-S", "-c", _DEFAULT_SIGNALS]


# bwrap forwards no signal: a SIGTERM to the worker's process group would kill the
# outer bwrap, whose death SIGKILLs the sandbox before the worker could checkpoint.
# So the launcher ignores SIGTERM and SIGINT before it execs bwrap (both bwrap
# processes keep ignoring them; the group's SIGKILL and the cgroup still end them),
# and this first step inside the sandbox gives the worker their defaults back.
_DEFAULT_SIGNALS = ("import os, signal, sys\n"
                    "for s in (signal.SIGTERM, signal.SIGINT):\n"
                    "    signal.signal(s, signal.SIG_DFL)\n"
                    "os.execvp(sys.argv[1], sys.argv[1:])\n")
