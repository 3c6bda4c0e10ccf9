"""The agent's work directory: its layout, the one-agent lock, and safe names.

    agent.sock, agent.lock                  the WorkerService socket; one agent per workdir
    jobs/<job>/gen-<generation>/rank-<r>.log    each worker's stdout and stderr
    jobs/<job>/profile-gen-<g>-gpu-<i>.log      a profiling pass
    run/<tenant>/<job uid>/                 a job's HOME, TMPDIR and gate sockets
    checkpoints/<tenant>/<job uid>/         SIA_CHECKPOINT_DIR, unless the directive
                                            names one or --checkpoint-root moves it
                                            (isolation/files.py has the owners, modes)
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["WorkdirLock", "generation_log_dir", "make_checkpoint_dir", "profile_log_path",
           "safe_name", "writable_dir"]


def safe_name(job_id: str) -> str:
    """`job_id` as one path component: other characters become `_`, and a changed
    name gets a checksum so that two ids never share a directory."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)
    if name != job_id or name in ("", ".", ".."):
        name = f"{name}-{zlib.crc32(job_id.encode()):08x}"
    return name


def generation_log_dir(workdir: Path, job_id: str, generation: int) -> Path:
    return workdir / "jobs" / safe_name(job_id) / f"gen-{generation}"


def profile_log_path(workdir: Path, job_id: str, generation: int, gpu: int) -> Path:
    return workdir / "jobs" / safe_name(job_id) / f"profile-gen-{generation}-gpu-{gpu}.log"


def writable_dir(path: Path) -> str:
    """Why `path` cannot be (made) a writable directory, "" if it can."""
    p = path.absolute()
    while not p.exists():
        if p.parent == p:
            return f"{path}: no existing parent"
        p = p.parent
    if not p.is_dir():
        return f"{p} is not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable by the agent"
    return ""


def make_checkpoint_dir(path: str) -> None:
    """Create the checkpoint directory `path`; ValueError (for the ack) if it cannot be."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"checkpoint directory {path}: {exc.strerror or exc}") from None


class WorkdirLock:
    """An exclusive lock on `<workdir>/agent.lock`: one agent per work directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or RuntimeError if another agent holds it."""
        if fcntl is None:
            return
        fd = os.open(self.workdir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"workdir {self.workdir} is in use by another agent; give "
                               f"each agent its own --workdir") from None
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the lock
