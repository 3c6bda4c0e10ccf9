"""Realistic policy inputs built from the shipped artifact data: jobs of the
paper's applications in the Helios (saturn) mix, and a loop that feeds a
policy its own previous round, as a scheduler would. Used by `sia demo` and
`sia bench policy`."""

from __future__ import annotations

import csv
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from sia_grpc.models.profiles import APPLICATIONS, job_model_from_artifact
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.types import JobAllocation, Policy, PolicyJob, RoundResult, warm_arg


def helios_mix() -> dict[str, float]:
    """Application shares over the shipped Helios (saturn) workloads."""
    counts: Counter[str] = Counter()
    root = resources.files("sia_grpc.data").joinpath("artifact/workloads/saturn")
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".csv"):
            with entry.open() as f:
                counts.update(row["application"] for row in csv.DictReader(f))
    total = sum(counts.values())
    return {app: n / total for app, n in sorted(counts.items())}


def sample_jobs(rng: np.random.Generator, n: int, cluster: Cluster) -> list[PolicyJob]:
    """`n` active jobs in the Helios mix, at random points of their training
    (which sets their gradient statistics), with random ages and restart counts."""
    mix = helios_mix()
    apps = rng.choice(list(mix), size=n, p=list(mix.values()))
    jobs = []
    for i, app in enumerate(apps):
        progress = float(rng.uniform(0.0, 0.9))
        age = float(rng.uniform(60.0, 4 * 3600.0))
        jobs.append(PolicyJob(
            job_id=f"{app}-{i}",
            model=job_model_from_artifact(str(app), gpu_types=cluster.gpu_types,
                                          progress=progress),
            age=age,
            num_restarts=int(rng.integers(0, 4)),
            restart_cost=APPLICATIONS[str(app)].restart_delay,
            submit_time=-age,
        ))
    return jobs


@dataclass
class Step:
    jobs: list[PolicyJob]
    previous: dict[str, JobAllocation]
    result: RoundResult
    seconds: float  # wall time of the policy call


def run_rounds(policy: Policy, cluster: Cluster, jobs: Sequence[PolicyJob],
               rounds: int) -> Iterator[Step]:
    """Call `policy` round after round, feeding back its allocation and its warm
    start (as the simulator and the controller do) and ageing the jobs by one round
    (restarted jobs count a restart)."""
    jobs = list(jobs)
    previous: dict[str, JobAllocation] = {}
    warm = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = policy.optimize(cluster, jobs, previous, **warm_arg(policy, warm))
        yield Step(jobs, previous, result, time.perf_counter() - t0)
        previous, warm = dict(result.allocations), result.warm
        jobs = [dataclasses.replace(j, age=j.age + policy.round_duration,
                                    num_restarts=j.num_restarts + (j.job_id in result.restarted))
                for j in jobs]
