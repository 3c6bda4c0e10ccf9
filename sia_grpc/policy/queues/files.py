"""The simulator's queues file (`sia simulate --queues`), and the rule that puts a
trace's jobs into queues when the trace names none.

The file is the policy's queues TOML (`QueueSet.from_mapping`: `[[queue]]`,
`[[priority_class]]`, `unit_weights`, `min_runtime_s`, `max_restarts_per_round`,
`default_priority`) plus one table of the simulator's own:

    [assignment]
    by = "hash"                                  # the only rule
    shares = {research = 5, product = 3, batch = 2}

A job whose trace row names no queue goes to the queue of its **hash bucket**: u =
the first 8 bytes of SHA-256 of the job's name, as a big-endian integer / 2^64 (in
[0, 1)); the queues of `shares`, in the file's order, take consecutive slices of
[0, 1) in proportion to their shares, and the job goes to the slice holding u. The
rule depends on the name alone, never on the trace (its arrival times, sizes or
models), so it cannot be tuned to one; with many jobs each queue receives close to
its share. Without an `[assignment]` table such a job is in the `default` queue.
A job's priority class is its row's `priority`, else the file's default.

`assign` and `burst` take any dataclass with a trace job's `name`, `time` and
`queue` (`Submitted`: the simulator's `workload.TraceJob`), so the policy imports
nothing of the simulator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.queues.model import DEFAULT_QUEUE, QueueSet

__all__ = ["Assignment", "QueueFile", "QueuesError", "Submitted", "assign", "bucket",
           "burst", "parse_queues", "read_queues"]

ASSIGNMENT_RULES = ("hash",)


class QueuesError(ValueError):
    """A malformed queues file; the message names the file and the key."""


@dataclass(frozen=True)
class Assignment:
    """Where jobs that name no queue go: `shares` (queue, weight) in the file's order."""

    shares: tuple[tuple[str, float], ...]
    by: str = "hash"

    def queue_of(self, job_name: str) -> str:
        u = bucket(job_name)
        total = sum(w for _, w in self.shares)
        edge = 0.0
        for queue, weight in self.shares:
            edge += weight / total
            if u < edge:
                return queue
        return self.shares[-1][0]  # (u just below 1 against float rounding of the edges)


@dataclass(frozen=True)
class QueueFile:
    """A queues file as the simulator reads it."""

    queues: QueueSet
    assignment: Assignment | None = None


def bucket(name: str) -> float:
    """The job's place in [0, 1): the first 8 bytes of SHA-256 of its name / 2^64."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def read_queues(path: str | Path) -> QueueFile:
    """The queues file at `path`; QueuesError naming the file and the key."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QueuesError(f"{path}: {exc}") from None
    return parse_queues(data, str(path))


def parse_queues(data: Mapping[str, Any], src: str = "queues") -> QueueFile:
    """A queues file's parsed TOML (`read_queues`)."""
    policy_part = {k: v for k, v in data.items() if k != "assignment"}
    try:
        queues = QueueSet.from_mapping(policy_part)
    except FieldError as err:
        raise QueuesError(f"{src}: {err.field}: {err.problem}") from None
    if "assignment" not in data:
        return QueueFile(queues)
    try:
        return QueueFile(queues, _assignment(data["assignment"], queues))
    except FieldError as err:
        raise QueuesError(f"{src}: {err.field}: {err.problem}") from None


def _assignment(table: Any, queues: QueueSet) -> Assignment:
    if not isinstance(table, Mapping):
        raise FieldError("assignment", "expected a table ([assignment])")
    for key in table:
        if key not in ("by", "shares"):
            raise FieldError(f"assignment.{key}", "unknown key; known: by, shares")
    by = table.get("by", "hash")
    if by not in ASSIGNMENT_RULES:
        raise FieldError("assignment.by", f"unknown rule {by!r}; the rules: "
                                          f"{', '.join(ASSIGNMENT_RULES)}")
    shares = table.get("shares")
    if not isinstance(shares, Mapping) or not shares:
        raise FieldError("assignment.shares", "expected a table of queue = share, e.g. "
                                              "{research = 5, batch = 2}")
    out = []
    for name, weight in shares.items():
        where = f"assignment.shares.{name}"
        if name not in {q.name for q in queues.queues}:
            raise FieldError(where, f"no such queue; the queues are "
                                    f"{', '.join(q.name for q in queues.queues)}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) \
                or not (math.isfinite(weight) and weight > 0):
            raise FieldError(where, f"must be a positive number, got {weight!r}")
        out.append((str(name), float(weight)))
    return Assignment(shares=tuple(out), by=by)


class Submitted(Protocol):
    """A trace's job as `assign` and `burst` read it (`sim.workload.TraceJob`): a
    dataclass, which they give back changed with `dataclasses.replace`."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def name(self) -> str: ...
    @property
    def time(self) -> float: ...  # submission, s from the start of the trace
    @property
    def queue(self) -> str: ...  # "": none named


Job = TypeVar("Job", bound=Submitted)


def assign(jobs: Sequence[Job], file: QueueFile) -> tuple[Job, ...]:
    """Each job with its queue: its own, else its bucket's, else `default`."""
    rule = file.assignment

    def queue_of(job: Job) -> str:
        if job.queue:
            return job.queue
        return rule.queue_of(job.name) if rule is not None else DEFAULT_QUEUE

    return tuple(dataclasses.replace(j, queue=queue_of(j)) for j in jobs)


def burst(jobs: Sequence[Job], queue: str, idle_s: float) -> tuple[Job, ...]:
    """A burst scenario from a trace (queues assigned): `queue` is idle for the first
    `idle_s` seconds, then floods: every job of it submitted before `idle_s` is
    submitted at `idle_s` instead; every other job keeps its time."""
    moved = [dataclasses.replace(j, time=max(j.time, idle_s)) if j.queue == queue else j
             for j in jobs]
    return tuple(sorted(moved, key=lambda j: (j.time, j.name)))
