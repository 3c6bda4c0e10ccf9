"""What a round did to the queues (the controller's reasons, docs/operations.md,
"Queues"): the guarantee rows that bound it, the jobs preempted so that a queue gets
its guarantee back (reclaims), and the rule a waiting job is held by. (Which queue and
priority class a job is scheduled in: `queues.model.scheduled_in`.)

Pure functions of the round's inputs and result; the controller's state machine calls
them (`controller.machine.rounds`) and keeps what they are given in
`RoundBook.solve_inputs`. A reclaim is a job of a queue above its guarantee that lost
its GPUs while another queue's guarantee row binds and that queue gains GPUs of the
type, as many such jobs as cover what the queue lost and the reclaimers gained. Jobs,
allocations and the round's result are read through Protocols (`types.PolicyJob`,
`types.JobAllocation`, `types.RoundResult` satisfy them; `policy.types` names
`QueueSet`, so importing it here would be a circle).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sia_grpc.policy.cluster import Config
from sia_grpc.policy.queues.model import QueueSet
from sia_grpc.policy.queues.rows import UNITS, row_binds

__all__ = ["Allocated", "Held", "Outcome", "QueueJob", "Round", "borrowed", "held",
           "outcome", "units"]

# The policy's reason for a job that simply got nothing this round (policy.rounds.explain);
# only that one is replaced by the queue rule that held it.
_NO_GPUS = "waiting: no GPUs free"

Held = dict[str, collections.Counter[str]]  # queue -> GPU type -> GPUs


class QueueJob(Protocol):
    """What the outcome reads of a job (`types.PolicyJob`)."""

    @property
    def job_id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def allowed_types(self) -> frozenset[str] | None: ...  # None: any type


class Allocated(Protocol):
    """What the outcome reads of an allocation (`types.JobAllocation`)."""

    @property
    def config(self) -> Config: ...


class Round(Protocol):
    """What the outcome reads of a round's result (`types.RoundResult`)."""

    @property
    def allocations(self) -> Mapping[str, Allocated]: ...
    @property
    def reasons(self) -> Mapping[str, str]: ...
    @property
    def rows(self) -> Mapping[str, tuple[float, float]]: ...  # name -> (activity, bound)


@dataclass(frozen=True)
class Outcome:
    """What a round did to the queues."""

    reasons: Mapping[str, str]  # job -> the reason replacing the policy's
    reclaims: Mapping[str, str]  # preempted job -> the queue that reclaims its GPUs
    binding: tuple[str, ...]  # guarantee rows that bind ("guarantee research/rtx")


def held(jobs: Sequence[QueueJob], allocations: Mapping[str, Allocated]) -> Held:
    """GPUs each queue's jobs hold in `allocations`, by type."""
    out: Held = collections.defaultdict(collections.Counter)
    for j in jobs:
        a = allocations.get(j.job_id)
        if a is not None:
            out[j.queue][a.config.gpu_type] += a.config.num_gpus
    return out


def units(queues: QueueSet, gpus: Mapping[str, int]) -> float:
    """GPUs by type in units (`QueueSet.unit_weights`)."""
    return sum(queues.unit_weight(t) * n for t, n in gpus.items())


