"""A cgroup per job generation: limits set before any process joins, kill-all, empty check.

The agent (root) makes ``<agent cgroup>/<base>/<name>`` BELOW its own cgroup (the path in
/proc/self/cgroup) in every hierarchy it uses, writes the limits, and only then lets
processes in: a launcher writes its own pid into each of ``JobCgroups.procs_files``, then
execs the job. The files are root's (0644): a job running as a tenant's uid cannot leave.

cgroup v1: memory, pids, cpuset, devices, freezer where mounted. Devices are an
allow-list (deny "a", then the basic char devices and the job's nodes), kernel-enforced.

cgroup v2: memory, pids, cpuset and the core cgroup.kill/cgroup.freeze. Device filtering
in v2 needs a BPF program on the cgroup: it is NOT done here (``devices_enforced`` is
False); jobs rely on their uid and the device nodes' permissions. v2's "no internal
processes" rule (admin-guide/cgroup-v2.rst) forbids enabling controllers in a non-root
cgroup that holds processes, so jobs live in ``<agent cgroup>/sia-jobs/<base>/<name>``,
and the processes of the agent's cgroup first move to the leaf ``<agent cgroup>/agent``
(a later probe() from ``.../agent`` beside ``sia-jobs`` takes the parent as the agent's
cgroup). Under systemd, give the agent's unit Delegate=yes.

"Empty" means no LIVE process in it. Zombies (exited, unreaped) do not count: they run
nothing and hold no memory or files. Kernels differ on whether cgroup.procs lists them
(v1 on old kernels does, 6.x does not); where it does, rmdir fails until they are reaped
and remove() returns False. The agent reaps its direct children (asyncio's child
watcher); a zombie child of THIS process is the caller's to reap. Grandchildren
re-parent to init or a subreaper, which reaps them.

Finding the host's support is in cgroupprobe.py (`probe`), the file access in cgroupfs.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import signal
import stat
import time
from dataclasses import dataclass

from sia_grpc.nodeagent.isolation.cgroupfs import (
    V2_DOMAIN,
    V2_JOBS,
    V2_LEAF,
    CgroupError,
    read_file,
    unique_dirs,
    write_file,
)
from sia_grpc.nodeagent.isolation.cgroupprobe import CgroupSupport, probe

__all__ = [
    "CgroupError", "CgroupSupport", "JobCgroups", "JobLimits", "MemoryStats", "probe",
    "sweep_stale",
]

_LOG = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z0-9._-]+")
# v1 reports "no limit" as PAGE_COUNTER_MAX pages (0x7ffffffffffff000 bytes on 4 KiB pages).
_V1_UNLIMITED = 1 << 62
# The char devices every process expects, by their fixed numbers from
# Documentation/admin-guide/devices.txt (null, zero, full, random, urandom, tty, ptmx,
# the Unix98 pty slaves /dev/pts/*): the set runc allows a container.
_BASIC_DEVICES = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
                  "c 5:0 rwm", "c 5:2 rwm", "c 136:* rwm")


@dataclass(frozen=True)
class JobLimits:
    memory_bytes: int | None = None  # None: no memory limit
    pids_max: int | None = None  # tasks (threads count), None: no limit
    cpus: tuple[int, ...] | None = None  # cpuset; None: the parent's
    devices: tuple[str, ...] = ()  # device nodes allowed besides the basic ones

    def __post_init__(self) -> None:
        for what, v in (("memory_bytes", self.memory_bytes), ("pids_max", self.pids_max)):
            if v is not None and v <= 0:
                raise ValueError(f"{what} must be positive, not {v}")
        if self.cpus is not None and (not self.cpus or min(self.cpus) < 0):
            raise ValueError(f"cpus must be a non-empty tuple of cpu numbers, not {self.cpus}")


@dataclass(frozen=True)
class MemoryStats:
    peak_bytes: int | None  # v1 memory.max_usage_in_bytes, v2 memory.peak (kernel >= 5.19)
    limit_bytes: int | None  # None: unlimited
    oom_kills: int | None  # v1 oom_control's oom_kill (kernel >= 4.13), v2 memory.events
    failcnt: int | None  # v1 only: times the limit was hit


def _procs(folder: str) -> set[int]:
    try:
        return {int(x) for x in read_file(os.path.join(folder, "cgroup.procs")).split()}
    except FileNotFoundError:
        return set()


def _is_zombie(pid: int) -> bool:
    try:
        stat_line = read_file(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return True  # gone already: as good as dead
    return stat_line.rpartition(")")[2].split()[0] in ("Z", "X")


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise CgroupError(f"bad cgroup name {name!r}: one path component of [A-Za-z0-9._-]")


# --- job cgroups -------------------------------------------------------------------------

def _job_parent(support: CgroupSupport, agent_dir: str, base: str) -> str:
    if support.version == 2:
        return os.path.join(agent_dir, V2_JOBS, base)
    return os.path.join(agent_dir, base)


def _v2_enabled(d: str) -> set[str]:
    f = os.path.join(d, "cgroup.subtree_control")
    return {w.lstrip("+") for w in read_file(f).split()} if os.path.exists(f) else set()


def _v2_enable(d: str, want: list[str]) -> None:
    if not set(want) <= _v2_enabled(d):
        write_file(os.path.join(d, "cgroup.subtree_control"), " ".join(f"+{c}" for c in want))


def _v2_prepare(support: CgroupSupport, agent: str, base: str) -> None:
    """Enable the controllers from the agent's cgroup down to <agent>/sia-jobs/<base>."""
    want = sorted(support.controllers & set(V2_DOMAIN))
    # Only a non-root cgroup has cgroup.type, and only it obeys "no internal processes".
    if not set(want) <= _v2_enabled(agent) and os.path.exists(os.path.join(agent, "cgroup.type")):
        leaf = os.path.join(agent, V2_LEAF)
        os.makedirs(leaf, exist_ok=True)
        for _ in range(3):  # again for any process forked meanwhile
            for pid in _procs(agent):
                try:
                    write_file(os.path.join(leaf, "cgroup.procs"), str(pid))
                except CgroupError as e:
                    if not isinstance(e.__cause__, ProcessLookupError):
                        raise
    _v2_enable(agent, want)
    for d in (os.path.join(agent, V2_JOBS), os.path.join(agent, V2_JOBS, base)):
        os.makedirs(d, exist_ok=True)
        _v2_enable(d, want)


