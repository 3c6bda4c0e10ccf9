"""Property tests over whole policy rounds: whatever the cluster, jobs and last
round, every policy's answer is a valid allocation of real GPUs."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policy_sia import LinearModel

from sia_grpc.policy import Adaptivity, Cluster, Node, PolicyJob, make_policy

TYPES = ("a", "b", "c")


@st.composite
def clusters(draw) -> Cluster:
    nodes = []
    for t in draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)):
        for k in range(draw(st.integers(1, 4))):
            nodes.append(Node(f"{t}{k}", t, draw(st.sampled_from([1, 2, 4, 6, 8]))))
    return Cluster.of(nodes)


@st.composite
def job_lists(draw) -> list[PolicyJob]:
    jobs = []
    for i in range(draw(st.integers(1, 14))):
        speed = {t: draw(st.floats(0.5, 8.0)) for t in TYPES
                 if draw(st.booleans()) or t == "a"}
        kind = draw(st.sampled_from(list(Adaptivity)))
        pipeline = draw(st.sampled_from([1, 1, 1, 2]))
        jobs.append(PolicyJob(
            job_id=f"j{i}",
            model=LinearModel(speed, draw(st.floats(0.3, 1.0))),
            adaptivity=kind,
            min_gpus=1 if kind is Adaptivity.RIGID else draw(st.sampled_from([1, 1, 2])),
            pipeline_gpus=pipeline,
            batch_size=None if kind is Adaptivity.ADAPTIVE else 256,
            num_gpus=(pipeline * draw(st.sampled_from([1, 2, 3]))
                      if kind is Adaptivity.RIGID else None),
            allowed_types=draw(st.none() | st.frozensets(st.sampled_from(TYPES), min_size=1)),
            age=draw(st.floats(0.0, 10_000.0)),
            num_restarts=draw(st.integers(0, 5)),
            restart_cost=draw(st.sampled_from([0.0, 30.0, 250.0])),
            submit_time=float(i),
            # (progress and run time: what sia-plus's levers estimate the remaining run from)
            progress=draw(st.sampled_from([0.0, 0.01, 0.5, 0.99])),
            attained={"a": draw(st.sampled_from([0.0, 60.0, 3600.0]))},
        ))
    return jobs


# Policies as variants of their settings: the paper's Sia; sia-plus with every lever on.
VARIANTS = {
    "sia-paper": lambda: make_policy("sia", {"grow_into_idle": False}),
    "sia-plus-all": lambda: make_policy("sia-plus", {"payback": 2.0, "srpt": 0.5,
                                                     "start_scale": 4.0}),
}


def check_round(cluster: Cluster, jobs: list[PolicyJob], result) -> None:
    seen = set()
    used = dict.fromkeys(cluster.gpu_types, 0)
    by_id = {j.job_id: j for j in jobs}
    for job_id, a in result.allocations.items():
        job = by_id[job_id]
        assert len(a.gpus) == a.config.num_gpus
        assert not seen & set(a.gpus), "a GPU allocated twice"
        seen |= set(a.gpus)
        assert all(cluster.node(g.node).gpu_type == a.config.gpu_type for g in a.gpus)
        assert all(0 <= g.index < cluster.node(g.node).num_gpus for g in a.gpus)
        used[a.config.gpu_type] += a.config.num_gpus
        assert a.config.num_gpus >= job.min_gpus
        assert a.config.num_gpus % job.pipeline_gpus == 0
        if job.allowed_types is not None:
            assert a.config.gpu_type in job.allowed_types
        if job.adaptivity is not Adaptivity.ADAPTIVE:
            assert a.batch_size == job.batch_size
    assert all(used[t] <= cluster.capacity[t] for t in cluster.gpu_types)
    assert set(result.reasons) >= set(by_id)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), jobs=job_lists(),
       name=st.sampled_from(["sia", "pollux", "gavel", "fifo", "sia-paper", "sia-plus",
                             "sia-plus-all"]))
def test_rounds_are_always_valid(cluster, jobs, name):
    policy = VARIANTS[name]() if name in VARIANTS else make_policy(name)
    start_scale = getattr(policy.config, "start_scale", 1.0)
    scale_up = getattr(policy.config, "max_scale_up", 2.0)
    name = name.removesuffix("-paper").removesuffix("-all")
    previous = {}
    for _ in range(3):
        result = policy.optimize(cluster, jobs, previous)
        check_round(cluster, jobs, result)
        if name in ("sia", "pollux", "sia-plus"):
            # at most 2x per round (max_scale_up), new jobs at their minimum (sia-plus:
            # start_scale x it)
            for job in jobs:
                a, prev = result.allocations.get(job.job_id), previous.get(job.job_id)
                if a is not None:
                    # Per type, the first count at or above the job's minimum.
                    base = max(job.min_gpus, job.pipeline_gpus, job.num_gpus or 1)
                    start = cluster.first_count(base, gpu_type=a.config.gpu_type)
                    cap = max(start, int(base * start_scale)) if prev is None \
                        else max(int(scale_up * prev.config.num_gpus), start)
                    assert a.config.num_gpus <= cap
        previous = dict(result.allocations)
        jobs = [dataclasses.replace(j, age=j.age + 60.0) for j in jobs]
    assert np.isfinite(result.objective)
