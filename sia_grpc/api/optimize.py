"""`sia.v1.PolicyService.Optimize` as one synchronous call: what an
`OptimizeRequest` means (the cluster, the jobs with their goodput data, the previous
round's allocations, the policy and its params) and the reply Sia's policy gives it.
Nothing is kept between calls. The controller serves it over gRPC
(`controller/service/policy_service.py`, off its event loop); the Slurm bridge may call it in
its own process (`slurm/bridge.py`, `in_process_optimizer`): the same message and
answer either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from sia_grpc.api import pb
from sia_grpc.api.convert import (
    allocation_from_pb,
    cluster_from_pb,
    policy_job_from_pb,
    queue_of,
    queues_from_pb,
    round_to_pb,
    side_rows_to_pb,
    usage_to_pb,
)
from sia_grpc.api.errors import invalid
from sia_grpc.policy import POLICIES, SettingError
from sia_grpc.policy.cluster import GpuId
from sia_grpc.policy.params import make_policy
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import JobAllocation, Policy, PolicyJob

__all__ = ["DEFAULT_POLICY", "PolicyFactory", "optimize_request", "request_policy"]

DEFAULT_POLICY = "sia"

PolicyFactory = Callable[[], Policy]


def optimize_request(request: pb.OptimizeRequest,
                     policy: Policy | None = None) -> pb.OptimizeResponse:
    """The whole call, synchronously: validate and convert `request`, run the
    policy (`policy`, else the one `request` describes), convert the result.

    Raises `ApiError` (INVALID_ARGUMENT naming the field) for a malformed request.
    """
    t0 = time.perf_counter()
    if policy is None:
        policy = request_policy(request)
    cluster = cluster_from_pb(request.nodes, "nodes")
    queues = queues_from_pb(request.queues, "queues") if request.HasField("queues") else None
    jobs: list[PolicyJob] = []
    first: dict[str, int] = {}
    for i, j in enumerate(request.jobs):
        if j.job_id and j.job_id in first:
            raise invalid(f"jobs[{i}].job_id",
                          f"duplicate job id {j.job_id!r} (also jobs[{first[j.job_id]}])")
        first[j.job_id] = i
        jobs.append(policy_job_from_pb(j, f"jobs[{i}]"))
        queue_of(queues or QueueSet(), j.queue, j.priority, f"jobs[{i}]")
    previous: dict[str, JobAllocation] = {}
    owner: dict[GpuId, str] = {}  # the job holding each GPU in `previous`
    for i, p in enumerate(request.previous):
        here = f"previous[{i}]"
        if p.job_id not in first:
            raise invalid(f"{here}.job_id", f"unknown job {p.job_id!r}: not in jobs")
        if p.job_id in previous:
            raise invalid(f"{here}.job_id", f"a second allocation for job {p.job_id!r}")
        if not p.HasField("allocation"):
            raise invalid(f"{here}.allocation", "must be set")
        alloc = allocation_from_pb(p.allocation, cluster, f"{here}.allocation")
        for g in alloc.gpus:
            if g in owner:
                raise invalid(f"{here}.allocation.gpus",
                              f"GPU {g} is also held by job {owner[g]!r}")
            owner[g] = p.job_id
        previous[p.job_id] = alloc
    converted = time.perf_counter()
    # (no queues: called as before queues, so a policy without them still serves)
    extra: dict[str, Any] = {} if queues is None else {"queues": queues}
    result = policy.optimize(cluster, jobs, previous, **extra)
    t1 = time.perf_counter()
    decisions = round_to_pb(result, jobs)
    timings = {k: v * 1e3 for k, v in result.timings.items()}
    timings["convert"] = (converted - t0 + time.perf_counter() - t1) * 1e3
    return pb.OptimizeResponse(decisions=decisions, objective=float(result.objective),
                               timings_ms=timings, queues=usage_to_pb(result.queues),
                               rows=side_rows_to_pb(result.rows))


def request_policy(request: pb.OptimizeRequest,
                   policies: Mapping[str, PolicyFactory] = POLICIES) -> Policy:
    """The policy `request.policy` names with `request.params` over its defaults, on
    rounds of `request.round_duration_s` (0: its default), checked by the same
    layer as the controller's settings; INVALID_ARGUMENT on the field at fault."""
    try:
        return make_policy(request.policy or DEFAULT_POLICY, dict(request.params),
                           round_duration=request.round_duration_s or None,
                           policies=policies)
    except SettingError as err:
        if err.policy:  # a key of params
            raise invalid(f"params[{err.setting}]", err.problem) from None
        field = "round_duration_s" if err.setting == "round_duration" else err.setting
        raise invalid(field, err.problem) from None
