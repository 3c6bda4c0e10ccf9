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

from sia_grpc.policy.candidates import Candidates, candidate_configs, estimate, start_gpus
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.rounds import assemble, explain, finish_round, solve_and_finish
from sia_grpc.policy.sia import SiaConfig, SiaPolicy
from sia_grpc.policy.types import Adaptivity, JobAllocation, PolicyJob, RoundResult


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
class GavelPolicy:
    config: GavelConfig = GavelConfig()
    name: str = "gavel"

    @property
    def round_duration(self) -> float:
        return self.config.round_duration

    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation]) -> RoundResult:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        views = [rigid_view(cluster, j) for j in jobs]
        cands = [estimate(cluster, v, candidate_configs(cluster, v, None, scale_rules=False))
                 for v in views]
        timings["estimate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        values = [c.goodput / c.goodput.max() if len(c) else c.goodput for c in cands]
        problem, owner, start = assemble(cluster, views, cands, values, 0.0, previous)
        timings["build"] = time.perf_counter() - t0
        return solve_and_finish(cluster, views, cands, problem, owner, start, previous, timings,
                                time_limit=self.config.solver_time_limit,
                                rel_gap=self.config.rel_gap, solver=self.config.solver)


@dataclass(frozen=True)
class FifoConfig:
    round_duration: float = 60.0


@dataclass(frozen=True)
class FifoPolicy:
    config: FifoConfig = FifoConfig()
    name: str = "fifo"

    @property
    def round_duration(self) -> float:
        return self.config.round_duration

    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation]) -> RoundResult:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        free = dict(cluster.capacity)
        chosen: dict[str, tuple[Candidates, int]] = {}
        cands_all: list[Candidates] = []
        queued: list[tuple[PolicyJob, Candidates]] = []
        for job in sorted(jobs, key=lambda j: (j.submit_time, j.job_id)):
            cur = previous.get(job.job_id)
            view = rigid_view(cluster, job)
            confs = [cur.config] if cur else candidate_configs(cluster, view, None)
            cands = estimate(cluster, view, confs)
            cands_all.append(cands)
            if cur and len(cands):  # non-preemptive: running jobs keep their GPUs
                chosen[job.job_id] = (cands, 0)
                free[cur.config.gpu_type] -= cur.config.num_gpus
            else:
                queued.append((job, cands))
        blocked = False
        for job, cands in queued:
            if blocked:
                break
            order = np.argsort(-cands.goodput, kind="stable")
            fits = [k for k in order if cands.configs[k].num_gpus <= free[cands.configs[k].gpu_type]]
            if not fits:
                blocked = len(cands) > 0  # strict FIFO: the head of the queue waits
                continue
            k = int(fits[0])
            chosen[job.job_id] = (cands, k)
            free[cands.configs[k].gpu_type] -= cands.configs[k].num_gpus
        timings["estimate"] = time.perf_counter() - t0
        ordered = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
        return finish_round(cluster, chosen, previous, objective=float(len(chosen)),
                            timings=timings,
                            reasons=explain(ordered, cands_all, chosen, previous))