def _v1_prepare(dirs: dict[str, str], base: str) -> None:
    for ctrl, agent in dirs.items():
        parent = os.path.join(agent, base)
        os.makedirs(parent, exist_ok=True)
        # A new v1 cpuset has empty cpus and mems, and attaching a task to it fails with
        # ENOSPC (cgroup-v1/cpusets.rst): the shared parent copies the agent's.
        if ctrl == "cpuset" and not read_file(os.path.join(parent, "cpuset.cpus")).strip():
            for f in ("cpuset.cpus", "cpuset.mems"):
                write_file(os.path.join(parent, f), read_file(os.path.join(agent, f)).strip())


def _device_rules(devices: tuple[str, ...]) -> list[str]:
    rules = list(_BASIC_DEVICES)
    for path in devices:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if path.startswith("/dev/nvidia"):
                continue  # a GPU node absent on this (CPU) host: nothing to allow
            raise CgroupError(f"device {path} does not exist") from None
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise CgroupError(f"{path} is not a device node")
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
        rules.append(f"{kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} rwm")
    return rules


class JobCgroups:
    """One job generation's cgroup in every hierarchy the agent uses."""

    def __init__(self, support: CgroupSupport, name: str, dirs: dict[str, str]) -> None:
        self.support, self.name, self._dirs = support, name, dirs
        self._folders = unique_dirs(dirs)
        self.procs_files: tuple[str, ...] = tuple(
            os.path.join(d, "cgroup.procs") for d in self._folders)

    def __repr__(self) -> str:
        return f"JobCgroups({self.name!r}, {list(self._folders)})"

    @classmethod
    def attach(cls, support: CgroupSupport, base: str, name: str) -> JobCgroups:
        """The existing (or not) job cgroup `name` under `base`; creates nothing."""
        _check_name(base)
        _check_name(name)
        return cls(support, name, {c: os.path.join(_job_parent(support, d, base), name)
                                   for c, d in support.agent_dirs})

    @classmethod
    def create(cls, support: CgroupSupport, base: str, name: str,
               limits: JobLimits) -> JobCgroups:
        """Create <agent cg>/<base>/<name> everywhere and set `limits`, before any process
        joins. A cgroup of that name left over is an error (sweep_stale() first)."""
        job = cls.attach(support, base, name)
        made: list[str] = []
        try:
            if support.version == 2:
                _v2_prepare(support, dict(support.agent_dirs)["unified"], base)
            else:
                _v1_prepare(dict(support.agent_dirs), base)
            for d in job._folders:
                os.mkdir(d)
                made.append(d)
            if support.version == 2:
                job._limit_v2(limits)
            else:
                job._limit_v1(limits)
        except BaseException as e:
            for d in reversed(made):
                try:
                    os.rmdir(d)
                except OSError:
                    _LOG.warning("cannot remove the half-made cgroup %s", d)
            if isinstance(e, OSError):
                raise CgroupError(f"cannot create job cgroup {name}: {e}") from e
            raise
        return job

    def _need(self, ctrl: str) -> str:
        if ctrl not in self.support.controllers:
            raise CgroupError(f"the job's limits need the {ctrl} controller, not available")
        return self._dirs["unified" if self.support.version == 2 else ctrl]

    def _limit_v1(self, limits: JobLimits) -> None:
        if "cpuset" in self._dirs:
            d = self._dirs["cpuset"]
            parent = os.path.dirname(d)
            cpus = (",".join(map(str, limits.cpus)) if limits.cpus is not None
                    else read_file(os.path.join(parent, "cpuset.cpus")).strip())
            write_file(os.path.join(d, "cpuset.cpus"), cpus)
            write_file(os.path.join(d, "cpuset.mems"),
                   read_file(os.path.join(parent, "cpuset.mems")).strip())
        elif limits.cpus is not None:
            self._need("cpuset")
        mem = self._dirs["memory"]
        if limits.memory_bytes is not None:
            write_file(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_bytes))
            # memory+swap to the same limit: the job cannot swap its way past it (memsw
            # must be set after, as it may not be below limit_in_bytes).
            if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):
                write_file(os.path.join(mem, "memory.memsw.limit_in_bytes"),
                       str(limits.memory_bytes))
        # oom_kill_disable=0: on OOM the kernel kills a task in the cgroup instead of
        # pausing them all until the limit is raised (cgroup-v1/memory.rst, 10. OOM Control).
        write_file(os.path.join(mem, "memory.oom_control"), "0")
        if limits.pids_max is not None:
            write_file(os.path.join(self._need("pids"), "pids.max"), str(limits.pids_max))
        if "devices" in self._dirs:
            rules = _device_rules(limits.devices)
            d = self._dirs["devices"]
            write_file(os.path.join(d, "devices.deny"), "a")  # drops the inherited "a *:* rwm"
            for rule in rules:
                write_file(os.path.join(d, "devices.allow"), rule)

    def _limit_v2(self, limits: JobLimits) -> None:
        d = self._dirs["unified"]
        if limits.cpus is not None:
            self._need("cpuset")
            # cpuset.mems left empty: v2 then uses the parent's effective mems (cgroup-v2.rst).
            write_file(os.path.join(d, "cpuset.cpus"), ",".join(map(str, limits.cpus)))
        if limits.memory_bytes is not None:
            write_file(os.path.join(self._need("memory"), "memory.max"), str(limits.memory_bytes))
            if os.path.exists(os.path.join(d, "memory.swap.max")):
                write_file(os.path.join(d, "memory.swap.max"), "0")  # no swapping past the limit
        if limits.pids_max is not None:
            write_file(os.path.join(self._need("pids"), "pids.max"), str(limits.pids_max))

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) in, in every hierarchy."""
        for f in self.procs_files:
            write_file(f, str(pid))

    def pids(self) -> set[int]:
        """Every process listed in it, in any hierarchy (zombies too where the kernel lists
        them). A job cannot make sub-cgroups: the folders are root's."""
        return set().union(*map(_procs, self._folders))

    def _alive(self) -> set[int]:
        return {p for p in self.pids() if not _is_zombie(p)}

    def empty(self) -> bool:
        """True when no live process is in it: zombies do not count (module docstring)."""
        return not self._alive()

    def _freeze(self, on: bool) -> bool:
        """Freeze (or thaw) it and wait briefly for that to take; False: no freezer."""
        if self.support.version == 2:
            d = self._dirs["unified"]
            f, value = os.path.join(d, "cgroup.freeze"), "1" if on else "0"
            state, want = os.path.join(d, "cgroup.events"), f"frozen {value}"
        elif "freezer" in self._dirs:
            f = state = os.path.join(self._dirs["freezer"], "freezer.state")
            value = want = "FROZEN" if on else "THAWED"
        else:
            return False
        try:
            write_file(f, value)
            # Freezing is asynchronous (FREEZING until every task stopped); a task stuck
            # in the kernel may never get there: wait briefly, the SIGKILLs stay pending.
            deadline = time.monotonic() + 0.1
            while want not in read_file(state).splitlines() and time.monotonic() < deadline:
                time.sleep(0.002)
        except (OSError, CgroupError):  # removed meanwhile: nothing left in it to freeze
            return False
        return True

    def kill(self) -> None:
        """SIGKILL everything in it. v2: cgroup.kill (kernel >= 5.14). Otherwise freeze
        (so nothing forks past us), SIGKILL every live pid, thaw; again until a round
        finds no pid not yet signalled. Does not wait for them to die."""
        if self.support.version == 2:
            kill_file = os.path.join(self._dirs["unified"], "cgroup.kill")
            if os.path.exists(kill_file):
                write_file(kill_file, "1")  # kills the cgroup and its descendants (cgroup-v2.rst)
                return
        signalled: set[int] = set()
        for _ in range(100):
            frozen = self._freeze(True)
            try:
                new = self._alive() - signalled
                for pid in new:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                signalled |= new
            finally:
                if frozen:
                    self._freeze(False)  # the SIGKILLs are delivered on thawing
            if not new:
                return

    async def kill_and_wait(self, timeout_s: float) -> bool:
        """kill(), then poll until empty() or `timeout_s`; True if empty. A zombie direct
        child of this process does not keep it from being empty, but the caller must
        still reap it (before remove() on kernels that list zombies)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.kill()
        step, last_kill = 0.002, loop.time()
        while not self.empty():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(step)
            step = min(step * 2, 0.05)
            if loop.time() - last_kill > 0.5:  # stragglers that forked past a freezer-less kill
                self.kill()
                last_kill = loop.time()
        return True

    def kill_and_wait_sync(self, timeout_s: float) -> bool:
        """kill_and_wait(), blocking (sweep_stale(), at start, before the loop runs)."""
        start = last_kill = time.monotonic()
        self.kill()
        while not self.empty():
            if time.monotonic() >= start + timeout_s:
                return False
            time.sleep(0.01)
            if time.monotonic() - last_kill > 0.5:
                self.kill()
                last_kill = time.monotonic()
        return True

    def memory(self) -> MemoryStats:
        """Peak, limit, OOM kills and (v1) failcnt of its memory cgroup."""
        d = self._dirs["unified" if self.support.version == 2 else "memory"]
        v: dict[str, int | None] = {}
        for f in ("memory.peak", "memory.max", "memory.events", "memory.max_usage_in_bytes",
                  "memory.limit_in_bytes", "memory.oom_control", "memory.failcnt"):
            text = read_file(os.path.join(d, f)) if os.path.exists(os.path.join(d, f)) else ""
            for line in text.splitlines():  # "N", "max", or "key N" lines
                key, _, n = line.rpartition(" ")
                v[key or f] = None if n == "max" else int(n)
        if self.support.version == 2:
            return MemoryStats(v.get("memory.peak"), v.get("memory.max"), v.get("oom_kill"), None)
        limit = v.get("memory.limit_in_bytes")
        return MemoryStats(v.get("memory.max_usage_in_bytes"),
                           None if limit is None or limit >= _V1_UNLIMITED else limit,
                           v.get("oom_kill"), v.get("memory.failcnt"))

    def remove(self) -> bool:
        """rmdir it in every hierarchy; False, leaving what is left, while a process is
        in it."""
        if not self.empty():
            return False
        for d in self._folders:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno in (errno.EBUSY, errno.ENOTEMPTY):  # populated (zombies, a race)
                    return False
                raise CgroupError(f"cannot remove {d}: {e.strerror}") from e
        return True


def sweep_stale(support: CgroupSupport, base: str) -> list[str]:
    """At agent start: kill everything in, and remove, every job cgroup a previous agent
    left under <agent cg>/<base>/; the names removed. Blocks up to 5 s per cgroup; one that
    cannot be emptied is logged and left."""
    _check_name(base)
    names: set[str] = set()
    for d in unique_dirs(dict(support.agent_dirs)):
        try:
            with os.scandir(_job_parent(support, d, base)) as it:
                names |= {e.name for e in it if e.is_dir() and _NAME.fullmatch(e.name)}
        except FileNotFoundError:
            pass
    swept = []
    for name in sorted(names):
        job = JobCgroups.attach(support, base, name)
        if job.kill_and_wait_sync(5.0) and job.remove():
            swept.append(name)
        else:
            _LOG.warning("stale job cgroup %s still holds %s: left", job, sorted(job.pids()))
    return swept


def remove_base(support: CgroupSupport, base: str) -> None:
    """At agent close: remove <agent cg>/<base>/ where no job cgroup is left in it
    (one held back stays, for the next agent's sweep)."""
    _check_name(base)
    for d in unique_dirs(dict(support.agent_dirs)):
        with contextlib.suppress(OSError):
            os.rmdir(_job_parent(support, d, base))
