"""Queues for an organisation: guaranteed shares per GPU type, borrowing, priority
classes and bounded preemption, as data the policy turns into rows of its ILP.

A **queue** has a name, the tenants allowed to submit to it (none listed: any
tenant), per GPU type a **guarantee** (GPUs it holds whenever its jobs can use them)
and an optional **borrowing limit** (how far beyond its guarantee it may hold idle
capacity; a type not listed: unlimited). It may also hold a **type-flexible
guarantee**: `guarantee_units` units across the types its jobs allow, each GPU of a
type weighing `QueueSet.unit_weights[type]` units (1 if not given), leaving the policy
to choose the mix. A job belongs to one queue (`DEFAULT_QUEUE` if it names none).

**Priority classes** are named weights: a job's term in the objective is scaled by its
class's weight, so a higher class is served first and may preempt a lower one.
**Bounded preemption**: a running job is not moved or preempted before
`min_runtime_s` seconds on its current allocation, and a round restarts at most
`max_restarts_per_round` running jobs (besides the growth of a queue's own jobs into
what it is owed).

How it enters Sia's ILP (`queues.rows`; docs/architecture.md, "Queues"): guarantee rows
Σ_{jobs of q, type t} GPUs ≥ what q's jobs would hold in a private partition of the
guarantee (its silo), and
the same over units; borrowing rows Σ ≤ guarantee + limit; a restart-budget row; all
soft but for the budget, with a penalty per GPU short that outweighs anything else the
objective can gain, so a guarantee yields only where nothing can meet it.

Pure data and validation: the controller and the simulator read it from a TOML file
(`QueueSet.from_mapping`; the simulator's file: `queues.files`), `PolicyService` from
the request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from sia_grpc.names import MAX_ID, is_name
from sia_grpc.policy.errors import FieldError

DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = "default"

__all__ = ["DEFAULT_PRIORITY", "DEFAULT_QUEUE", "PriorityClass", "Queue", "QueueSet", "partitioned",
           "scheduled_in"]


def _frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class PriorityClass:
    name: str
    weight: float = 1.0  # multiplies a job's term in the objective

    def __post_init__(self) -> None:
        if not is_name(self.name, MAX_ID):
            raise FieldError("name", f"{self.name!r} is not a valid name")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise FieldError("weight", f"must be a positive number, got {self.weight!r}")


@dataclass(frozen=True)
class Queue:
    name: str
    tenants: frozenset[str] = frozenset()  # empty: every tenant may submit
    guarantee: Mapping[str, int] = field(default_factory=dict)  # GPU type -> GPUs
    guarantee_units: float = 0.0  # type-flexible guarantee, in units
    borrow_limit: Mapping[str, int] = field(default_factory=dict)  # type -> GPUs over; absent: any
    min_runtime_s: float | None = None  # this queue's own, over QueueSet.min_runtime_s

    def __post_init__(self) -> None:
        if not is_name(self.name, MAX_ID):
            raise FieldError("name", f"{self.name!r} is not a valid queue name")
        object.__setattr__(self, "tenants", frozenset(self.tenants))
        object.__setattr__(self, "guarantee", _frozen(self.guarantee))
        object.__setattr__(self, "borrow_limit", _frozen(self.borrow_limit))
        for t in self.tenants:
            if not is_name(t, MAX_ID):
                raise FieldError("tenants", f"{t!r} is not a valid tenant name")
        for what, gpus in (("guarantee", self.guarantee), ("borrow_limit", self.borrow_limit)):
            for t, n in gpus.items():
                if not is_name(t, MAX_ID):
                    raise FieldError(what, f"{t!r} is not a valid GPU type name")
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise FieldError(f"{what}.{t}", f"must be a whole number of GPUs >= 0, "
                                                    f"got {n!r}")
        if not (math.isfinite(self.guarantee_units) and self.guarantee_units >= 0):
            raise FieldError("guarantee_units", f"must be >= 0, got {self.guarantee_units!r}")
        if self.min_runtime_s is not None and not (math.isfinite(self.min_runtime_s)
                                                   and self.min_runtime_s >= 0):
            raise FieldError("min_runtime_s", f"must be >= 0, got {self.min_runtime_s!r}")

    def admits(self, tenant: str) -> bool:
        return not self.tenants or tenant in self.tenants

    def cap(self, gpu_type: str) -> int | None:
        """The most GPUs of `gpu_type` it may hold (guarantee + limit), None: any."""
        if gpu_type not in self.borrow_limit:
            return None
        return self.guarantee.get(gpu_type, 0) + self.borrow_limit[gpu_type]


@dataclass(frozen=True)
class QueueSet:
    """Every queue of a cluster, its priority classes and its preemption bounds."""

    queues: tuple[Queue, ...] = ()
    priority_classes: tuple[PriorityClass, ...] = ()
    default_priority: str = DEFAULT_PRIORITY
    unit_weights: Mapping[str, float] = field(default_factory=dict)  # type -> units per GPU
    min_runtime_s: float = 0.0
    max_restarts_per_round: int | None = None
    # (__post_init__'s: not arguments, nor compared)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _classes: dict[str, PriorityClass] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        qs = tuple(self.queues)
        if DEFAULT_QUEUE not in {q.name for q in qs}:  # jobs naming no queue go there
            qs = (*qs, Queue(DEFAULT_QUEUE))
        object.__setattr__(self, "queues", qs)
        classes = tuple(self.priority_classes)
        if not any(c.name == self.default_priority for c in classes):
            classes = (*classes, PriorityClass(self.default_priority))
        object.__setattr__(self, "priority_classes", classes)
        object.__setattr__(self, "unit_weights", _frozen(self.unit_weights))
        for what, names in (("queue", [q.name for q in qs]),
                            ("priority_class", [c.name for c in classes])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise FieldError(what, f"{dup[0]!r} is defined twice")
        for t, w in self.unit_weights.items():
            if not is_name(t, MAX_ID) or not (math.isfinite(w) and w > 0):
                raise FieldError(f"unit_weights.{t}", f"must be a positive number, got {w!r}")
        if not (math.isfinite(self.min_runtime_s) and self.min_runtime_s >= 0):
            raise FieldError("min_runtime_s", f"must be >= 0, got {self.min_runtime_s!r}")
        m = self.max_restarts_per_round
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 0):
            raise FieldError("max_restarts_per_round", f"must be a whole number >= 0, got {m!r}")
        # (Lookups by name run per job and round: dicts, not scans.)
        object.__setattr__(self, "_index", {q.name: k for k, q in enumerate(qs)})
        object.__setattr__(self, "_classes", {c.name: c for c in classes})

    # ------------------------------------------------------------ lookups

    def index(self, name: str) -> int:
        """The position in `queues` of the queue `name` ("": `DEFAULT_QUEUE`); FieldError
        else."""
        k = self._index.get(name or DEFAULT_QUEUE)
        if k is None:
            raise FieldError("queue", f"unknown queue {name or DEFAULT_QUEUE!r}; the cluster "
                                      f"has {', '.join(q.name for q in self.queues)}")
        return k

    def queue(self, name: str) -> Queue:
        """The queue `name` (a job naming none is in `DEFAULT_QUEUE`); FieldError else."""
        return self.queues[self.index(name)]

    def priority(self, name: str) -> PriorityClass:
        """The priority class `name` ("": the default); FieldError else."""
        found = self._classes.get(name or self.default_priority)
        if found is not None:
            return found
        name = name or self.default_priority
        raise FieldError("priority", f"unknown priority class {name!r}; the classes are "
                                     f"{', '.join(c.name for c in self.priority_classes)}")

    def weight(self, priority: str) -> float:
        return self.priority(priority).weight

    def unit_weight(self, gpu_type: str) -> float:
        return float(self.unit_weights.get(gpu_type, 1.0))

    def min_runtime(self, queue: str) -> float:
        q = self.queue(queue)
        return self.min_runtime_s if q.min_runtime_s is None else q.min_runtime_s

    @property
    def guaranteed(self) -> bool:
        """Whether any queue holds a guarantee (else the rows are moot)."""
        return any(q.guarantee or q.guarantee_units for q in self.queues)

    def guarantees(self, gpu_type: str) -> int:
        """GPUs of `gpu_type` guaranteed over all queues."""
        return sum(q.guarantee.get(gpu_type, 0) for q in self.queues)

    def oversubscribed(self, capacity: Mapping[str, int]) -> list[str]:
        """The GPU types whose guarantees add up to more than the cluster has (a
        configuration the operator should hear of: not every guarantee can be met)."""
        return sorted(t for t in {t for q in self.queues for t in q.guarantee}
                      if self.guarantees(t) > capacity.get(t, 0))

    # ------------------------------------------------------------ reading

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> QueueSet:
        """From a TOML document's tables (`[[queue]]`, `[[priority_class]]`,
        `unit_weights`, `min_runtime_s`, `max_restarts_per_round`,
        `default_priority`); FieldError naming the key, e.g. `queue[1].guarantee.rtx`."""
        known = {"queue", "priority_class", "unit_weights", "min_runtime_s",
                 "max_restarts_per_round", "default_priority"}
        for key in data:
            if key not in known:
                raise FieldError(str(key), f"unknown key; known: {', '.join(sorted(known))}")
        queues = [_queue(i, q) for i, q in enumerate(_tables(data, "queue"))]
        classes = [_priority(i, c) for i, c in enumerate(_tables(data, "priority_class"))]
        try:
            return cls(queues=tuple(queues), priority_classes=tuple(classes),
                       default_priority=str(data.get("default_priority", DEFAULT_PRIORITY)),
                       unit_weights=dict(data.get("unit_weights", {})),
                       min_runtime_s=float(data.get("min_runtime_s", 0.0)),
                       max_restarts_per_round=data.get("max_restarts_per_round"))
        except (TypeError, ValueError) as err:
            if isinstance(err, FieldError):
                raise
            raise FieldError("queues", str(err)) from None


def _tables(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        raise FieldError(key, f"expected a list of tables ([[{key}]])")
    tables: list[Mapping[str, Any]] = value
    return tables


def _queue(i: int, t: Mapping[str, Any]) -> Queue:
    where = f"queue[{i}]"
    known = {"name", "tenants", "guarantee", "guarantee_units", "borrow_limit", "min_runtime_s"}
    for key in t:
        if key not in known:
            raise FieldError(f"{where}.{key}", f"unknown key; known: {', '.join(sorted(known))}")
    try:
        return Queue(name=str(t.get("name", "")), tenants=frozenset(_strings(t.get("tenants", ()))),
                     guarantee=dict(t.get("guarantee", {})),
                     guarantee_units=float(t.get("guarantee_units", 0.0)),
                     borrow_limit=dict(t.get("borrow_limit", {})),
                     min_runtime_s=(None if t.get("min_runtime_s") is None
                                    else float(t["min_runtime_s"])))
    except FieldError as err:
        raise FieldError(f"{where}.{err.field}", err.problem) from None
    except (TypeError, ValueError) as err:
        raise FieldError(where, str(err)) from None


def _priority(i: int, t: Mapping[str, Any]) -> PriorityClass:
    where = f"priority_class[{i}]"
    for key in t:
        if key not in ("name", "weight"):
            raise FieldError(f"{where}.{key}", "unknown key; known: name, weight")
    try:
        return PriorityClass(name=str(t.get("name", "")), weight=float(t.get("weight", 1.0)))
    except FieldError as err:
        raise FieldError(f"{where}.{err.field}", err.problem) from None
    except (TypeError, ValueError) as err:
        raise FieldError(where, str(err)) from None


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise FieldError("tenants", f"expected a list of tenant names, got {value!r}")
    return [str(v) for v in value]


def changes(old: QueueSet, new: QueueSet) -> str:
    """What a reload changes, in words: "added q3; removed q1; changed research (its
    guarantee, borrow limit, ...); priority classes or settings changed"; "unchanged"."""
    before, after = {q.name: q for q in old.queues}, {q.name: q for q in new.queues}
    parts = []
    for verb, names in (("added", sorted(after.keys() - before.keys())),
                        ("removed", sorted(before.keys() - after.keys())),
                        ("changed", sorted(n for n in before.keys() & after.keys()
                                           if before[n] != after[n]))):
        if names:
            parts.append(f"{verb} {', '.join(names)}")
    rest = [f.name for f in dataclasses.fields(QueueSet)
            if f.compare and f.name != "queues" and getattr(old, f.name) != getattr(new, f.name)]
    if rest:
        parts.append(f"changed {', '.join(rest)}")
    return "; ".join(parts) or "unchanged"


