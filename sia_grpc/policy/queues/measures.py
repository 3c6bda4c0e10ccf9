"""Per-queue metrics of a simulated run with queues (`metrics.queues.<name>` in the
simulator's JSON), from its records alone; docs/results.md, "What the columns mean",
has the same definitions. The records are read through Protocols (`RecordedRun`,
`RecordedRound`, `RecordedJob`), which the simulator's `sim.records` satisfy, and the
run's round length is given (`sim.records.round_length`): the policy imports nothing
of the simulator.

For queue q and each guarantee key k (a GPU type, or `units` for its type-flexible
guarantee), round r of length L starting at t_r:

* owed_r: what the policy's guarantee row says q is owed, −bound of `guarantee q/k`
  = min(guarantee, what q's jobs could use this round); 0 without a row.
* held_r: the GPUs of type k of the allocations the simulator applied to q's jobs
  (units: Σ_t unit_weight_t · GPUs of type t).
* short_r = max(0, owed_r − held_r).

**Shortfall** (`shortfall_gpu_h`): Σ_r short_r · L, every round, no grace.

**Guarantee violation** (`guarantee_violation_gpu_h`): the part of the shortfall
beyond the grace. A streak is a maximal run of consecutive rounds with short_r > 0
(a gap in the rounds, when nothing was active, ends it); it starts at s, the first
round's start. Its grace at round r is

    grace_r = L + C_r + m

with C_r the longest checkpoint-restore delay of the jobs active in any round of
the streak up to r, and m the longest minimum runtime of any queue: a guarantee
is due within one round plus the checkpoint time of the jobs that must give way
(`queues.rows`), and no job may be preempted before its minimum runtime.
Round r adds short_r × |[t_r, t_r + L) ∩ [s + grace_r, ∞)|: the GPU-time owed and
not given after the grace. A streak's grace runs from its first round: more demand
arriving within a streak gets no new grace.

**Violation while waiting** (`violation_waiting_gpu_h`): the part of the violation
in rounds where some job of q was active and had no GPUs. The guarantee rows bound
each type's owed by what q's jobs could use *of that type*, each type on its own,
while a job runs on one type: a queue whose few jobs all run (on one type, say) is
still owed the guarantee of every other type, which no placement could give. This
part leaves such rounds out: what remains is a queue below its guarantee while one
of its jobs waits.

**Reclaim** (`reclaim_s`, `reclaim_restarts`): an episode starts at round r when q is
owed more than it held in the round before or holds in r (owed_r > min(held_{r−1},
held_r); before the first round, and after a gap, it held nothing) and ends at the
first round r' ≥ r with held_{r'} ≥ owed_{r'} (the run's end if none). `reclaim_s`
is the longest t_{r'} − t_r over episodes and keys: 0 when q gets what it is owed
in the very round it claims it. `reclaim_restarts` counts, over the rounds of q's
episodes, the jobs of other queues that restarted in the round with fewer GPUs of
the episode's type than the round before (preempted or shrunk: jobs that gave way;
for `units`, of any type; a job once per round).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from sia_grpc.policy.queues.rows import UNITS

__all__ = ["UNITS", "Episode", "QueueMetrics", "RecordedJob", "RecordedRound", "RecordedRun",
           "compute_queues", "episodes"]

_HOUR = 3600.0
_EPS = 1e-9  # GPUs: float noise in owed (a row's bound) and units

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


class RecordedJob(Protocol):
    """What the metrics read of a job's record (`sim.records.JobRecord`)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def submit_time(self) -> float: ...
    @property
    def finish_time(self) -> float | None: ...  # None: unfinished
    @property
    def jct(self) -> float | None: ...
    @property
    def gpu_seconds(self) -> float: ...


class RecordedRound(Protocol):
    """What the metrics read of a round's record (`sim.records.RoundRecord`)."""

    @property
    def time(self) -> float: ...  # the round's start
    @property
    def allocations(self) -> Mapping[str, tuple[str, int]]: ...  # job -> (type, GPUs)
    @property
    def restarted(self) -> Sequence[str]: ...
    @property
    def held(self) -> Mapping[str, Mapping[str, int]]: ...  # queue -> type -> GPUs
    @property
    def owed(self) -> Mapping[str, Mapping[str, float]] | None: ...  # queue -> key -> GPUs
    @property
    def restore_s(self) -> float: ...


