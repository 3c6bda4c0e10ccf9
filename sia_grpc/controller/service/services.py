"""The gRPC services: each RPC checks who calls (`sia_grpc.security.auth`) and what
it asks, then calls the controller's public methods; typed errors become statuses."""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import grpc
import structlog

from sia_grpc import api
from sia_grpc.api import pb
from sia_grpc.api.errors import (
    ApiError,
    invalid,
    not_found,
    permission_denied,
    unavailable,
)
from sia_grpc.controller.machine.views import round_for
from sia_grpc.controller.stores import EventQuery, StoreError
from sia_grpc.names import MAX_ID, scoped_job_id
from sia_grpc.security import auth

if TYPE_CHECKING:
    from sia_grpc.controller.config import ControllerConfig
    from sia_grpc.controller.machine.state import ControllerState
    from sia_grpc.security.tokens import Principal

log = structlog.get_logger("sia.controller")


class ControllerApi(Protocol):
    """What the services call on the controller: its public methods
    (`server.Controller`, which makes the services: `server` imports this module,
    never the reverse)."""

    config: ControllerConfig
    state: ControllerState
    rounds: collections.deque[pb.Round]

    async def create_job(self, request: pb.CreateJobRequest,
                         bound_queues: tuple[str, ...] = ()) -> pb.Job: ...

    async def get_job(self, job_id: str) -> pb.Job: ...

    async def list_jobs(self, *, states: tuple[int, ...], tenant: str, page_size: int,
                        page_token: str) -> tuple[list[pb.Job], str]: ...

    async def cancel_job(self, job_id: str) -> pb.Job: ...

    async def delete_job(self, job_id: str) -> None: ...

    def watch_jobs(self, request: pb.WatchJobsRequest,
                   caller: Principal | None = None) -> AsyncIterator[pb.JobEvent]: ...

    async def set_drain(self, node: str, reason: str | None) -> pb.Node: ...

    async def forget_node(self, node: str) -> pb.Node: ...

    def watch_rounds(self) -> AsyncIterator[pb.Round]: ...

    async def list_events(self, where: EventQuery, after_id: int,
                          limit: int) -> list[pb.Event]: ...

    def watch_events(self, where: EventQuery, after_id: int) -> AsyncIterator[pb.Event]: ...

    def agent_stream(self, requests, context) -> AsyncIterator[pb.ControllerMessage]: ...


