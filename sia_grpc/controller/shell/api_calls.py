"""What the gRPC services ask of the controller (`services.ControllerApi`): jobs read
live or from the store, cancelled and deleted through the state machine, watched
from the store's changelog; nodes drained and forgotten."""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Mapping
from typing import cast

import structlog

from sia_grpc.api import node_state_name, pb, state_name
from sia_grpc.api.errors import ApiError, failed_precondition, not_found
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.machine.validation import check_job_id
from sia_grpc.controller.shell.base import AgentStream, ShellBase, Status
from sia_grpc.controller.stores import Compacted, EventQuery, StoreError
from sia_grpc.security import auth
from sia_grpc.security.tokens import Principal

log = structlog.get_logger("sia.controller")


class ApiCalls(ShellBase):
    """The controller's public methods, as the services call them."""

    @property
    def serving(self) -> bool:
        return self.status is Status.RUNNING and self._elected

    @property
    def agents(self) -> Mapping[str, AgentStream]:
        """The agents connected now, by node id (a read-only view): who is on each
        stream (`instance_id`, `peer`) and when it was last heard (`heard`, on the
        controller's clock). GetCluster is the API's view of the nodes; this one is
        for the process that embeds the controller (demos, test harnesses)."""
        return types.MappingProxyType(self._agents)

    async def list_jobs(self, *, states: tuple[int, ...], tenant: str, page_size: int,
                        page_token: str) -> tuple[list[pb.Job], str]:
        """A page of jobs from the store, each in its live version (the store lags
        the live state by at most one write); ValueError for a malformed token."""
        assert self._store is not None  # (open from start on)
        jobs, token = await self._in_store(self._store.list_jobs, states=states, tenant=tenant,
                                           page_size=page_size, page_token=page_token)
        return [self.state.job(j.job_id) or j for j in jobs], token

    async def get_job(self, job_id: str) -> pb.Job:
        """The live version; a job accepted a moment ago may be only in the store."""
        assert self._store is not None  # (open from start on)
        job = self.state.job(job_id)
        if job is not None:
            return pb.Job.FromString(job.SerializeToString())
        stored = await self._in_store(self._store.get_job, job_id)
        if stored is None:
            raise not_found("job", job_id)
        return stored.job

    async def cancel_job(self, job_id: str) -> pb.Job:
        await self.get_job(job_id)
        await self.submit(sm.JobCancelRequested(self.clock.time(), job_id))
        return await self.get_job(job_id)

    async def delete_job(self, job_id: str) -> None:
        assert self._store is not None  # (open from start on)
        job = await self.get_job(job_id)
        if job.status.state not in sm.TERMINAL:
            raise failed_precondition(
                f"job {job_id!r} is {state_name(job.status.state)}; cancel it first",
                "JOB_NOT_FINISHED")
        await self._in_store(self._store.delete_job, job_id, term=self.term,
                             at=self.clock.time())
        self._told.pop(job_id, None)
        self._notify_watchers()
        await self.submit(sm.JobDeleted(self.clock.time(), job_id))

    async def watch_jobs(self, request: pb.WatchJobsRequest,
                         caller: Principal | None = None) -> AsyncIterator[pb.JobEvent]:
        """Job events; with a non-admin `caller`, only that tenant's jobs."""
        assert self._store is not None  # (open from start on)
        tenant = None if caller is None or caller.admin else caller.tenant

        def wanted(job: pb.Job) -> bool:
            return ((not request.job_id or job.job_id == request.job_id)
                    and (tenant is None or job.spec.tenant == tenant))

        rev = request.since_revision
        if rev == 0:
            rev = self._store.revision
            for stored in await self._in_store(self._store.all_jobs):
                if wanted(stored.job):
                    yield pb.JobEvent(kind=pb.JobEvent.KIND_SNAPSHOT, revision=stored.job.revision,
                                      job=stored.job)
        # Each watcher has its own event: cleared before it reads, set by every
        # commit, so a commit between its read and its wait is never missed.
        changed = asyncio.Event()
        self._job_watchers.add(changed)
        try:
            while self.serving:
                changed.clear()
                try:
                    events = await self._in_store(self._store.events_since, rev, 500)
                except StoreError as err:
                    raise failed_precondition(
                        f"since_revision {rev}: {err}; watch from 0 for a fresh snapshot",
                        "REVISION_COMPACTED") from None
                for revision, kind, job in events:
                    rev = revision
                    if wanted(job):
                        # (the store keeps the kind as its number)
                        yield pb.JobEvent(kind=cast("pb.JobEvent.Kind", kind),
                                          revision=revision, job=job)
                if not events:
                    await changed.wait()
            self._check_office()
        finally:
            self._job_watchers.discard(changed)

    # ------------------------------------------------------------ events

    async def list_events(self, where: EventQuery, after_id: int,
                          limit: int) -> list[pb.Event]:
        """The newest `limit` events after `after_id` that match, oldest first."""
        assert self._store is not None  # (open from start on)
        try:
            return await self._in_store(self._store.cluster_events, where, after_id, limit,
                                        newest=True)
        except Compacted as err:
            raise _compacted(after_id, err) from None

    async def watch_events(self, where: EventQuery, after_id: int) -> AsyncIterator[pb.Event]:
        """The events after `after_id` (0: from now on) that match, then each new one
        as its write commits, in id order, with none missed and none twice."""
        assert self._store is not None  # (open from start on)
        if after_id == 0:  # from now: after the newest written
            newest = await self._in_store(self._store.cluster_events, EventQuery(), 0, 1,
                                          newest=True)
            after_id = newest[0].id if newest else 0
        # Cleared before each read, set by every commit (as `watch_jobs`).
        changed = asyncio.Event()
        self._event_watchers.add(changed)
        try:
            while self.serving:
                changed.clear()
                try:
                    events = await self._in_store(self._store.cluster_events, where,
                                                  after_id, 500)
                except Compacted as err:
                    raise _compacted(after_id, err) from None
                for event in events:
                    after_id = event.id
                    yield event
                if len(events) < 500:  # (else: more are waiting)
                    await changed.wait()
            self._check_office()
        finally:
            self._event_watchers.discard(changed)

    # ------------------------------------------------------------ nodes

    async def set_drain(self, node: str, reason: str | None) -> pb.Node:
        """Drain `node` (durably, before the state machine acts) or end its drain."""
        assert self._store is not None  # (open from start on)
        check_job_id(node, "node")
        if node not in self.state.nodes:
            raise not_found("node", node)
        await self._in_store(self._store.set_drain, node, reason)
        await self.submit(sm.NodeDrainChanged(self.clock.time(), node, reason))
        log.warning("node drained" if reason is not None else "node drain ended",
                    node_id=node, reason=reason, by=auth.current().name)
        return self.state.node_pb(node)

    async def forget_node(self, node: str) -> pb.Node:
        """Remove a LOST node and its drain; its last record."""
        assert self._store is not None  # (open from start on)
        check_job_id(node, "node")
        if node not in self.state.nodes:
            raise not_found("node", node)
        last = self.state.node_pb(node)
        if last.state != pb.NODE_STATE_LOST:
            raise _not_lost(node, last.state)
        await self.submit(sm.NodeForgotten(self.clock.time(), node))
        if node not in self.state.drained:  # the stored drain follows the state machine's
            await self._in_store(self._store.set_drain, node, None)
        back = self.state.nodes.get(node)
        if back is not None:  # its agent registered again in the meantime
            raise _not_lost(node, back.state)
        log.warning("node forgotten", node_id=node, by=auth.current().name)
        return last



def _compacted(after_id: int, err: Exception) -> ApiError:
    return failed_precondition(f"after_id {after_id}: {err}; watch from 0 for new events",
                               "EVENTS_COMPACTED")


def _not_lost(node: str, state: int) -> ApiError:
    return failed_precondition(
        f"node {node!r} is {node_state_name(state)}; only a LOST node can be forgotten "
        "(stop its agent, and it is LOST after heartbeat_timeout)", "NODE_NOT_LOST")
