"""Finding what this host offers the agent: which cgroup version, which controllers,
and the agent's own cgroup in each hierarchy (from /proc/self/cgroup and mountinfo),
checked by creating and removing a test cgroup. cgroups.py's docstring says how the
job cgroups then use it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from sia_grpc.nodeagent.isolation.cgroupfs import (
    V2_DOMAIN,
    V2_JOBS,
    V2_LEAF,
    read_file,
    unique_dirs,
)

__all__ = ["CgroupSupport", "probe"]

_WANTED = ("memory", "pids", "cpuset", "devices", "freezer")  # describe() order


@dataclass(frozen=True)
class CgroupSupport:
    """What this host offers the agent (from probe())."""

    version: int  # 1 or 2
    controllers: frozenset[str]  # of memory, pids, cpuset, devices, freezer
    devices_enforced: bool
    # (controller, the agent's own cgroup folder) per hierarchy; v2: (("unified", dir),)
    agent_dirs: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        used = ", ".join(c for c in _WANTED if c in self.controllers)
        tail = "" if self.devices_enforced else "; devices not enforced"
        if self.version == 2 and not self.devices_enforced:
            tail += " (cgroup v2 needs BPF)"
        return f"cgroup v{self.version}: {used}{tail}"


@dataclass(frozen=True)
class _Mount:
    root: str
    point: str
    fstype: str
    super_opts: frozenset[str]
    read_only: bool


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), s)  # mountinfo's \040


def _mounts(path: str) -> list[_Mount]:
    out = []
    for line in read_file(path).splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 6 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
            out.append(_Mount(_unescape(f[3]), _unescape(f[4]), r[0],
                              frozenset(r[2].split(",")), "ro" in f[5].split(",")))
    return out


def _self_cgroups(path: str) -> dict[str, str]:
    """controller -> path; "" -> the v2 path (the "0::" line)."""
    out = {}
    for line in read_file(path).splitlines():
        _hid, ctrls, cg = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = cg
    return out


def _locate(m: _Mount, cg: str) -> str | None:
    """The folder of cgroup `cg` under mount `m` (its root may be a sub-cgroup)."""
    rel = os.path.relpath(cg, m.root)
    if rel == ".." or rel.startswith("../"):
        return None
    d = os.path.normpath(os.path.join(m.point, rel))
    return d if os.path.isdir(d) else None


def _probe_v1(cgs: dict[str, str], mounts: list[_Mount]) -> CgroupSupport | str | None:
    dirs: dict[str, str] = {}
    for c in _WANTED:
        for m in mounts:
            if c in cgs and m.fstype == "cgroup" and c in m.super_opts:
                d = _locate(m, cgs[c])
                if d is not None:
                    if m.read_only:
                        if c == "memory":
                            return f"read-only cgroupfs at {m.point}"
                        break
                    dirs[c] = d
                    break
    if "memory" not in dirs:
        return None
    return CgroupSupport(1, frozenset(dirs), "devices" in dirs, tuple(dirs.items()))


def _v2_agent_dir(d: str) -> str:
    # After create() moved the agent into <agent cg>/agent, its cgroup is still the parent.
    parent = os.path.dirname(d)
    moved = os.path.basename(d) == V2_LEAF and os.path.isdir(os.path.join(parent, V2_JOBS))
    return parent if moved else d


def _probe_v2(cgs: dict[str, str], mounts: list[_Mount]) -> CgroupSupport | str:
    if "" not in cgs:
        return "no memory controller: neither a cgroup v1 memory hierarchy nor cgroup v2"
    for m in mounts:
        d = _locate(m, cgs[""]) if m.fstype == "cgroup2" else None
        if d is not None:
            break
    else:
        return f"no memory controller: cgroup v2 {cgs['']} is not mounted here"
    if m.read_only:
        return f"read-only cgroupfs at {m.point}"
    d = _v2_agent_dir(d)
    avail = set(read_file(os.path.join(d, "cgroup.controllers")).split())
    if "memory" not in avail:
        return (f"no memory controller: cgroup v2 {d} is not delegated it "
                f"(cgroup.controllers: {' '.join(sorted(avail)) or 'none'})")
    return CgroupSupport(2, frozenset(avail & set(V2_DOMAIN)), False, (("unified", d),))


def probe(proc_self_cgroup: str = "/proc/self/cgroup",
          mounts: str = "/proc/self/mountinfo") -> CgroupSupport | str:
    """This host's cgroup support for the agent, or a plain reason why there is none.

    Creates and removes a test child cgroup in every hierarchy it would use."""
    if os.geteuid() != 0:
        return f"not root (euid {os.geteuid()}): job cgroups need root"
    try:
        cgs, mnts = _self_cgroups(proc_self_cgroup), _mounts(mounts)
        found = _probe_v1(cgs, mnts) or _probe_v2(cgs, mnts)
    except (OSError, ValueError) as e:
        return f"cannot read this process's cgroups: {e}"
    if isinstance(found, str):
        return found
    ctrls = set(found.controllers)
    for d in unique_dirs(dict(found.agent_dirs)):
        test = os.path.join(d, f"sia-probe-{os.getpid()}")
        try:
            os.makedirs(test, exist_ok=True)
            if found.version == 2 and os.path.exists(os.path.join(test, "cgroup.freeze")):
                ctrls.add("freezer")  # v2's freezer is core: cgroup.freeze in non-root cgroups
            os.rmdir(test)
        except OSError as e:
            return f"cannot create a cgroup under {d}: {e.strerror}"
    return CgroupSupport(found.version, frozenset(ctrls), found.devices_enforced,
                         found.agent_dirs)
