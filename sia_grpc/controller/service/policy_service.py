"""`sia.v1.PolicyService`: Sia's decision as one stateless call.

For orchestrators that run their own agents (a Kubernetes operator, a Slurm
plugin): the request carries the cluster, the jobs with their goodput data and
the previous round's allocations; the reply is every job's allocation. Nothing
is kept between calls, so any replica can answer any call.

The work (validation, conversion, the policy's ILP and placement) is CPU-bound
and runs off the event loop, in a thread by default or in the `Executor` given
(a process pool works too: the worker function and everything it returns are
picklable), so one long round never stalls other RPCs on the server. The call
itself, what a request means and its answer, is the contract's (`api/optimize.py`,
also what the Slurm bridge calls in its own process).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from concurrent.futures import Executor

import grpc
import structlog

from sia_grpc.api import PolicyServiceServicer, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.api.optimize import DEFAULT_POLICY, PolicyFactory, optimize_request, request_policy
from sia_grpc.policy import POLICIES
from sia_grpc.policy.types import Policy

__all__ = ["DEFAULT_TIMEOUT_S", "PolicyService"]

DEFAULT_TIMEOUT_S = 30.0


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
            internal = ApiError(grpc.StatusCode.INTERNAL, "internal error while optimizing",
                                reason="INTERNAL")
            await context.abort_with_status(internal.to_status())
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
