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

__all__ = ["Limits", "NodeIsolation", "Space", "gpu_devices"]

_KILL_WAIT_S = 10.0  # leave(): how long the cgroup's processes get to go after SIGKILL


def gpu_devices(gpus: Sequence[str]) -> tuple[str, ...]:
    """The device nodes a job on NVIDIA GPUs `gpus` (device indices) may open."""
    return (*(f"/dev/nvidia{g}" for g in gpus), "/dev/nvidiactl", "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools")


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
    _runs: Counter[str] = field(default_factory=Counter)  # key -> runs here now

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
        (its job cgroups' folder, its socket folder)."""
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
            self._done(key, checkpoint_dir)
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
            self._done(space.key, space.checkpoint_dir)
        return empty

    def leave_now(self, space: Space) -> None:
        """`leave` for a run whose processes have all been reaped (a trial)."""
        if space.cgroup is not None:
            space.cgroup.kill()
            space.cgroup.remove()
        self._done(space.key, space.checkpoint_dir)

    def _done(self, key: str, checkpoint_dir: Path) -> None:
        self._runs[key] -= 1
        if self._runs[key] > 0:
            return
        del self._runs[key]
        user = None if self.users is None else self.users.holder_of(key)
        self.folders.leave(key, checkpoint_dir, freed_uid=(
            user.uid if user is not None and user.dynamic else None))
        if self.users is not None:
            self.users.release(key)
