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
- `GavelPolicy` — Gavel's max-sum-throughput objective, heterogeneity-aware,
  rigid jobs: each job runs its submitted GPU count and batch size; the policy
  picks a GPU type (or none) per job to maximise Σ normalised throughput
  (throughput on the type / the job's best type). Gavel's round-robin time-share
  mechanism over fractional allocations is not reproduced: each round is solved
  as an integer program instead (rounds are 360 s, as in the paper).
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

from sia_grpc.policy.candidates import (
    build_candidates,
    candidate_index,
    estimate,
    start_gpus,
)
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.rounds import finish_round, ilp_round
from sia_grpc.policy.sia import SiaConfig, SiaPolicy
from sia_grpc.policy.types import Adaptivity, JobAllocation, PolicyJob, RoundFromConfig, RoundResult


@dataclass(frozen=True)
class PolluxPolicy(SiaPolicy):
    config: SiaConfig = SiaConfig(p=-1.0)
    name: str = "pollux"

    def type_map(self, cluster: Cluster, job: PolicyJob,
                 current: JobAllocation | None) -> Mapping[str, str]:
        ref = current.config.gpu_type if current else max(
            cluster.gpu_types, key=lambda t: (cluster.capacity[t], t))
        return {t: ref for t in cluster.gpu_types}


@dataclass(frozen=True)
class GavelConfig:
    round_duration: float = 360.0
    solver_time_limit: float = 30.0
    rel_gap: float = 1e-4
    solver: str = "highs"


def rigid_view(cluster: Cluster, job: PolicyJob) -> PolicyJob:
    """The job as a rigid scheduler sees it: its submitted count (or its
    minimum) and, if it has one, its submitted batch size."""
    if job.adaptivity is Adaptivity.RIGID:
        return job
    n = job.num_gpus or start_gpus(cluster, job)
    if job.batch_size is None:  # no submitted batch: best batch at that count
        return dataclasses.replace(job, min_gpus=n, max_gpus=n)
    return dataclasses.replace(job, adaptivity=Adaptivity.RIGID, num_gpus=n)


@dataclass(frozen=True)
class GavelPolicy(RoundFromConfig):
    config: GavelConfig = GavelConfig()
    name: str = "gavel"

    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation]) -> RoundResult:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        views = [rigid_view(cluster, j) for j in jobs]
        table = build_candidates(cluster, views, previous, scale_rules=False)
        timings["estimate"] = time.perf_counter() - t0
        # Throughput normalised by the job's best type: Gavel's max-sum-throughput.
        best = table.per_job_reduce(np.maximum, table.goodput, 1.0)
        return ilp_round(table, views, previous, lambda _: table.goodput / best[table.job],
                         0.0, timings, time_limit=self.config.solver_time_limit,
                         rel_gap=self.config.rel_gap, solver=self.config.solver)


@dataclass(frozen=True)
class FifoConfig:
    round_duration: float = 60.0


@dataclass(frozen=True)
class FifoPolicy(RoundFromConfig):
    config: FifoConfig = FifoConfig()
    name: str = "fifo"

    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation]) -> RoundResult:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        order = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
        views = [rigid_view(cluster, j) for j in order]
        # Running jobs are offered only their current configuration.
        current = [previous[v.job_id].config if v.job_id in previous else None for v in views]
        offsets, index = candidate_index(cluster, views, [None] * len(views))
        pos = {c: k for k, c in enumerate(cluster.configs)}
        parts = [np.array([pos[c]]) if c in pos else index[offsets[i]:offsets[i + 1]]
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