def rpc(method: Callable[..., Awaitable]) -> Callable[..., Awaitable]:
    """Typed errors become statuses; anything else is INTERNAL, logged, never a crash."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except ApiError as err:
            await context.abort_with_status(err.to_status())
        except StoreError as err:
            log.error("store error", error=str(err), rpc=method.__name__)
            await context.abort_with_status(unavailable(str(err), "STORE_UNAVAILABLE").to_status())
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("internal error", rpc=method.__name__)
            await context.abort_with_status(ApiError(
                grpc.StatusCode.INTERNAL, "internal error; the controller logged it",
                reason="INTERNAL").to_status())
    return wrapper


class JobService(api.JobServiceServicer):
    def __init__(self, controller: ControllerApi) -> None:
        self.c = controller

    # Authorization: the caller (auth.current(), set by the interceptor) sees only
    # its tenant's jobs unless it is an admin. Ids are scoped by tenant
    # (names.scoped_job_id): a caller names its own tenant's job by its name or its
    # full id, any job by its full id; another tenant's job answers NOT_FOUND, with
    # the same words as a job that does not exist, so job ids do not leak.

    async def _own_job(self, job_id: str) -> pb.Job:
        caller = auth.current()
        job: pb.Job | None
        try:
            job = await self.c.get_job(_scoped(job_id, caller.tenant))
        except ApiError as err:
            if err.code != grpc.StatusCode.NOT_FOUND:
                raise
            job = self._only_job_named(job_id) if caller.admin else None
            if job is None:
                raise not_found("job", job_id) from None
        if not caller.admin and job.spec.tenant != caller.tenant:
            raise not_found("job", job_id)
        return job

    def _only_job_named(self, name: str) -> pb.Job | None:
        """For an admin: the one job of any tenant with this name, if exactly one."""
        if "/" in name:
            return None
        found = [r.job for r in self.c.state.jobs.values()
                 if r.job.job_id.rpartition("/")[2] == name]
        return pb.Job.FromString(found[0].SerializeToString()) if len(found) == 1 else None

    @rpc
    async def CreateJob(self, request, context):
        caller = auth.current()
        spec = request.spec
        if spec.tenant and spec.tenant != caller.tenant and not caller.admin:
            raise permission_denied(
                f"spec.tenant: {spec.tenant!r} is not your tenant; this token creates jobs "
                f"for tenant {caller.tenant!r} (leave spec.tenant empty or set it to that)",
                "TENANT_MISMATCH")
        if not spec.tenant and caller.tenant:
            spec.tenant = caller.tenant  # stamped before validation and the store see it
        return await self.c.create_job(request, caller.queues)

    @rpc
    async def GetJob(self, request, context):
        return await self._own_job(request.job_id)

    @rpc
    async def ListJobs(self, request, context):
        if request.page_size > 1000:
            raise invalid("page_size", "at most 1000")
        caller = auth.current()
        tenant = request.tenant
        if not caller.admin:
            if tenant and tenant != caller.tenant:
                raise permission_denied(
                    f"tenant: {tenant!r} is not your tenant; this token lists only the jobs "
                    f"of tenant {caller.tenant!r}", "TENANT_MISMATCH")
            tenant = caller.tenant
        try:
            jobs, token = await self.c.list_jobs(
                states=tuple(request.states), tenant=tenant,
                page_size=request.page_size or 100, page_token=request.page_token)
        except ValueError as err:  # the store's word on a malformed token
            raise invalid("page_token", str(err).split(": ", 1)[-1]) from None
        return pb.ListJobsResponse(jobs=jobs, next_page_token=token)

    @rpc
    async def CancelJob(self, request, context):
        job = await self._own_job(request.job_id)
        return await self.c.cancel_job(job.job_id)

    @rpc
    async def DeleteJob(self, request, context):
        job = await self._own_job(request.job_id)
        await self.c.delete_job(job.job_id)
        return pb.DeleteJobResponse()

    async def WatchJobs(self, request, context):
        caller = auth.current()
        if request.job_id:
            request = pb.WatchJobsRequest.FromString(request.SerializeToString())
            request.job_id = _scoped(request.job_id, caller.tenant)
        try:
            async for ev in self.c.watch_jobs(request, caller):
                yield ev
        except ApiError as err:
            await context.abort_with_status(err.to_status())


class ClusterService(api.ClusterServiceServicer):
    def __init__(self, controller: ControllerApi) -> None:
        self.c = controller

    @rpc
    async def GetCluster(self, request, context):
        out = self.c.state.cluster_pb(_tenant_view())
        out.policy = self.c.config.policy
        out.round_duration_s = self.c.config.round_duration
        return out

    @rpc
    async def ListRounds(self, request, context):
        limit = request.limit or 20
        tenant = _tenant_view()
        return pb.ListRoundsResponse(rounds=[round_for(r, tenant)
                                             for r in list(self.c.rounds)[-limit:]])

    @rpc
    async def ListQueues(self, request, context):
        # Every caller sees every queue: names, guarantees and counts, no job ids.
        return self.c.state.queues_pb()

    @rpc
    async def DrainNode(self, request, context):
        _admin_only("DrainNode")
        if len(request.reason) > 256:
            raise invalid("reason", "at most 256 characters")
        return await self.c.set_drain(request.node, request.reason or "drained by an admin")

    @rpc
    async def UndrainNode(self, request, context):
        _admin_only("UndrainNode")
        return await self.c.set_drain(request.node, None)

    @rpc
    async def ForgetNode(self, request, context):
        _admin_only("ForgetNode")
        return await self.c.forget_node(request.node)

    async def WatchRounds(self, request, context):
        tenant = _tenant_view()
        try:
            async for rnd in self.c.watch_rounds():
                yield round_for(rnd, tenant)
        except ApiError as err:  # the controller stepped down: NOT_LEADER
            await context.abort_with_status(err.to_status())

    @rpc
    async def ListEvents(self, request, context):
        limit = request.limit or 100
        if limit > MAX_EVENTS:
            raise invalid("limit", f"at most {MAX_EVENTS}, got {limit}")
        return pb.ListEventsResponse(events=await self.c.list_events(
            _event_query(request.filter), request.after_id, limit))

    async def WatchEvents(self, request, context):
        try:
            where = _event_query(request.filter)
            async for event in self.c.watch_events(where, request.after_id):
                yield event
        except ApiError as err:  # a bad filter, a compacted id, or NOT_LEADER
            await context.abort_with_status(err.to_status())


MAX_EVENTS = 1000  # the most events one ListEvents answers


def _event_query(f: pb.EventFilter) -> EventQuery:
    """What a caller may see of the history, as it asked: its own tenant's jobs'
    events (and those about no job) unless it is an admin; INVALID_ARGUMENT naming
    the field for a malformed filter."""
    tenant = _tenant_view() or ""
    job_id = _scoped(f.job_id, tenant) if f.job_id and tenant else f.job_id
    for field, value in (("filter.job_id", job_id), ("filter.node", f.node),
                         ("filter.queue", f.queue)):
        if len(value) > 2 * MAX_ID + 1:
            raise invalid(field, f"at most {2 * MAX_ID + 1} characters")
    for kind in f.kinds:
        if kind not in pb.EventKind.values() or kind == pb.EVENT_KIND_UNSPECIFIED:
            raise invalid("filter.kinds", f"unknown event kind {kind}")
    return EventQuery(job_id=job_id, node=f.node, queue=f.queue, kinds=tuple(f.kinds),
                      tenant=tenant)


def _scoped(job_id: str, tenant: str) -> str:
    """The controller's id of the job a caller with `tenant` names: a full id
    (`tenant/name`) as it is, a bare name as the caller's own tenant's."""
    return job_id if "/" in job_id else scoped_job_id(tenant, job_id)


def _tenant_view() -> str | None:
    """The tenant whose view the caller gets (another's job ids hidden); None: an
    admin's, everything."""
    caller = auth.current()
    return None if caller.admin else caller.tenant


def _admin_only(what: str) -> None:
    caller = auth.current()
    if not caller.admin:
        raise permission_denied(f"{what}: only an admin may do this; this token is a "
                                f"{caller.role} of tenant {caller.tenant!r}", "ADMIN_ONLY")


class AgentService(api.AgentServiceServicer):
    def __init__(self, controller: ControllerApi) -> None:
        self.c = controller

    async def Connect(self, request_iterator, context):
        try:
            async for msg in self.c.agent_stream(request_iterator, context):
                yield msg
        except ApiError as err:
            await context.abort_with_status(err.to_status())
