"""A job's folders on the node: its own, keyed by what no later job gets.

    <run root>/<tenant>/<job uid>/          0700, the job's user: HOME and cwd
        tmp/                                TMPDIR (the sandbox mounts its own /tmp)
        shm/                                /dev/shm in the sandbox, shared by its workers
        worker.sock                         its generation's gate to WorkerService
    <checkpoint root>/<tenant>/<job uid>/   0700, the job's user: SIA_CHECKPOINT_DIR

`<run root>` and `<checkpoint root>` and each tenant's folder are the agent's,
0711: a job can reach its own folder by its path, list nothing and enter no one
else's. The key (`names.job_key`) is the tenant and the job's server-assigned uid,
so a job created later under a deleted job's id starts empty.

Hand-over: a job that moves here from another node (or runs here under a new
uid) finds its checkpoint folder chowned to its user at start. A job under a uid
from the per-job range hands its folder back to the agent when its last process
here has gone (`hand_back`), so the uid owns nothing when another job gets it;
With a tenant's fixed uid the checkpoints stay the tenant's (a shared filesystem
that squashes root needs that). Either way the run folder (HOME, tmp) goes when
the job's last process here has.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobFolders", "chown_tree", "private_dir"]


def private_dir(path: Path, uid: int | None, gid: int | None, mode: int = 0o700) -> None:
    """Make `path` (and the agent's 0711 parents up to it) a folder of `uid`'s alone.
    `uid` None: the agent's own."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    if uid is not None:
        st = path.stat()
        if (st.st_uid, st.st_gid) != (uid, gid):
            chown_tree(path, uid, gid if gid is not None else uid)
    os.chmod(path, mode)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """chown `path` and everything under it, never following a link (a job may
    leave a link to anything in its folder)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def _agent_dir(path: Path) -> None:
    """A folder of the agent's that jobs may pass through but not list: made 0711,
    or, where it exists and is the agent's, given the search bits it lacks (never
    more: an operator's folder keeps its mode otherwise)."""
    if not path.exists():
        path.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(path, 0o711)
        return
    st = path.stat()
    if st.st_uid == os.geteuid() and (st.st_mode & 0o011) != 0o011:
        os.chmod(path, (st.st_mode & 0o7777) | 0o011)


_MAX_SOCKET_PATH = 107  # bytes: sockaddr_un.sun_path is 108, with the NUL


@dataclass(frozen=True)
class JobFolders:
    run_root: Path

    def run_dir(self, key: str) -> Path:
        return self.run_root / key

    def socket_dir(self, key: str) -> Path:
        """Where the job's gate sockets live: its run folder, or, where that path is
        too long for a Unix socket, a folder of its own under /tmp (also the job's
        alone, 0700)."""
        run = self.run_dir(key)
        if len(os.fsencode(run / "p0000000000-000.sock")) <= _MAX_SOCKET_PATH:
            return run
        return Path("/tmp") / f"sia-sock-{zlib.crc32(os.fsencode(run)):08x}"

    def prepare(self, key: str, uid: int | None, gid: int | None,
                checkpoint_dir: Path) -> Path:
        """Create the job's run folder and checkpoint folder for `uid` (None: the
        agent's own user); the run folder."""
        run = self.run_dir(key)
        for parent in (self.run_root, run.parent, checkpoint_dir.parent.parent,
                       checkpoint_dir.parent):
            _agent_dir(parent)
        private_dir(run, uid, gid)
        for sub in ("tmp", "shm"):
            private_dir(run / sub, uid, gid)
        if (sock := self.socket_dir(key)) != run:
            private_dir(sock, uid, gid)
        private_dir(checkpoint_dir, uid, gid)
        return run

    def leave(self, key: str, checkpoint_dir: Path, *, hand_back: bool) -> None:
        """The job's last process here is gone: remove its run folder (HOME, tmp)
        and, with `hand_back` (its uid is to be freed), give its checkpoints to
        the agent."""
        shutil.rmtree(self.run_dir(key), ignore_errors=True)
        shutil.rmtree(self.socket_dir(key), ignore_errors=True)
        if hand_back and checkpoint_dir.exists():
            chown_tree(checkpoint_dir, os.geteuid(), os.getegid())
