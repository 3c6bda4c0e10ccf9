"""Who a job's workers run as: a uid/gid that is neither the agent's nor another
tenant's job's.

Two ways, as operators know them:

* **A tenant's fixed uid/gid** (`[isolation.tenants]` in the agent's config, the
  Slurm way): every job of that tenant runs as it, on every node, so its files
  keep one owner across nodes and a shared checkpoint filesystem needs no chown.
* **A uid per job from a range** (`uid_range`, the systemd DynamicUser /
  HTCondor slot-user way): the first uid, from a place in the range the job's key
  picks (so one job's nodes mostly agree), that names no account in the password
  database, runs no process, and no agent on this machine has
  claimed (several agents share a machine, one per GPU type: a claim is an
  exclusive `flock` on `<claims>/<uid>`, which the kernel drops if the agent
  dies, and "runs no process" covers what a dead agent's job left). The job keeps it for
  every generation it runs on this node; when its last one ended and its files
  were handed back (`files.JobFolders.leave`), the uid is free for another job.

A tenant with no mapping gets a uid from the range; no range and no mapping is a
configuration error for an isolating agent. The group is the uid's own (gid = uid)
for range uids: no supplementary groups are ever kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_UID_RANGE", "JobUser", "UserPolicy", "parse_uid_range", "parse_user"]

# Above what distributions give accounts (useradd: 1000-60000; systemd's
# DynamicUser 61184-65519; container subuid ranges start at 100000 per user and
# run to 165535 for the first): a block no login or container map uses by default.
DEFAULT_UID_RANGE = (200_000, 265_535)
# Machine-wide, shared by every agent on the machine; root's alone (tmpfs: no claim
# outlives a reboot).
DEFAULT_CLAIMS = "/run/sia/uid-claims"


@dataclass(frozen=True)
class JobUser:
    uid: int
    gid: int
    dynamic: bool  # from the range: handed back when the job leaves the node

    def __str__(self) -> str:
        return f"{self.uid}:{self.gid}"


def parse_uid_range(text: str) -> tuple[int, int]:
    """"200000-265535" -> (200000, 265535); ValueError naming what is wrong."""
    lo_s, sep, hi_s = text.partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ValueError(f"uid range {text!r}: expected FIRST-LAST, e.g. 200000-265535") from None
    if not sep or lo < 1000 or hi < lo or hi >= 2**31:
        raise ValueError(f"uid range {text!r}: FIRST-LAST with 1000 <= FIRST <= LAST < 2^31")
    return lo, hi


def parse_user(text: str) -> tuple[int, int]:
    """"1500:1500" or "1500" (gid = uid) -> (uid, gid); ValueError if not."""
    uid_s, _, gid_s = text.partition(":")
    try:
        uid, gid = int(uid_s), int(gid_s or uid_s)
    except ValueError:
        raise ValueError(f"user {text!r}: expected UID[:GID] as numbers") from None
    if uid <= 0 or gid <= 0:
        raise ValueError(f"user {text!r}: uid and gid must be > 0 (never root)")
    return uid, gid


def _is_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@dataclass
class UserPolicy:
    """Hands out job users. `key`: a job's identity on this node (its tenant and
    id), the same for all its generations."""

    tenants: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    uid_range: tuple[int, int] | None = DEFAULT_UID_RANGE
    agent_uid: int = field(default_factory=os.geteuid)
    claims: str = DEFAULT_CLAIMS
    _held: dict[str, JobUser] = field(default_factory=dict)
    _claims: dict[int, int] = field(default_factory=dict)  # uid -> its locked claim's fd

    def __post_init__(self) -> None:
        seen: dict[int, str] = {}
        for tenant, (uid, gid) in self.tenants.items():
            if uid in (0, self.agent_uid) or gid == 0:
                raise ValueError(f"isolation.tenants.{tenant}: {uid}:{gid} is root or the "
                                 f"agent's own user")
            if uid in seen:
                raise ValueError(f"isolation.tenants.{tenant}: uid {uid} is also "
                                 f"{seen[uid]!r}'s: tenants never share a uid")
            if self.uid_range and self.uid_range[0] <= uid <= self.uid_range[1]:
                raise ValueError(f"isolation.tenants.{tenant}: uid {uid} is inside the "
                                 f"per-job range {self.uid_range[0]}-{self.uid_range[1]}")
            seen[uid] = tenant

    def acquire(self, key: str, tenant: str) -> JobUser:
        """The user of job `key` (the one it holds, if it holds one here)."""
        if (held := self._held.get(key)) is not None:
            return held
        if tenant in self.tenants:
            uid, gid = self.tenants[tenant]
            user = JobUser(uid, gid, dynamic=False)
        else:
            uid = self._free_uid(key)
            user = JobUser(uid, uid, dynamic=True)
        self._held[key] = user
        return user

    def release(self, key: str) -> None:
        """Job `key` has left this node: nothing of it runs and its files were
        handed back; a range uid is free again."""
        user = self._held.pop(key, None)
        if user is not None and user.dynamic and (fd := self._claims.pop(user.uid, None)):
            os.close(fd)  # drops the flock

    def holder_of(self, key: str) -> JobUser | None:
        return self._held.get(key)

    def _free_uid(self, key: str) -> int:
        """The first free uid of the range from a place the job's key picks: the
        agents of one job's nodes (same key, same range) mostly pick the same uid, so
        its ranks' files on shared storage keep one owner; it is no promise (a uid
        taken on one node moves that node's pick on), which is why shared storage
        wants a tenant's fixed uid."""
        if self.uid_range is None:
            raise ValueError("no uid for this job: its tenant has no uid in "
                             "[isolation.tenants] and no per-job uid_range is configured")
        taken = {u.uid for u in self._held.values()} | _uids_running()
        lo, hi = self.uid_range
        size = hi - lo + 1
        start = zlib.crc32(key.encode()) % size
        os.makedirs(self.claims, mode=0o700, exist_ok=True)
        for uid in (lo + (start + i) % size for i in range(size)):
            if (uid not in taken and uid != self.agent_uid and not _is_account(uid)
                    and self._claim(uid)):
                return uid
        raise ValueError(f"no free uid in the per-job range {lo}-{hi}: "
                         f"{len(taken)} jobs hold one here")

    def _claim(self, uid: int) -> bool:
        """An exclusive, machine-wide claim on `uid` (False: another agent holds it)."""
        fd = os.open(os.path.join(self.claims, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._claims[uid] = fd
        return True


def _uids_running() -> set[int]:
    """The uids of every process on the machine (a few ms for a few hundred)."""
    out = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                out.add(entry.stat().st_uid)
    return out