class RecordedRun(Protocol):
    """What the metrics read of a run's records (`sim.records.SimResult`)."""

    @property
    def queues(self) -> Mapping[str, object]: ...  # the run's queues, by name
    @property
    def jobs(self) -> Sequence[RecordedJob]: ...
    @property
    def rounds(self) -> Sequence[RecordedRound]: ...
    @property
    def unit_weights(self) -> Mapping[str, float]: ...
    @property
    def min_runtime_s(self) -> float: ...  # the longest of any queue


@dataclass(frozen=True)
class QueueMetrics:
    jobs: int
    finished: int
    avg_jct_h: float | None
    p99_jct_h: float | None
    gpu_hours: float
    guarantee_violation_gpu_h: float | None  # None: the policy reported no guarantee rows
    shortfall_gpu_h: float | None
    violation_waiting_gpu_h: float | None  # the violation in rounds a job of q waited
    reclaim_s: float | None
    reclaim_restarts: int | None

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def compute_queues(result: RecordedRun, round_s: float | None) -> dict[str, QueueMetrics]:
    """Each queue's metrics; {} for a run without queues. `round_s`: the run's round
    length (`sim.records.round_length`; None: unknown, taken as 0)."""
    if not result.queues:
        return {}
    honoured = any(r.owed is not None for r in result.rounds)
    return {q: _queue(result, q, honoured, round_s or 0.0) for q in result.queues}


@dataclass(frozen=True)
class Episode:
    """One reclaim episode of a queue on one key (see the module's docstring)."""

    key: str  # GPU type or units
    start_s: float  # the round it claimed more than it held
    end_s: float | None  # the first round it held what it was owed; None: never
    gave_way: tuple[tuple[float, str], ...]  # (round's time, job) of jobs that gave way

    def seconds(self, run_end_s: float) -> float:
        return (run_end_s if self.end_s is None else self.end_s) - self.start_s


def _queue(result: RecordedRun, queue: str, honoured: bool, length: float) -> QueueMetrics:
    jobs = [j for j in result.jobs if j.queue == queue]
    jcts = np.asarray([j.jct / _HOUR for j in jobs if j.jct is not None], dtype=float)
    violation = shortfall = waiting = 0.0
    waited = _waited(result, queue)
    for _, owed, held in _series(result, queue):
        v, s, w = _violation(result, length, owed, held, waited)
        violation, shortfall, waiting = violation + v, shortfall + s, waiting + w
    claims = episodes(result, queue, length)
    end = result.rounds[-1].time + length if result.rounds else 0.0
    return QueueMetrics(
        jobs=len(jobs), finished=int(jcts.size),
        avg_jct_h=float(jcts.mean()) if jcts.size else None,
        p99_jct_h=float(np.percentile(jcts, 99)) if jcts.size else None,
        gpu_hours=float(sum(j.gpu_seconds for j in jobs)) / _HOUR,
        guarantee_violation_gpu_h=float(violation) if honoured else None,
        shortfall_gpu_h=float(shortfall) if honoured else None,
        violation_waiting_gpu_h=float(waiting) if honoured else None,
        reclaim_s=float(max([e.seconds(end) for e in claims], default=0.0)) if honoured
        else None,
        # (a job that gave way on two keys in one round counts once)
        reclaim_restarts=len({g for e in claims for g in e.gave_way}) if honoured else None)


def episodes(result: RecordedRun, queue: str, round_s: float | None) -> list[Episode]:
    """The queue's reclaim episodes, every key, in order of key then time. `round_s`:
    as for `compute_queues`."""
    others = {j.name for j in result.jobs if j.queue != queue}
    follows = _contiguous(result, round_s or 0.0)
    return [e for key, owed, held in _series(result, queue)
            for e in _episodes(result, follows, others, key, owed, held)]


