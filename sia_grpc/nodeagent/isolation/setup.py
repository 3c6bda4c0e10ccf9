"""Finding out, at the agent's start, which isolation this host gives, and proving it.

A level is taken only after a trial run under it: a throwaway uid from the range
runs the agent's own Python (`import sia_grpc.train`) through the same launcher,
cgroup and sandbox the jobs will get. A host where that fails (the classic: a
Python under /root, which is 0700, so no other user can even start it) is refused
at start with the reason, not job by job later.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sia_grpc.nodeagent.isolation import cgroups as cg
from sia_grpc.nodeagent.isolation.files import JobFolders
from sia_grpc.nodeagent.isolation.identity import DEFAULT_UID_RANGE, UserPolicy
from sia_grpc.nodeagent.isolation.levels import (
    HostSupport,
    IsolationUnavailable,
    Level,
    can_switch_users,
    choose,
    find_bwrap,
)
from sia_grpc.nodeagent.isolation.node import Limits, NodeIsolation
from sia_grpc.nodeagent.workers import spawn_worker

__all__ = ["build_isolation", "probe_host"]

_TRIAL_TIMEOUT_S = 60.0
_TRIAL = "import sia_grpc.train, sys; sys.exit(0)"


def probe_host() -> tuple[HostSupport, Any]:
    """What this host offers, and its cgroup support (None where there is none)."""
    users = can_switch_users()
    support = cg.probe() if not users else "needs the rights to switch users first"
    cgroups = support if not isinstance(support, str) else None
    bwrap, no_bwrap = find_bwrap()
    return HostSupport(users_missing=users,
                       cgroups_missing="" if cgroups is not None else f"cgroups: {support}",
                       sandbox_missing=no_bwrap, bwrap=bwrap), cgroups


def build_isolation(request: str, *, run_root: Path, node_id: str,
                    tenants: Mapping[str, tuple[int, int]] | None = None,
                    uid_range: tuple[int, int] | None = DEFAULT_UID_RANGE,
                    limits: Limits | None = None, log: Any = None) -> NodeIsolation:
    """The node's isolation for `request` (`levels.REQUESTS`), tried before it is
    taken; IsolationUnavailable saying why when the request cannot be met. A
    sandbox that fails its trial falls back to `user` where the request allows."""
    host, cgroups = probe_host()
    level = choose(request, host)
    # The job cgroups' folder: the node id and the run root (one agent per work
    # directory, by its lock), so a restarted agent sweeps what its predecessor left,
    # and never what another agent on this machine runs, whatever its node id.
    base = (f"sia-{''.join(c if c.isalnum() or c in '._-' else '_' for c in node_id)[:40]}"
            f"-{zlib.crc32(str(run_root.absolute()).encode()):08x}")
    iso = NodeIsolation(level, JobFolders(run_root), limits=limits or Limits(), base=base,
                        log=log)
    if level is Level.NONE:
        return iso
    iso.users = UserPolicy(tenants=dict(tenants or {}), uid_range=uid_range)
    iso.cgroups, iso.bwrap = cgroups, host.bwrap
    if why := _trial(iso):
        iso.close()  # (what the trial made on the host; a later trial makes it again)
        if level is Level.SANDBOX and request in ("strict", "auto"):
            iso.level = Level.USER
            if not (why_user := _trial(iso)):
                if log is not None:
                    log.warning(f"isolation: the sandbox failed its trial, using user: {why}")
                return iso
            why = why_user
        if request == "auto":
            if log is not None:
                log.warning(f"isolation: no level but none works here: {why}")
            return NodeIsolation(Level.NONE, JobFolders(run_root), log=log)
        raise IsolationUnavailable(f"isolation {iso.level}: a trial job failed: {why}")
    return iso


def _trial(iso: NodeIsolation) -> str:
    """Run the agent's Python as a job would; "" if it worked, else why not."""
    key = f"_trial/{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="sia-trial-") as tmp:
        os.chmod(tmp, 0o711)
        try:
            space = iso.enter(key, "", f"t{os.getpid()}", num_gpus=1, gpus=(), cpus=None,
                              checkpoint_dir=Path(tmp) / "ckpt" / "_trial" / "x")
        except (cg.CgroupError, OSError) as err:
            # (the classic: cgroup v1's devices.allow without CAP_SYS_ADMIN)
            return f"a job's space could not be made: {err}"
        log = Path(tmp) / "trial.log"
        try:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **space.env()}
            proc = spawn_worker([sys.executable, "-c", _TRIAL], env, log,
                                confine=space.confinement())
            try:
                code = proc.popen.wait(_TRIAL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill_and_reap()
                code = -9
        finally:
            iso.leave_now(space)
        if code == 0:
            return ""
        text = log.read_text(errors="replace").strip().splitlines()[-3:]
        return (f"uid {space.user} could not run {sys.executable} (exit {code}: "
                f"{' / '.join(text) or 'no output'}); every folder on the way to the "
                f"Python environment must be searchable by other users (a venv made from "
                f"a Python under /root is not: build it from /usr/bin/python3)")
