"""Which configurations a job may take this round, and what each is worth.

Shared by every policy: the scaling rules (Sia's start-at-minimum and at-most-2x
per round), the per-job bounds (allowed types, min/max GPUs, hybrid-parallel
replica size, rigid counts), and the goodput estimate of each candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.cluster import Cluster, Config
from sia_grpc.policy.types import Adaptivity, JobAllocation, PolicyJob


@dataclass(frozen=True, eq=False)
class Candidates:
    """A job's candidate configurations with the estimate for each (equal-length arrays)."""

    configs: tuple[Config, ...]
    replicas: np.ndarray  # data-parallel replicas per candidate
    goodput: np.ndarray  # samples/s × efficiency (throughput for fixed-batch jobs)
    batch_size: np.ndarray
    atomic_bsz: np.ndarray
    accum_steps: np.ndarray

    def __len__(self) -> int:
        return len(self.configs)


def start_gpus(cluster: Cluster, job: PolicyJob) -> int:
    """The GPU count a job that has not run yet starts at: its minimum, or the
    rigid count; rounded up to a count the configuration set has."""
    want = job.num_gpus if job.adaptivity is Adaptivity.RIGID else job.min_gpus
    want = max(want, job.pipeline_gpus)
    counts = sorted({c.num_gpus for c in cluster.configs if c.num_gpus >= want})
    for n in counts:
        if n % job.pipeline_gpus == 0 and (job.adaptivity is not Adaptivity.RIGID or n >= want):
            return n
    return want  # nothing fits; candidate_configs will return none


def candidate_configs(cluster: Cluster, job: PolicyJob, current: Config | None, *,
                      max_scale_up: float = 2.0, scale_rules: bool = True) -> list[Config]:
    """Configurations job may take: within its bounds and, with `scale_rules`,
    no more than `max_scale_up`× its current count (a job not running starts at
    its minimum). Rigid jobs take exactly their count (rounded up to the set)."""
    lo = max(job.min_gpus, job.pipeline_gpus)
    if job.adaptivity is Adaptivity.RIGID:
        lo = hi = start_gpus(cluster, job)
    else:
        hi = job.max_gpus if job.max_gpus is not None else cluster.total_gpus
        if scale_rules:
            cap = start_gpus(cluster, job) if current is None else max(
                int(current.num_gpus * max_scale_up), start_gpus(cluster, job))
            hi = min(hi, cap)
    allowed = job.allowed_types
    return [c for c in cluster.configs
            if lo <= c.num_gpus <= hi and c.num_gpus % job.pipeline_gpus == 0
            and (allowed is None or c.gpu_type in allowed)]


def estimate(cluster: Cluster, job: PolicyJob, configs: list[Config],
             type_map: Mapping[str, str] | None = None) -> Candidates:
    """Goodput of each candidate, from the job's model, one vectorised call per type.

    `type_map` lets a heterogeneity-unaware policy evaluate every type as if it
    were another (Pollux's view of the cluster). Candidates whose estimate is
    zero (type not profiled, batch infeasible) are dropped.
    """
    fixed = job.batch_size if job.adaptivity is not Adaptivity.ADAPTIVE else None
    by_type: dict[str, list[int]] = {}
    for k, c in enumerate(configs):
        by_type.setdefault(c.gpu_type, []).append(k)
    n = len(configs)
    out = {f: np.zeros(n) for f in ("goodput", "batch_size", "atomic_bsz", "accum_steps")}
    replicas = np.array([c.num_gpus // job.pipeline_gpus for c in configs], dtype=np.int64)
    nodes = np.array([c.num_nodes for c in configs], dtype=np.int64)
    if job.adaptivity is Adaptivity.RIGID:
        # A rigid count rounded up to the configuration set still runs its own count.
        replicas = np.minimum(replicas, job.num_gpus // job.pipeline_gpus)
    for gpu_type, idx in by_type.items():
        ix = np.asarray(idx)
        est = job.model.evaluate((type_map or {}).get(gpu_type, gpu_type), nodes[ix],
                                 replicas[ix], fixed_batch_size=fixed)
        for f in out:
            out[f][ix] = np.asarray(getattr(est, f), dtype=float)
    keep = np.flatnonzero(np.isfinite(out["goodput"]) & (out["goodput"] > 0))
    return Candidates(
        configs=tuple(configs[k] for k in keep),
        replicas=replicas[keep],
        goodput=out["goodput"][keep],
        batch_size=out["batch_size"][keep].astype(np.int64),
        atomic_bsz=out["atomic_bsz"][keep].astype(np.int64),
        accum_steps=out["accum_steps"][keep].astype(np.int64),
    )


def current_configs(previous: Mapping[str, JobAllocation]) -> dict[str, Config]:
    return {job_id: alloc.config for job_id, alloc in previous.items()}
