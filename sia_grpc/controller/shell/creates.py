"""CreateJob: validated, admitted under the tenant's limits, and made durable in
group commits (concurrent creates share one transaction) before it returns."""

from __future__ import annotations

import asyncio
import uuid

import structlog

from sia_grpc.api import pb
from sia_grpc.api.errors import (
    ApiError,
    already_exists,
    invalid,
    unavailable,
)
from sia_grpc.api.validation import Resolved, resolve
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.machine.validation import admit_to_queue, check_job_id
from sia_grpc.controller.shell.base import ShellBase
from sia_grpc.controller.stores import StoreError
from sia_grpc.names import MAX_ID, scoped_job_id

log = structlog.get_logger("sia.controller")


class Creates(ShellBase):
    """A part of `Controller`: CreateJob (the module docstring)."""

    async def create_job(self, request: pb.CreateJobRequest,
                         bound_queues: tuple[str, ...] = ()) -> pb.Job:
        """`bound_queues`: the queues the caller's token may submit to (empty: any)."""
        resolved = resolve(request.spec)
        admit_to_queue(request.spec, self.state.queues, bound_queues)
        if request.job_id:
            check_job_id(request.job_id)
        if len(request.request_id) > 128:
            raise invalid("request_id", "at most 128 characters")
        tenant = request.spec.tenant
        # Exact under concurrency: jobs the state machine counts, plus creates on
        # their way to it (each leaves `_pending_creates` when its event is handled).
        self._limits.admit(tenant, self.state.active_by_tenant[tenant]
                           + self._pending_creates[tenant], self.clock.time())
        self._pending_creates[tenant] += 1
        try:
            return await self._create(request, resolved)
        except BaseException:
            self._pending_creates[tenant] -= 1
            raise

    async def _create(self, request: pb.CreateJobRequest, resolved: Resolved) -> pb.Job:
        name = request.job_id or f"{request.spec.name or 'job'}-{uuid.uuid4().hex[:8]}"
        if not request.job_id and len(name) > MAX_ID:
            name = f"job-{uuid.uuid4().hex[:12]}"
        # Ids and request ids are scoped by the tenant (names.scoped_job_id): another
        # tenant's `train-1` or request id is no conflict, and no error names it.
        tenant = request.spec.tenant
        job_id = scoped_job_id(tenant, name)
        request_id = scoped_job_id(tenant, request.request_id) if request.request_id else ""
        job = pb.Job(job_id=job_id, spec=request.spec, uid=uuid.uuid4().hex)
        now = self.clock.time()
        # As the state machine will have it, so the store, WatchJobs and the reply
        # agree with `sia ls` from the start (it profiles first).
        job.status.state, job.status.reason = sm.SUBMITTED
        job.status.create_time.FromNanoseconds(int(now * 1e9))
        job.status.update_time.CopyFrom(job.status.create_time)
        fut = asyncio.get_running_loop().create_future()
        # Group commit: concurrent creates share one transaction.
        self._creates.append((job, request_id, fut))
        if self._create_flush is None or self._create_flush.done():
            self._create_flush = asyncio.create_task(self._flush_creates())
        stored, created = await fut
        if created:
            # Durable now; the state machine takes it up in order (no need to wait).
            self.post(sm.JobCreated(now, stored, resolved))
            log.debug("job created", job_id=stored.job_id, application=stored.spec.application)
            return stored
        if request.job_id and stored.job_id != job_id:
            raise already_exists("request", request.request_id,
                                 f"request_id: already used for job {stored.job_id!r}, "
                                 f"not {job_id!r}")
        self._pending_creates[request.spec.tenant] -= 1  # a repeat: nothing new to count
        current = self.state.job(stored.job_id)
        return pb.Job.FromString(current.SerializeToString()) if current else stored

    async def _flush_creates(self) -> None:
        assert self._store is not None  # a create is served only with the store open
        while self._creates:
            batch, self._creates = self._creates, []
            try:
                results = await self._in_store(self._store.create_jobs,
                                               [(j, r) for j, r, _ in batch], term=self.term)
            except Exception as err:  # StoreError, or a bug: no create may hang
                if not isinstance(err, StoreError):
                    log.exception("create batch failed", jobs=len(batch))
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            self._notify_watchers()
            for (job, _, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, Exception):
                    fut.set_exception(_store_conflict(res, job.job_id))
                else:
                    stored, created = res
                    if created:  # (its JOB_SUBMITTED event was written with it)
                        self._told[stored.job_id] = (stored.status.state, stored.status.reason)
                    fut.set_result(res)


def _store_conflict(err: Exception, job_id: str) -> ApiError:
    from sia_grpc.controller.stores import JobExists, RequestConflict

    if isinstance(err, JobExists):
        return already_exists("job", job_id)
    if isinstance(err, RequestConflict):
        return already_exists("request", job_id, "request_id: already used for a different spec")
    return unavailable(str(err), "STORE_UNAVAILABLE")
