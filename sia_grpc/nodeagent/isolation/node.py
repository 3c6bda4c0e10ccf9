"""The node's isolation, as the torch back-end uses it: what a job generation (or
a profiling pass) gets on the way in, and what is checked on the way out.

`enter` gives a run its *space*: the job's user (`identity`), a cgroup of its own
with its limits (`cgroups`), its folders (`files`) and, at the sandbox level, the
bubblewrap argv (`sandbox`); every worker of the run is started confined to it
(`Space.confinement`). `leave` ends every process in the cgroup, however it was
forked or re-parented, and says whether the cgroup is empty: only then are the
run's GPUs free (`TorchBackend` holds back GPUs whose processes would not die).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sia_grpc.nodeagent.isolation import cgroups as cg
from sia_grpc.nodeagent.isolation.files import JobFolders
from sia_grpc.nodeagent.isolation.identity import JobUser, UserPolicy
from sia_grpc.nodeagent.isolation.levels import Level
from sia_grpc.nodeagent.isolation.sandbox import bwrap_argv
from sia_grpc.nodeagent.workers import Confinement

__all__ = ["Limits", "NodeIsolation", "Space", "default_memory_per_gpu", "gpu_devices"]

_KILL_WAIT_S = 10.0  # leave(): how long the cgroup's processes get to go after SIGKILL


def gpu_devices(gpus: Sequence[str]) -> tuple[str, ...]:
    """The device nodes a job on NVIDIA GPUs `gpus` (device indices) may open."""
    return (*(f"/dev/nvidia{g}" for g in gpus), "/dev/nvidiactl", "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools")


def default_memory_per_gpu(num_gpus: int) -> int | None:
    """The agent's default memory limit per GPU (bytes): an equal share of 90 % of
    the host's memory; None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return None
    return int(kib * 1024 * 0.9) // max(num_gpus, 1)


@dataclass(frozen=True)
class Limits:
    """Per-job limits on this node: memory per local GPU (None: none) and pids."""

    memory_per_gpu: int | None = None
    pids_max: int | None = 4096
    sandbox_ro: tuple[str, ...] = ()  # more read-only paths in the sandbox


@dataclass
class Space:
    """What one run (a generation, or a profiling pass) of a job is confined to."""

    key: str
    level: Level
    user: JobUser | None
    run_dir: Path
    checkpoint_dir: Path
    socket: Path  # its gate to WorkerService (`workergate`)
    cgroup: Any = None  # cg.JobCgroups, when the level has cgroups
    sandbox: tuple[str, ...] = ()
    memory: Any = None  # cg.MemoryStats at leave

    def confinement(self) -> Confinement:
        u = self.user
        return Confinement(uid=None if u is None else u.uid, gid=None if u is None else u.gid,
                           cgroups=() if self.cgroup is None else tuple(self.cgroup.procs_files),
                           cwd=str(self.run_dir), sandbox=self.sandbox)

    def env(self) -> dict[str, str]:
        """HOME and TMPDIR: its own."""
        tmp = "/tmp" if self.sandbox else str(self.run_dir / "tmp")
        return {"HOME": str(self.run_dir), "TMPDIR": tmp}