def partitioned(queues: QueueSet, gpu_types: Sequence[str]) -> QueueSet:
    """`queues` as private partitions: each may hold its guarantee of each type and
    no more (the guarantees become caps; type-flexible units are not a partition)."""
    return dataclasses.replace(queues, queues=tuple(
        dataclasses.replace(q, guarantee={}, guarantee_units=0.0, borrow_limit={
            t: q.guarantee.get(t, 0) for t in gpu_types}) for q in queues.queues))


class Placed(Protocol):
    """What `scheduled_in` reads of a job's spec (a `sia.v1.JobSpec`)."""

    queue: str
    priority: str


def scheduled_in(queues: QueueSet, spec: Placed) -> tuple[str, str, str]:
    """(queue, priority class, note) a job is scheduled with: its own while the
    configuration has them; a queue or class that a reload removed gives the default
    one, and a note saying so (its reasons carry it, docs/operations.md)."""
    queue, priority, notes = spec.queue or DEFAULT_QUEUE, spec.priority, []
    if queue not in {q.name for q in queues.queues}:
        notes.append(f"queue {queue!r} is no longer configured: scheduled in {DEFAULT_QUEUE}")
        queue = DEFAULT_QUEUE
    if priority and priority not in {c.name for c in queues.priority_classes}:
        notes.append(f"priority class {priority!r} is no longer configured: scheduled as "
                     f"{queues.default_priority}")
        priority = ""
    return queue, priority, "; ".join(notes)