def borrowed(queues: QueueSet, queue: str, gpus: Mapping[str, int]) -> dict[str, int]:
    """Of the GPUs `queue` holds (by type), those beyond its guarantee: beyond its
    guarantee of the type, less what a type-flexible guarantee covers (its units, less
    those of the per-type guarantees it holds, which count towards it as in the row;
    they cover the GPUs beyond the per-type guarantees in the types' name order)."""
    q = queues.queue(queue)
    cover = q.guarantee_units - units(queues, {t: min(n, q.guarantee.get(t, 0))
                                               for t, n in gpus.items()})
    out = {}
    for t in sorted(gpus):
        over, w = max(gpus[t] - q.guarantee.get(t, 0), 0), queues.unit_weight(t)
        covered = min(over, int(max(cover, 0.0) // w))
        cover -= covered * w
        if over > covered:
            out[t] = over - covered
    return out


def outcome(queues: QueueSet, result: Round, jobs: Sequence[QueueJob],
            previous: Mapping[str, Allocated], capacity: Mapping[str, int]) -> Outcome:
    """The round's binding guarantee rows, reclaims and queue reasons."""
    before, after = held(jobs, previous), held(jobs, result.allocations)
    binding = tuple(name for name, (a, b) in result.rows.items()
                    if name.startswith("guarantee ") and b < 0 and row_binds(a, b))
    # (queue, type or UNITS) whose guarantee binds and who gains by it: the reclaimers
    takers = []
    for name in binding:
        q, _, t = name.removeprefix("guarantee ").rpartition("/")
        gained = (units(queues, after[q]) > units(queues, before[q]) if t == UNITS
                  else after[q][t] > before[q][t])
        if gained:
            takers.append((q, t))
    used: collections.Counter[str] = collections.Counter()
    for a in result.allocations.values():
        used[a.config.gpu_type] += a.config.num_gpus
    reasons, reclaims = {}, {}
    budget: dict[tuple[str, str], int] = {}  # (queue, type) -> GPUs it still gives back
    for j in jobs:
        if j.job_id in result.allocations:
            continue
        prev = previous.get(j.job_id)
        if prev is not None:
            t = prev.config.gpu_type
            taker = _reclaimer(queues, j.queue, t, before, takers)
            if taker is None:
                continue
            # Only as many GPUs as the queue lost and the reclaimers gained are a reclaim
            # (a borrower's job swapped for another of its own is the policy's choice).
            key = (j.queue, t)
            if key not in budget:
                gain = sum(max(after[r][t] - before[r][t], 0) for r, _ in takers if r != j.queue)
                budget[key] = min(max(before[j.queue][t] - after[j.queue][t], 0), gain)
            if budget[key] > 0:
                budget[key] -= prev.config.num_gpus
                reclaims[j.job_id] = taker[0]
                reasons[j.job_id] = f"preempted: queue {taker[0]} reclaims its guarantee of " \
                                    f"{_guarantee(queues, *taker)}"
        elif result.reasons.get(j.job_id, "").startswith(_NO_GPUS):
            why = _held_back(queues, j, after[j.queue], used, capacity)
            if why:
                reasons[j.job_id] = f"waiting: queue {j.queue} {why}"
    return Outcome(reasons=reasons, reclaims=reclaims, binding=binding)


def _reclaimer(queues: QueueSet, queue: str, gpu_type: str, before: Held,
               takers: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The (queue, type) reclaiming from a job of `queue` that held `gpu_type`: one of
    another queue whose guarantee of that type (or in units) binds, if `queue` was
    above its own guarantee before the round."""
    if not borrowed(queues, queue, before[queue]).get(gpu_type):
        return None
    return next((tk for tk in takers if tk[0] != queue and tk[1] == gpu_type),
                next((tk for tk in takers if tk[0] != queue and tk[1] == UNITS), None))


def _guarantee(queues: QueueSet, queue: str, gpu_type: str) -> str:
    """"8 rtx", or "16 units"."""
    q = queues.queue(queue)
    if gpu_type == UNITS:
        return f"{q.guarantee_units:g} units"
    return f"{q.guarantee.get(gpu_type, 0)} {gpu_type}"


def _held_back(queues: QueueSet, job: QueueJob, mine: Mapping[str, int],
               used: Mapping[str, int], capacity: Mapping[str, int]) -> str:
    """Why a job of a queue that got nothing waits, when a queue rule says it: on every
    type it may use, its queue is at its borrowing limit, or holds its guarantee (or
    has none) while the cluster has nothing idle. "" when no queue rule explains it."""
    q = queues.queue(job.queue)
    types = sorted((job.allowed_types or set(capacity)) & set(capacity))
    if not types or units(queues, mine) < q.guarantee_units:
        return ""  # (below its type-flexible guarantee: no queue rule holds it back)
    met = f"holds its guarantee of {q.guarantee_units:g} units" if q.guarantee_units else ""
    clauses, full = [], False
    for t in types:
        cap, g = q.cap(t), q.guarantee.get(t, 0)
        if cap is not None and mine.get(t, 0) >= cap:
            clauses.append(f"is at its borrowing limit of {cap} {t}" if g == 0 else
                           f"is at its limit of {cap} {t} (its guarantee of {g} and a "
                           f"borrowing limit of {cap - g})")
        elif used.get(t, 0) >= capacity[t] and mine.get(t, 0) >= g:
            full = True
            clauses.append((met or f"has no guarantee of {t}") if g == 0 else
                           f"is at its guarantee of {g} {t}" if mine.get(t, 0) == g else
                           f"is beyond its guarantee of {g} {t} (holds {mine[t]})")
        else:
            return ""
    if full and not (queues.guaranteed or any(q.borrow_limit for q in queues.queues)):
        return ""  # no queue has a guarantee or limit: the flat pool's reason says it
    return ", ".join(dict.fromkeys(clauses)) + (" and the cluster has nothing idle to lend"
                                                if full else "")
