"""Baselines beside Sia, behind the same `Policy` interface.

- `PolluxPolicy` — heterogeneity-*unaware* goodput optimisation in the manner of
  Pollux (OSDI '21). Pollux believes every GPU is the same: here each job's
  goodput on every type is its model's estimate for one reference type (the type
  it runs on, else the cluster's most plentiful type). Pollux searches arbitrary
  placements with a genetic algorithm and a p = −1 fairness mean; this version
  keeps the p = −1 mean and the restart discount but solves exactly over Sia's
  restricted configuration set with the same ILP solver. So it isolates what
  heterogeneity-awareness buys, without the GA's search noise or its minutes-long
  runtime at scale; it does not reproduce the GA's arbitrary multi-node shapes.
  Pollux's power mean adds ε = 10⁻³ to every job's speedup, so a job left out
  scores ε^p = 1000 where any allocated job scores about 1 or less: Pollux
  starts every job it can fit before it grows any. The no-allocation penalty λ
  is therefore 1/ε = 1000 here, not Sia's 1.1. (With λ = 1.1 and p = −1 and every
  job's 1-GPU goodput normalised to 1, starting a job was worth 0.1 and doubling
  a running one up to 0.5, so under load this baseline queued jobs behind jobs
  holding 2–4 GPUs: 42 of 58 active jobs waiting on newtrace/workload-1.)
  Pollux has no rule that keeps a restoring job in place (`hold_restoring` off).
- `GavelPolicy` — Gavel (OSDI '20) as Sia's artifact runs it: rigid jobs (the
  submitted GPU count and batch size), heterogeneity-aware. Each round solves
  Gavel's max-sum-throughput LP over *time shares* x[job, type] (Σ_types x ≤ 1
  per job; Σ_jobs x·GPUs ≤ capacity per type; value = iterations/s on the type),
  then realises it by time-sharing: priority = x / (share of the type's time the
  job has received), and jobs are granted whole GPUs greedily in priority order,
  at most one type per job, until nothing more fits (work-conserving: jobs with
  x = 0 fill GPUs left over). The received time comes in `PolicyJob.attained`,
  so the policy stays stateless. Rounds are 360 s.
- `FifoPolicy` — first come, first served, non-preemptive: running jobs keep
  their GPUs; queued jobs in submission order get their starting count on the
  type where they run fastest, until one does not fit anywhere.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import sparse

from sia_grpc.policy.candidates import (
    CandidateTable,
    build_candidates,
    candidate_index,
    estimate,
)
from sia_grpc.policy.cluster import Cluster, Config, GpuId
from sia_grpc.policy.gcpause import collection_paused
from sia_grpc.policy.queues import QueueSet, partitioned
from sia_grpc.policy.result import finish_round
from sia_grpc.policy.sia import SiaConfig, SiaPolicy
from sia_grpc.policy.solvers import lp_interior
from sia_grpc.policy.types import (
    Adaptivity,
    JobAllocation,
    PolicyJob,
    RoundFromConfig,
    RoundResult,
    WarmStart,
    positive,
)

# Pollux's power mean scores a job with speedup s as (s + ε)^p, ε = 1e-3: a job
# left out (s = 0) costs ε^p = 1/ε at p = −1.
POLLUX_NONE_PENALTY = 1e3


@dataclass(frozen=True)
class PartitionedSiaPolicy(SiaPolicy):
    """Silos, the baseline for shared queues: each queue holds its guarantee as a
    private partition (at most its guarantee of each type, nothing borrowed, nothing
    lent) and Sia decides inside each. Jobs of a queue without a guarantee of a type
    never run on it. Without queues it is Sia."""

    name: str = "sia-partitioned"

    @collection_paused
    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation], *,
                 queues: QueueSet | None = None,
                 warm: WarmStart | None = None) -> RoundResult:
        if queues is not None:
            queues = partitioned(queues, cluster.gpu_types)
        return super().optimize(cluster, jobs, previous, queues=queues, warm=warm)


@dataclass(frozen=True)
class PolluxPolicy(SiaPolicy):
    config: SiaConfig = SiaConfig(p=-1.0, lambda_=POLLUX_NONE_PENALTY, hold_restoring=False,
                                  grow_into_idle=False)  # (the baseline as it was measured)
    name: str = "pollux"

    def type_maps(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                  previous: Mapping[str, JobAllocation]) -> list[Mapping[str, str]]:
        """Every type seen as the job's current one (a new job: the largest type's)."""
        largest = max(cluster.gpu_types, key=lambda t: (cluster.capacity[t], t))
        out: list[Mapping[str, str]] = []
        for job in jobs:
            current = previous.get(job.job_id)
            ref = current.config.gpu_type if current else largest
            out.append({t: ref for t in cluster.gpu_types})
        return out


@dataclass(frozen=True)
class GavelConfig:
    """No settings; the round length is the caller's (Gavel's own default: 360 s)."""

    round_duration: float = 360.0

    def __post_init__(self) -> None:
        positive(self, "round_duration")


def rigid_view(cluster: Cluster, job: PolicyJob) -> PolicyJob:
    """The job as a rigid scheduler sees it: its submitted count (or its
    minimum) and, if it has one, its submitted batch size."""
    if job.adaptivity is Adaptivity.RIGID:
        return job
    p = job.pipeline_gpus
    n = job.num_gpus or -(-max(job.min_gpus, p) // p) * p  # whole replicas
    if job.batch_size is None:  # no submitted batch: best batch at that count
        return dataclasses.replace(job, min_gpus=n, max_gpus=n)
    return dataclasses.replace(job, adaptivity=Adaptivity.RIGID, num_gpus=n)


@dataclass(frozen=True)
class GavelPolicy(RoundFromConfig):
    config: GavelConfig = GavelConfig()
    name: str = "gavel"

    @collection_paused
    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation], *,
                 queues: QueueSet | None = None,
                 warm: WarmStart | None = None) -> RoundResult:
        """(Queues are not this baseline's: it schedules one flat pool.)"""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        views = [rigid_view(cluster, j) for j in jobs]
        table = build_candidates(cluster, views, previous, scale_rules=False)
        timings["estimate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Gavel runs a job on exactly its own GPU count, spread over nodes as
        # needed (not Sia's configuration set); the estimate of the row (replicas
        # capped at that count) is the job's throughput on the type.
        own = table.replicas * np.repeat([v.pipeline_gpus for v in views],
                                         np.diff(table.offsets))
        # Iterations/s: for a fixed batch the table's goodput is samples/s.
        rate = table.goodput / np.maximum(table.batch_size, 1)
        shares, objective = max_sum_throughput_shares(table, rate, own)
        timings["solve"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        priority = time_share_priority(table, views, shares, self.round_duration)
        chosen = greedy_grant(table, views, priority, shares, own)
        timings["build"] = time.perf_counter() - t0
        placed = pack_workers(cluster, {j: (table.types()[r], int(own[r]))
                                        for j, r in chosen.items()}, previous)
        return finish_round(table, views, chosen, previous, objective=objective,
                            timings=timings, placed=placed)


def max_sum_throughput_shares(table: CandidateTable, rate: np.ndarray,
                              gpus: np.ndarray) -> tuple[np.ndarray, float]:
    """Gavel's max-sum-throughput LP: the time share x of each candidate row
    maximising Σ rate·x, with Σ x ≤ 1 over a job's rows and Σ x·gpus ≤ capacity
    per type. Returns (x per row, objective)."""
    n = len(table)
    if n == 0:
        return np.zeros(0), 0.0
    cluster = table.cluster
    num_types = len(cluster.gpu_types)
    cols = np.arange(n)
    a_ub = sparse.vstack([
        sparse.csr_matrix((np.ones(n), (table.job, cols)), shape=(table.num_jobs, n)),
        sparse.csr_matrix((gpus.astype(float), (table.types(), cols)),
                          shape=(num_types, n)),
    ])
    b_ub = np.concatenate([np.ones(table.num_jobs),
                           [float(cluster.capacity[t]) for t in cluster.gpu_types]])
    x = lp_interior(rate, a_ub, b_ub)
    return x, float(rate @ x)


def time_share_priority(table: CandidateTable, jobs: Sequence[PolicyJob], shares: np.ndarray,
                        round_duration: float) -> np.ndarray:
    """Gavel's priority of each row: its time share x over the fraction of the
    type's time the job has received so far. Every job is credited half a round
    on every type (as Gavel does for new jobs), so fractions are never zero."""
    types = table.cluster.gpu_types
    received = np.array([[j.attained.get(t, 0.0) for t in types] for j in jobs],
                        dtype=float).reshape(len(jobs), len(types)) + round_duration / 2
    fraction = received / received.sum(axis=0)
    priority: npt.NDArray[np.float64] = shares / fraction[table.job, table.types()]
    return priority


def greedy_grant(table: CandidateTable, jobs: Sequence[PolicyJob], priority: np.ndarray,
                 shares: np.ndarray, gpus: np.ndarray) -> dict[str, int]:
    """Grant rows in descending (priority, share), one row per job, while the
    type has `gpus` of the row free. Returns job id → chosen row."""
    free = np.array([table.cluster.capacity[t] for t in table.cluster.gpu_types])
    types, owner = table.types(), table.job
    chosen: dict[str, int] = {}
    for r in np.lexsort((np.arange(len(table)), -shares, -priority)):
        job_id = jobs[owner[r]].job_id
        if job_id in chosen or gpus[r] > free[types[r]]:
            continue
        chosen[job_id] = int(r)
        free[types[r]] -= gpus[r]
    return chosen


def pack_workers(cluster: Cluster, demand: Mapping[str, tuple[int, int]],
                 previous: Mapping[str, JobAllocation],
                 ) -> dict[str, tuple[Config, tuple[GpuId, ...]]]:
    """Gavel's worker assignment: `demand` is job id → (type index, GPU count).
    Per type, largest jobs first, a job keeps its previous GPUs when they are all
    of this type, as many as it needs and still free; the others take the first
    free GPUs in node order, spanning nodes as needed. Always fits when the
    per-type counts do."""
    out: dict[str, tuple[Config, tuple[GpuId, ...]]] = {}
    for t, name in enumerate(cluster.gpu_types):
        order = sorted((j for j, (tt, _) in demand.items() if tt == t),
                       key=lambda j: (-demand[j][1], j))
        free = {GpuId(n.name, k) for n in cluster.nodes if n.gpu_type == name
                for k in range(n.num_gpus)}
        rest = []
        for j in order:
            prev = tuple(previous[j].gpus) if j in previous else ()
            if len(prev) == demand[j][1] and free.issuperset(prev):
                free.difference_update(prev)
                out[j] = (_shape(name, prev), prev)
            else:
                rest.append(j)
        pool = sorted(free, key=lambda g: (cluster.nodes.index(cluster.node(g.node)), g.index))
        for j in rest:
            gpus, pool = tuple(sorted(pool[:demand[j][1]])), pool[demand[j][1]:]
            out[j] = (_shape(name, gpus), gpus)
    return out


def _shape(gpu_type: str, gpus: Sequence[GpuId]) -> Config:
    return Config(gpu_type, num_nodes=len({g.node for g in gpus}), num_gpus=len(gpus))


@dataclass(frozen=True)
class FifoConfig:
    """No settings; the round length is the caller's."""

    round_duration: float = 60.0

    def __post_init__(self) -> None:
        positive(self, "round_duration")


@dataclass(frozen=True)
class FifoPolicy(RoundFromConfig):
    config: FifoConfig = FifoConfig()
    name: str = "fifo"

    @collection_paused
    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation], *,
                 queues: QueueSet | None = None,
                 warm: WarmStart | None = None) -> RoundResult:
        """(Queues are not this baseline's: it schedules one flat pool.)"""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        order = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
        views = [rigid_view(cluster, j) for j in order]
        # Running jobs are offered only their current configuration.
        current = [previous[v.job_id].config if v.job_id in previous else None for v in views]
        offsets, index = candidate_index(cluster, views, [None] * len(views))
        pos = cluster.config_index
        parts = [np.array([pos[c]]) if c is not None and c in pos
                 else index[offsets[i]:offsets[i + 1]]
                 for i, c in enumerate(current)]
        counts = np.array([len(x) for x in parts], dtype=np.int64)
        table = estimate(cluster, views, np.concatenate([[0], np.cumsum(counts)]),
                         np.concatenate(parts).astype(np.int64) if parts else counts)
        timings["estimate"] = time.perf_counter() - t0
        free = dict(cluster.capacity)
        chosen: dict[str, int] = {}
        waiting = []
        for i, view in enumerate(views):
            rows = np.arange(table.offsets[i], table.offsets[i + 1])
            if view.job_id in previous and len(rows):  # non-preemptive: keep running
                chosen[view.job_id] = int(rows[0])
                free[table.config_of(int(rows[0])).gpu_type] -= int(table.gpus()[rows[0]])
            else:
                waiting.append((view, rows))
        for view, rows in waiting:
            fits = [r for r in rows[np.argsort(-table.goodput[rows], kind="stable")]
                    if table.config_of(int(r)).num_gpus <= free[table.config_of(int(r)).gpu_type]]
            if fits:
                chosen[view.job_id] = int(fits[0])
                conf = table.config_of(int(fits[0]))
                free[conf.gpu_type] -= conf.num_gpus
            elif len(rows):
                break  # strict FIFO: the head of the queue waits, and so does everyone after
        return finish_round(table, views, chosen, previous, objective=float(len(chosen)),
                            timings=timings)
