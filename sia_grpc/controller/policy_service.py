"""`sia.v1.PolicyService`: Sia's decision as one stateless call.

For orchestrators that run their own agents (a Kubernetes operator, a Slurm
plugin): the request carries the cluster, the jobs with their goodput data and
the previous round's allocations; the reply is every job's allocation. Nothing
is kept between calls, so any replica can answer any call.

The work (validation, conversion, the policy's ILP and placement) is CPU-bound
and runs off the event loop, in a thread by default or in the `Executor` given
(a process pool works too: the worker function and everything it returns are
picklable), so one long round never stalls other RPCs on the server.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

import grpc
import structlog

from sia_grpc.api import PolicyServiceServicer, pb
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
from sia_grpc.api.errors import ApiError, invalid
from sia_grpc.policy import POLICIES, SettingError
from sia_grpc.policy.params import make_policy
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import JobAllocation, Policy

__all__ = ["DEFAULT_POLICY", "DEFAULT_TIMEOUT_S", "PolicyService", "optimize_request",
           "request_policy"]

DEFAULT_POLICY = "sia"
DEFAULT_TIMEOUT_S = 30.0

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
    jobs, first = [], {}
    for i, j in enumerate(request.jobs):
        if j.job_id and j.job_id in first:
            raise invalid(f"jobs[{i}].job_id",
                          f"duplicate job id {j.job_id!r} (also jobs[{first[j.job_id]}])")
        first[j.job_id] = i
        jobs.append(policy_job_from_pb(j, f"jobs[{i}]"))
        queue_of(queues or QueueSet(), j.queue, j.priority, f"jobs[{i}]")
    previous: dict[str, JobAllocation] = {}
    owner: dict = {}  # GpuId -> job holding it in `previous`
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
    result = policy.optimize(cluster, jobs, previous,
                             **({} if queues is None else {"queues": queues}))
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


def _in_worker(request: pb.OptimizeRequest, policy: Policy) -> tuple:
    """`optimize_request` for an executor: ("ok", response) or ("error", ApiError
    fields). ApiError itself does not survive pickling (a process pool); other
    exceptions do, with their remote traceback."""
    try:
        return "ok", optimize_request(request, policy)
    except ApiError as e:
        return "error", (e.code, e.message, e.field, e.reason, dict(e.metadata))


class PolicyService(PolicyServiceServicer):
    """The stateless policy service for `grpc.aio` servers.

    `executor`: where the work runs (default: `asyncio.to_thread`). `timeout_s`: the
    longest one call may take, queueing in the executor included; past it the call
    fails with DEADLINE_EXCEEDED (reason POLICY_TIMEOUT) rather than UNAVAILABLE,
    because the same request would time out again and must not be retried blindly.
    A thread cannot be stopped: the abandoned round finishes in the background
    (the ILP solver has its own time limit) and its result is discarded.
    `policies`: name -> the policy classes offered ("" means "sia"); each is built
    from the request's params and round length (`request_policy`).
    """

    def __init__(self, *, executor: Executor | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 policies: Mapping[str, PolicyFactory] = POLICIES) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be positive, got {timeout_s!r}")
        self._executor = executor
        self._timeout_s = float(timeout_s)
        self._policies = dict(policies)

    async def Optimize(self, request: pb.OptimizeRequest,
                       context: grpc.aio.ServicerContext) -> pb.OptimizeResponse:
        try:
            return await self._optimize(request)
        except ApiError as err:
            await context.abort_with_status(err.to_status())
        except Exception:
            structlog.get_logger(__name__).exception(
                "policy_service.optimize_failed", policy=request.policy or DEFAULT_POLICY,
                jobs=len(request.jobs), nodes=len(request.nodes))
            err = ApiError(grpc.StatusCode.INTERNAL, "internal error while optimizing",
                           reason="INTERNAL")
            await context.abort_with_status(err.to_status())
        raise AssertionError("unreachable: abort_with_status raises")  # pragma: no cover

    async def _optimize(self, request: pb.OptimizeRequest) -> pb.OptimizeResponse:
        policy = request_policy(request, self._policies)
        call = functools.partial(_in_worker, request, policy)
        work = (asyncio.to_thread(call) if self._executor is None
                else asyncio.get_running_loop().run_in_executor(self._executor, call))
        try:
            kind, value = await asyncio.wait_for(work, self._timeout_s)
        except TimeoutError:
            structlog.get_logger(__name__).warning(
                "policy_service.timeout", timeout_s=self._timeout_s, jobs=len(request.jobs))
            raise ApiError(grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"the policy did not decide within {self._timeout_s:g} s",
                           reason="POLICY_TIMEOUT",
                           metadata={"timeout_s": f"{self._timeout_s:g}"}) from None
        if kind == "error":
            raise ApiError(*value)
        return value
