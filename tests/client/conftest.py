"""A small in-memory stand-in for the controller, served by a real gRPC server on an
ephemeral port, so the client is tested over the wire.

It validates a little (min_gpus > max_gpus), honours request_id, pages ListJobs,
streams WatchJobs with store revisions and WatchRounds; tests inject outages (`fail`),
broken streams (`break_watch_after`) and state changes (`set_state`).
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from sia_grpc.api import (
    ClusterServiceServicer,
    JobServiceServicer,
    add_ClusterServiceServicer_to_server,
    add_JobServiceServicer_to_server,
    pb,
)
from sia_grpc.api.errors import already_exists, failed_precondition, invalid, not_found

TERMINAL = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)


class FakeController(JobServiceServicer, ClusterServiceServicer):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.jobs: dict[str, pb.Job] = {}
        self.log: list[pb.JobEvent] = []
        self.revision = 0
        self.created = 0
        self.by_request: dict[str, str] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.fail: collections.Counter[str] = collections.Counter()  # calls left to fail
        self.watch_requests: list[pb.WatchJobsRequest] = []
        self.break_watch_after: list[int] = []  # per stream: UNAVAILABLE after N events
        self.end_watch_after: int | None = None  # every stream ends cleanly after N events
        self.inclusive = False  # repeat the since_revision event, as a careless server might
        self.on_watch = None  # called as each WatchJobs stream opens: changes made now arrive
        self.cluster = pb.Cluster(
            policy="sia", round_duration_s=60,
            nodes=[pb.Node(name=f"n{i}", gpu_type="rtx", num_gpus=4, state=pb.NODE_STATE_READY,
                           gpus=[pb.GpuSlot(index=g, job_id="job-1" if i == 0 else "")
                                 for g in range(4)]) for i in range(2)],
            types=[pb.GpuTypeSummary(gpu_type="rtx", nodes=2, gpus=8, allocated=4)])
        # No queues configured: the default queue alone, the default class named so.
        self.queues = pb.ListQueuesResponse(
            queues=[pb.QueueStatus(spec=pb.QueueSpec(name="default"))],
            config=pb.QueueConfig(default_priority="default"))
        self.rounds = [pb.Round(round=r, trigger="timer", jobs=r, gpus_allocated=4,
                                solve_ms=1.5, total_ms=3.0) for r in range(1, 4)]
        for r in self.rounds:  # a minute apart, from 2026-01-05T09:30:00Z
            r.start_time.FromSeconds(1_767_605_400 + 60 * (r.round - 1))
            r.end_time.FromSeconds(1_767_605_401 + 60 * (r.round - 1))

    # -- test controls --

    def _commit(self, kind: int, job: pb.Job) -> pb.Job:
        with self.cond:
            self.revision += 1
            job.revision = self.revision
            if kind == pb.JobEvent.KIND_DELETED:
                self.jobs.pop(job.job_id)
            else:
                self.jobs[job.job_id] = job
            self.log.append(pb.JobEvent(kind=kind, revision=self.revision, job=job))
            self.cond.notify_all()
            return pb.Job.FromString(job.SerializeToString())

    def add(self, name: str = "j", *, created: float | None = None, job_id: str = "",
            **spec) -> pb.Job:
        """A queued job (`created`: its create time, seconds since the epoch)."""
        self.created += 1
        job = pb.Job(job_id=job_id or f"job-{self.created}", spec=pb.JobSpec(name=name, **spec),
                     status=pb.JobStatus(state=pb.JOB_STATE_QUEUED))
        if created is not None:
            job.status.create_time.FromNanoseconds(int(created * 1e9))
        return self._commit(pb.JobEvent.KIND_CREATED, job)

    def set_state(self, job_id: str, state: int, *, gpus: int = 0, **status) -> pb.Job:
        with self.cond:
            job = pb.Job()
            job.CopyFrom(self.jobs[job_id])
        job.status.state = state
        for key, value in status.items():
            setattr(job.status, key, value)
        if gpus:
            job.status.allocation.CopyFrom(pb.Allocation(
                gpu_type="rtx", num_gpus=gpus, num_nodes=1, batch_size=256,
                gpus=[pb.GpuRef(node="n0", index=i) for i in range(gpus)]))
        return self._commit(pb.JobEvent.KIND_UPDATED, job)

    def _enter(self, method: str, context) -> None:
        self.calls[method] += 1
        if self.fail[method] > 0:
            self.fail[method] -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected outage")

    def _job(self, job_id: str, context) -> pb.Job:
        job = self.jobs.get(job_id)
        if job is None:
            context.abort_with_status(not_found("job", job_id).to_status())
        return job

    # -- JobService --

    def CreateJob(self, request, context):
        self._enter("CreateJob", context)
        spec = request.spec
        if spec.max_gpus and spec.min_gpus > spec.max_gpus:
            context.abort_with_status(
                invalid("spec.max_gpus", "must be >= min_gpus").to_status())
        with self.cond:
            if request.request_id in self.by_request:
                return self.jobs[self.by_request[request.request_id]]
            self.created += 1
            job_id = request.job_id or f"job-{self.created}"
            if job_id in self.jobs:
                context.abort_with_status(already_exists("job", job_id).to_status())
            if request.request_id:
                self.by_request[request.request_id] = job_id
            return self._commit(pb.JobEvent.KIND_CREATED, pb.Job(
                job_id=job_id, spec=spec, status=pb.JobStatus(state=pb.JOB_STATE_QUEUED)))

    def GetJob(self, request, context):
        self._enter("GetJob", context)
        return self._job(request.job_id, context)

    def ListJobs(self, request, context):
        self._enter("ListJobs", context)
        size = request.page_size or 100
        start = int(request.page_token or 0)
        with self.cond:
            jobs = [j for j in self.jobs.values()
                    if (not request.states or j.status.state in request.states)
                    and (not request.tenant or j.spec.tenant == request.tenant)]
        page = jobs[start:start + size]
        more = start + size < len(jobs)
        return pb.ListJobsResponse(jobs=page, next_page_token=str(start + size) if more else "")

    def CancelJob(self, request, context):
        self._enter("CancelJob", context)
        job = self._job(request.job_id, context)
        if job.status.state in TERMINAL:
            context.abort_with_status(failed_precondition("job already finished").to_status())
        return self.set_state(request.job_id, pb.JOB_STATE_CANCELLED)

    def DeleteJob(self, request, context):
        self._enter("DeleteJob", context)
        job = self._job(request.job_id, context)
        if job.status.state not in TERMINAL:
            context.abort_with_status(failed_precondition("job is still active").to_status())
        self._commit(pb.JobEvent.KIND_DELETED, job)
        return pb.DeleteJobResponse()

    def WatchJobs(self, request, context):
        self._enter("WatchJobs", context)
        with self.cond:
            self.watch_requests.append(request)
            breaks = self.break_watch_after.pop(0) if self.break_watch_after else None
        if self.on_watch is not None:
            self.on_watch()
        for sent, ev in enumerate(self._events(request, context)):
            if breaks is not None and sent >= breaks:
                context.abort(grpc.StatusCode.UNAVAILABLE, "stream broken")
            yield ev
            if self.end_watch_after is not None and sent + 1 >= self.end_watch_after:
                return

    def _events(self, request, context):
        wanted = lambda job: not request.job_id or job.job_id == request.job_id  # noqa: E731
        since = request.since_revision
        if since == 0:
            with self.cond:
                snapshot = [j for j in self.jobs.values() if wanted(j)]
                since = self.revision
            for job in snapshot:
                yield pb.JobEvent(kind=pb.JobEvent.KIND_SNAPSHOT, revision=job.revision,
                                  job=job)
        elif self.inclusive:
            since -= 1
        while context.is_active():
            with self.cond:
                pending = [ev for ev in self.log if ev.revision > since]
                if not pending:
                    self.cond.wait(0.02)
                    continue
            since = pending[-1].revision
            yield from (ev for ev in pending if wanted(ev.job))

    # -- ClusterService --

    def GetCluster(self, request, context):
        self._enter("GetCluster", context)
        return self.cluster

    def ListRounds(self, request, context):
        self._enter("ListRounds", context)
        return pb.ListRoundsResponse(rounds=self.rounds[-(request.limit or 20):])

    def ListQueues(self, request, context):
        self._enter("ListQueues", context)
        return self.queues

    def WatchRounds(self, request, context):
        """The rounds so far, then none: the stream stays open until the client leaves."""
        self._enter("WatchRounds", context)
        yield from self.rounds
        while context.is_active():
            time.sleep(0.02)


@pytest.fixture
def fake():
    return FakeController()


@pytest.fixture
def target(fake):
    """The address of a running server backed by `fake`."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add_JobServiceServicer_to_server(fake, server)
    add_ClusterServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None).wait(5)


@pytest.fixture
def dead_target():
    """An address nothing listens on: a port bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"