@dataclass
class NodeIsolation:
    level: Level
    folders: JobFolders
    users: UserPolicy | None = None
    cgroups: Any = None  # cg.CgroupSupport
    bwrap: str = ""
    limits: Limits = field(default_factory=Limits)
    base: str = "sia-jobs"  # the job cgroups' folder under the agent's cgroup
    log: Any = None
    # How long a job's user and folders outlive its last run here: a resize or a
    # restart on this node starts the next run within it, and keeps the uid and
    # its files as they are instead of handing them back and taking them again.
    linger_s: float = 15.0
    _runs: Counter[str] = field(default_factory=Counter)  # key -> runs here now
    _lingering: dict[str, Any] = field(default_factory=dict)  # key -> its release timer

    @property
    def isolates(self) -> bool:
        return self.level is not Level.NONE

    def describe(self) -> str:
        if not self.isolates:
            return "none: jobs run as the agent's user, in its cgroup, with its files"
        parts = [f"{self.level}: a user per job"]
        if self.cgroups is not None:
            parts.append(self.cgroups.describe())
        if self.level is Level.SANDBOX:
            parts.append(f"bubblewrap {self.bwrap}")
        return "; ".join(parts)

    def sweep(self) -> list[str]:
        """At start: end what a previous agent's jobs left in their cgroups."""
        if self.cgroups is None:
            return []
        return cg.sweep_stale(self.cgroups, self.base)

    def close(self) -> None:
        """The agent stops, its runs ended: what it made for them on the host goes
        (the lingering jobs' users and folders, its job cgroups' folder, its socket
        folder)."""
        for key in list(self._lingering):
            self._release(key)
        if self.cgroups is not None and self.isolates:
            cg.remove_base(self.cgroups, self.base)
        self.folders.close()

    def enter(self, key: str, tenant: str, label: str, *, num_gpus: int,
              gpus: Sequence[str], cpus: Sequence[int] | None, checkpoint_dir: Path,
              limits: Limits | None = None) -> Space:
        """The space of a new run `label` (`g<generation>`, `p<generation>-<gpu>`:
        unique among the job's runs on this node) of job `key`, on
        `num_gpus` GPUs (devices `gpus`, none when emulated) and cores `cpus`;
        `limits`: the node's unless given."""
        lim = limits or self.limits
        if (timer := self._lingering.pop(key, None)) is not None:
            timer[0].cancel()  # back within the linger: the same user and folders
        user = None if not self.isolates or self.users is None else (
            self.users.acquire(key, tenant))
        self._runs[key] += 1
        try:
            uid = None if user is None else user.uid
            gid = None if user is None else user.gid
            run = self.folders.prepare(key, uid, gid, checkpoint_dir)
            sock_dir = self.folders.socket_dir(key)
            space = Space(key, self.level, user, run, checkpoint_dir, sock_dir / f"{label}.sock")
            run_name = f"{label}.{zlib.crc32(key.encode()):08x}"
            if self.isolates and self.cgroups is not None:
                space.cgroup = cg.JobCgroups.create(self.cgroups, self.base, run_name, cg.JobLimits(
                    memory_bytes=(None if lim.memory_per_gpu is None
                                  else lim.memory_per_gpu * max(num_gpus, 1)),
                    pids_max=lim.pids_max,
                    cpus=None if cpus is None else tuple(cpus),
                    devices=gpu_devices(gpus)))
            if self.level is Level.SANDBOX:
                space.sandbox = tuple(bwrap_argv(
                    self.bwrap, rw=list(dict.fromkeys((str(run), str(sock_dir),
                                                       str(checkpoint_dir)))),
                    ro=lim.sandbox_ro,
                    devices=gpu_devices(gpus), shm=str(run / "shm"), cwd=str(run)))
            return space
        except BaseException:
            self._done(key, checkpoint_dir, linger=False)
            raise

    async def leave(self, space: Space) -> bool:
        """End every process of the run; True once its cgroup is empty (then its
        GPUs are free). False: something would not die; the cgroup is kept."""
        empty = True
        if space.cgroup is not None:
            empty = await space.cgroup.kill_and_wait(_KILL_WAIT_S)
            space.memory = space.cgroup.memory()
            if empty:
                space.cgroup.remove()
        if empty:
            self._done(space.key, space.checkpoint_dir, linger=True)
        return empty

    def leave_now(self, space: Space) -> bool:
        """`leave` for a run whose processes have all been reaped (a trial): what
        its processes forked (bwrap's inner ones) gets up to a few seconds to go;
        False if the cgroup would not empty (then it is left for the next sweep)."""
        empty = True
        if space.cgroup is not None:
            empty = space.cgroup.kill_and_wait_sync(_KILL_WAIT_S) and space.cgroup.remove()
        self._done(space.key, space.checkpoint_dir, linger=False)
        return empty

    def _done(self, key: str, checkpoint_dir: Path, *, linger: bool) -> None:
        self._runs[key] -= 1
        if self._runs[key] > 0:
            return
        del self._runs[key]
        if linger and self.linger_s > 0:
            with contextlib.suppress(RuntimeError):  # (no event loop: at once)
                loop = asyncio.get_running_loop()
                self._lingering[key] = (
                    loop.call_later(self.linger_s, self._release, key), checkpoint_dir)
                return
        self._lingering[key] = (None, checkpoint_dir)
        self._release(key)

    def _release(self, key: str) -> None:
        """Job `key` did not come back within the linger: its run folder goes, and a
        range uid is handed back (its checkpoints to the agent, its scratch files
        removed) and freed."""
        timer, checkpoint_dir = self._lingering.pop(key)
        if timer is not None:
            timer.cancel()
        user = None if self.users is None else self.users.holder_of(key)
        self.folders.leave(key, checkpoint_dir, freed_uid=(
            user.uid if user is not None and user.dynamic else None))
        if self.users is not None:
            self.users.release(key)