def _series(result: RecordedRun, queue: str) -> Iterator[tuple[str, Floats, Floats]]:
    """(key, owed per round, held per round) for every key the queue is ever owed."""
    rounds = result.rounds
    keys = sorted({k for r in rounds for k in (r.owed or {}).get(queue, {})})
    for key in keys:
        owed = np.array([(r.owed or {}).get(queue, {}).get(key, 0.0) for r in rounds],
                        dtype=float)
        held = np.array([_held(result, r, queue, key) for r in rounds], dtype=float)
        yield key, owed, held


def _held(result: RecordedRun, rnd: RecordedRound, queue: str, key: str) -> float:
    gpus = rnd.held.get(queue, {})
    if key == UNITS:
        return sum(float(result.unit_weights.get(t, 1.0)) * n for t, n in gpus.items())
    return float(gpus.get(key, 0))


def _waited(result: RecordedRun, queue: str) -> Bools:
    """Per round: whether a job of the queue was active (submitted, not finished)
    and had no allocation."""
    mine = [j for j in result.jobs if j.queue == queue]
    return np.array([any(j.submit_time <= r.time and (j.finish_time is None
                                                       or j.finish_time > r.time)
                         and j.name not in r.allocations for j in mine)
                     for r in result.rounds], dtype=bool)


def _contiguous(result: RecordedRun, length: float) -> Bools:
    """Per round: whether it directly follows the round before (no idle gap)."""
    times = np.array([r.time for r in result.rounds], dtype=float)
    gaps = np.diff(times, prepend=-np.inf)
    follows: Bools = gaps <= length * (1 + 1e-6)
    return follows


def _violation(result: RecordedRun, length: float, owed: Floats, held: Floats,
               waited: Bools) -> tuple[float, float, float]:
    """(violation, shortfall, violation in rounds a job waited) in GPU-hours of one
    queue and key."""
    short = np.maximum(owed - held, 0.0)
    short[short <= _EPS] = 0.0
    follows = _contiguous(result, length)
    violation, start, restore, waiting = 0.0, None, 0.0, 0.0
    for r, rnd in enumerate(result.rounds):
        if not short[r]:
            start = None
            continue
        if start is None or not follows[r]:
            start, restore = rnd.time, 0.0
        restore = max(restore, rnd.restore_s)
        due = start + length + restore + result.min_runtime_s
        counted = max(0.0, rnd.time + length - max(rnd.time, due))
        violation += short[r] * counted
        waiting += short[r] * counted * waited[r]
    return violation / _HOUR, float(short.sum()) * length / _HOUR, waiting / _HOUR


def _episodes(result: RecordedRun, follows: Bools, others: set[str], key: str,
              owed: Floats, held: Floats) -> Iterator[Episode]:
    rounds = result.rounds
    start: float | None = None
    gave_way: list[tuple[float, str]] = []
    for r, rnd in enumerate(rounds):
        before = held[r - 1] if r and follows[r] else 0.0
        if start is None and owed[r] > min(before, held[r]) + _EPS:
            start, gave_way = rnd.time, []
        if start is None:
            continue
        if r and follows[r]:
            gave_way += [(rnd.time, job) for job in _gave_way(rounds[r - 1], rnd, others, key)]
        if held[r] + _EPS >= owed[r]:
            yield Episode(key, start, rnd.time, tuple(gave_way))
            start = None
    if start is not None:  # still short when the run ended
        yield Episode(key, start, None, tuple(gave_way))


def _gave_way(before: RecordedRound, rnd: RecordedRound, others: set[str],
              key: str) -> list[str]:
    """Jobs of `others` restarted in `rnd` with fewer GPUs of type `key` (any type
    for units) than in `before`."""

    def gpus(r: RecordedRound, job: str) -> int:
        t, n = r.allocations.get(job, ("", 0))
        return n if key == UNITS or t == key else 0

    return [job for job in rnd.restarted
            if job in others and gpus(rnd, job) < gpus(before, job)]
