"""Isolation levels: what separates a job from the agent and from other jobs, and
which one this host can give.

    sandbox   user, plus a bubblewrap sandbox per worker: its own pid, IPC and
              mount namespaces, the system and the Python environment read-only,
              its own folders, a private /tmp, and nothing of the agent's files
    user      each job under its own uid (no new privileges, no groups), in its
              own cgroup (memory, pids, cpuset, devices), its own 0700 folders,
              an allow-listed environment, an authenticated worker channel
    none      workers run as the agent's user, as before: for a single-tenant
              machine or a laptop; logged loudly and shown in `sia cluster`

What the operator asks (`--isolation`):

    strict    (the default) the strongest level the host allows, and at least
              `user`: an agent that cannot isolate refuses to start (fail closed)
    auto      the strongest level the host allows, `none` included (`make demo`,
              local clusters: works for a user without root, says which level)
    sandbox, user, none   exactly that level, or refuse to start
"""

from __future__ import annotations

import enum
import os
import shutil
from dataclasses import dataclass

__all__ = ["REQUESTS", "HostSupport", "IsolationUnavailable", "Level", "choose"]

REQUESTS = ("strict", "auto", "sandbox", "user", "none")


class Level(enum.StrEnum):
    SANDBOX = "sandbox"
    USER = "user"
    NONE = "none"


class IsolationUnavailable(RuntimeError):
    """The level asked for cannot be had on this host; the message says why."""


@dataclass(frozen=True)
class HostSupport:
    """What this host lets the agent do; each `*_missing` is "" when it can, else why not."""

    users_missing: str       # switching to other uids (root, or CAP_SETUID + CAP_SETGID)
    cgroups_missing: str     # a cgroup of our own per job
    sandbox_missing: str     # bubblewrap, working for an unprivileged user
    bwrap: str = ""          # its path

    @property
    def user_missing(self) -> str:
        return "; ".join(w for w in (self.users_missing, self.cgroups_missing) if w)

    @property
    def strongest(self) -> Level:
        if self.user_missing:
            return Level.NONE
        return Level.USER if self.sandbox_missing else Level.SANDBOX


def can_switch_users() -> str:
    """"" if this process may switch to any uid and gid, else why not."""
    if os.geteuid() == 0:
        return ""
    try:
        with open("/proc/self/status") as f:
            eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        eff = 0
    setgid, setuid = 1 << 6, 1 << 7  # CAP_SETGID, CAP_SETUID
    if eff & setgid and eff & setuid:
        return ""
    return (f"the agent runs as uid {os.geteuid()} without CAP_SETUID and CAP_SETGID, so it "
            f"cannot run jobs under their own users (run it as root, or give it those "
            f"capabilities: deploy/systemd/sia-nodeagent.service)")


def find_bwrap() -> tuple[str, str]:
    """(path, "") of bubblewrap, or ("", why not)."""
    path = shutil.which("bwrap") or ""
    if not path:
        return "", "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    return path, ""


def choose(request: str, host: HostSupport) -> Level:
    """The level for `request` (one of REQUESTS) on `host`; IsolationUnavailable
    saying what is missing when it cannot be had."""
    if request not in REQUESTS:
        raise ValueError(f"isolation: expected one of {', '.join(REQUESTS)}, got {request!r}")
    if request == "none":
        return Level.NONE
    if request == "auto":
        return host.strongest
    if request == "sandbox" and (why := host.user_missing or host.sandbox_missing):
        raise IsolationUnavailable(f"isolation sandbox is not possible here: {why}")
    if request in ("user", "strict") and (why := host.user_missing):
        raise IsolationUnavailable(
            f"isolation {request}: this agent cannot separate jobs: {why}. Refusing to run "
            f"other people's code without it; to run anyway on a machine only you use, "
            f"start the agent with --isolation none")
    return Level(request) if request != "strict" else host.strongest
