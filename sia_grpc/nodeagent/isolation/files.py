"""A job's folders on the node: its own, keyed by what no later job gets.

    <run root>/<tenant>/<job uid>/          0700, the job's user: HOME and cwd
        tmp/                                TMPDIR (the sandbox mounts its own /tmp)
        shm/                                /dev/shm in the sandbox, shared by its workers
        <run>.sock                          a run's gate to WorkerService (where the
                                            path is too long for a socket: under a
                                            random 0711 folder of the agent's in /tmp)
    <checkpoint root>/<tenant>/<job uid>/   0700, the job's user: SIA_CHECKPOINT_DIR

`<run root>` and `<checkpoint root>` and each tenant's folder are the agent's,
0711: a job can reach its own folder by its path, list nothing and enter no one
else's. The key (`names.job_key`) is the tenant and the job's server-assigned uid,
so a job created later under a deleted job's id starts empty.

Hand-over: a job that moves here from another node (or runs here under a new
uid) finds its checkpoint folder chowned to its user at start. A job under a uid
from the per-job range hands back to the agent what that uid owns in its folder
when its last process here has gone and its linger is over (`leave`,
`NodeIsolation.linger_s`), so the uid owns nothing when another job gets it. With
a tenant's fixed uid the checkpoints stay the tenant's (a shared filesystem that
squashes root needs that). Either way the run folder (HOME, tmp) goes then too.

A job owns its folders, so anything in them may be a link the job put there to
make the agent (root) chown, chmod or write something else: every step here opens
what it changes with O_NOFOLLOW and walks by file descriptor (`os.fwalk`), and a
link or file where a folder of the job's belongs is removed, not followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["JobFolders", "chown_tree", "private_dir", "remove_owned"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # where any user may leave files
_MADE_TRIES = 5  # a job racing the agent to put a link back gets this many rounds


def private_dir(path: Path, uid: int | None, gid: int | None, mode: int = 0o700) -> None:
    """Make `path` a folder of `uid`'s alone (None: the agent's own), never following
    a link: a link or a file in its place (the job's, in its own folder) is removed
    and the folder made anew. Its parent must exist and be the agent's or the job's."""
    fd = _open_made_dir(path, mode)
    try:
        if uid is not None:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != (uid, gid):
                _chown_tree_fd(fd, uid, gid if gid is not None else uid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def chown_tree(path: Path, uid: int, gid: int, *, owned_by: int | None = None) -> None:
    """chown `path` and everything under it (with `owned_by`: what that uid owns),
    never following a link (a job may leave a link to anything in its folder). A
    link at `path` itself: nothing."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return
        raise
    try:
        _chown_tree_fd(fd, uid, gid, owned_by)
    finally:
        os.close(fd)


def _open_made_dir(path: Path, mode: int) -> int:
    """An O_NOFOLLOW descriptor of the real folder at `path`, made if missing."""
    for _ in range(_MADE_TRIES):
        try:
            return os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, mode)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a link or a file: not followed, gone
    raise OSError(errno.ELOOP, f"{path}: something keeps replacing this folder")


def _chown_tree_fd(fd: int, uid: int, gid: int, owned_by: int | None = None) -> None:
    if owned_by is None or os.fstat(fd).st_uid == owned_by:
        os.fchown(fd, uid, gid)
    # fwalk opens each folder relative to its parent's descriptor and skips links:
    # a folder swapped for a link mid-walk is not entered.
    for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                if (owned_by is None or os.stat(name, dir_fd=dir_fd,
                                                follow_symlinks=False).st_uid == owned_by):
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)


def remove_owned(uid: int, roots: tuple[str, ...] = SCRATCH) -> int:
    """Remove what `uid` owns in the node's shared scratch folders (as systemd's
    RemoveIPC does for a dynamic user): at `user` a job's code can write to the
    host's /tmp, /var/tmp and /dev/shm, and what it leaves there must not pass to
    the next job that gets the uid. Each folder's entries owned by `uid`, with all
    under them; never follows a link. (What it left inside another user's
    world-writable folder is not looked for: that would be a walk of the whole
    tree, seconds on a busy node.) The count of entries removed at the top."""
    removed = 0
    for root in roots:
        try:
            top = os.open(root, _DIR_FLAGS)
        except OSError:
            continue
        try:
            for entry in os.scandir(top):
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if st.st_uid != uid:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(entry.name, dir_fd=top)  # (fd-based: no links followed)
                    else:
                        os.unlink(entry.name, dir_fd=top)
                    removed += 1
        finally:
            os.close(top)
    return removed


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


@dataclass
class JobFolders:
    run_root: Path
    _socket_root: Path | None = field(default=None, repr=False)

    def run_dir(self, key: str) -> Path:
        return self.run_root / key

    def socket_dir(self, key: str) -> Path:
        """Where the job's gate sockets live: its run folder, or, where that path is
        too long for a Unix socket, a folder of its own (also the job's alone)
        under a folder the agent made in /tmp with a name no one could guess
        beforehand (a predictable name there could be taken first, by a link)."""
        run = self.run_dir(key)
        if len(os.fsencode(run / "p0000000000-000.sock")) <= _MAX_SOCKET_PATH:
            return run
        if self._socket_root is None:
            self._socket_root = Path(tempfile.mkdtemp(prefix="sia-sock-"))
            os.chmod(self._socket_root, 0o711)
        return self._socket_root / f"{zlib.crc32(os.fsencode(run)):08x}"

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

    def leave(self, key: str, checkpoint_dir: Path, *, freed_uid: int | None) -> None:
        """The job's last process here is gone: remove its run folder (HOME, tmp)
        and, where its uid is to be freed (`freed_uid`), give its checkpoints to
        the agent and remove what the uid left in the shared scratch folders."""
        shutil.rmtree(self.run_dir(key), ignore_errors=True)  # (fd-based: no links followed)
        if (sock := self.socket_dir(key)) != self.run_dir(key):
            shutil.rmtree(sock, ignore_errors=True)
        if freed_uid is not None:
            # Only what the uid owns: the job may run under another uid by now (moved
            # to another agent on this machine, or on shared storage).
            chown_tree(checkpoint_dir, os.geteuid(), os.getegid(), owned_by=freed_uid)
            remove_owned(freed_uid)

    def close(self) -> None:
        """The agent stops: its socket folder in /tmp goes (the jobs' are gone)."""
        if self._socket_root is not None:
            shutil.rmtree(self._socket_root, ignore_errors=True)
            self._socket_root = None
