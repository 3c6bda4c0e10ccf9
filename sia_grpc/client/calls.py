"""Each SDK call described once, for both clients: what it sends, what its reply
becomes, and whether it may be sent again. Nothing here does I/O; the transports
(`transports.py`) send these, the clients (`sdk.py`) pick one per method.

A unary call is an `Rpc`. A stream is a cursor (`WatchCursor`, `RoundsCursor`): the
request that (re)opens it and which of its messages to pass on. `JobPages` (ListJobs)
and `Follow` (a job's versions until it ends) are the multi-call steps.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client.spec import spec_from_mapping
from sia_grpc.client.views import JobView, is_terminal

T = TypeVar("T")

JOBS, CLUSTER = "JobService", "ClusterService"  # the service: which stub sends it

# May a call be sent again after a failure that may have reached the controller?
READ = "read"  # yes: retried on UNAVAILABLE (with several addresses: until the deadline)
SAFE_WRITE = "safe write"  # with several addresses: a request_id, or a cancel, repeats safely
WRITE = "write"  # only where a standby refused it (NOT_LEADER: nothing was done)


def _reply(reply: Any) -> Any:
    return reply


@dataclass(frozen=True)
class Rpc(Generic[T]):
    """One unary call: `service`.`method`(`request`); `convert` makes the reply the result."""

    service: str
    method: str
    request: Any
    convert: Callable[[Any], T] = _reply
    kind: str = READ


def as_spec(spec: pb.JobSpec | Mapping[str, Any]) -> pb.JobSpec:
    """A JobSpec, or the mapping a spec file holds, as a JobSpec (SpecError naming the
    field when the mapping has a wrong one, as `sia submit` reports it)."""
    if isinstance(spec, pb.JobSpec):
        return spec
    if isinstance(spec, Mapping):
        return spec_from_mapping(spec)
    raise TypeError(f"spec: expected a pb.JobSpec or a mapping of its fields, "
                    f"got {type(spec).__name__}")


# -- unary calls ----------------------------------------------------------------------


def create_job(spec: pb.JobSpec | Mapping[str, Any], job_id: str,
               request_id: str | None) -> Rpc[pb.Job]:
    # A fresh request_id per submit makes a retry of this same call (by grpc, a proxy,
    # or the failover) harmless: the server returns the job it already created.
    request = pb.CreateJobRequest(spec=as_spec(spec), job_id=job_id,
                                  request_id=str(uuid.uuid4()) if request_id is None
                                  else request_id)
    return Rpc(JOBS, "CreateJob", request, kind=SAFE_WRITE)


def get_job(job_id: str) -> Rpc[JobView]:
    return Rpc(JOBS, "GetJob", pb.GetJobRequest(job_id=job_id), JobView)


def cancel_job(job_id: str) -> Rpc[JobView]:
    return Rpc(JOBS, "CancelJob", pb.CancelJobRequest(job_id=job_id), JobView, SAFE_WRITE)


def delete_job(job_id: str) -> Rpc[None]:
    return Rpc(JOBS, "DeleteJob", pb.DeleteJobRequest(job_id=job_id), lambda _: None, WRITE)


def get_cluster() -> Rpc[pb.Cluster]:
    return Rpc(CLUSTER, "GetCluster", pb.GetClusterRequest())


def list_rounds(limit: int) -> Rpc[list[pb.Round]]:
    return Rpc(CLUSTER, "ListRounds", pb.ListRoundsRequest(limit=limit),
               lambda resp: list(resp.rounds))


def list_queues() -> Rpc[pb.ListQueuesResponse]:
    return Rpc(CLUSTER, "ListQueues", pb.ListQueuesRequest())


def event_filter(job_id: str = "", node: str = "", queue: str = "",
                 kinds: Iterable[int] = ()) -> pb.EventFilter:
    """Which events (all of the given fields must match; `kinds`: any of them)."""
    return pb.EventFilter(job_id=job_id, node=node, queue=queue,
                          kinds=cast("list[pb.EventKind]", list(kinds)))


def list_events(where: pb.EventFilter, after_id: int, limit: int) -> Rpc[list[pb.Event]]:
    return Rpc(CLUSTER, "ListEvents", pb.ListEventsRequest(filter=where, after_id=after_id,
                                                           limit=limit),
               lambda resp: list(resp.events))


def drain_node(node: str, reason: str) -> Rpc[pb.Node]:
    return Rpc(CLUSTER, "DrainNode", pb.DrainNodeRequest(node=node, reason=reason), kind=WRITE)


def undrain_node(node: str) -> Rpc[pb.Node]:
    return Rpc(CLUSTER, "UndrainNode", pb.UndrainNodeRequest(node=node), kind=WRITE)


def forget_node(node: str) -> Rpc[pb.Node]:
    return Rpc(CLUSTER, "ForgetNode", pb.ForgetNodeRequest(node=node), kind=WRITE)


class JobPages:
    """ListJobs page by page: `next()` is the next page's call (None after the last),
    `jobs(page)` that page's jobs."""

    def __init__(self, states: Iterable[int], tenant: str, page_size: int) -> None:
        # (the numbers as they are: the stubs type the field as the enum, an int subtype)
        self.states = cast("list[pb.JobState]", list(states))
        self.tenant, self.page_size = tenant, page_size
        self.token: str | None = ""

    def next(self) -> Rpc[pb.ListJobsResponse] | None:
        if self.token is None:
            return None
        return Rpc(JOBS, "ListJobs", pb.ListJobsRequest(
            states=self.states, tenant=self.tenant, page_size=self.page_size,
            page_token=self.token))

    def jobs(self, page: pb.ListJobsResponse) -> list[JobView]:
        self.token = page.next_page_token or None
        return [JobView(job) for job in page.jobs]


# -- streams ----------------------------------------------------------------------------


class WatchCursor:
    """Where a WatchJobs stream stands, so that a broken one resumes without gaps or repeats.

    A reconnect asks for the changes after the last revision yielded, and drops any
    change at or before it that a server repeats. Snapshot events (since_revision=0)
    do not move the cursor: they are not in revision order, so a snapshot cut short
    is requested whole again; seeing a job's state twice is harmless, skipping the
    jobs not yet sent is not.
    """

    service, method = JOBS, "WatchJobs"

    def __init__(self, job_id: str, since_revision: int) -> None:
        self.job_id, self.since = job_id, since_revision

    def request(self) -> pb.WatchJobsRequest:
        return pb.WatchJobsRequest(job_id=self.job_id, since_revision=self.since)

    def accept(self, ev: pb.JobEvent) -> bool:
        """Record an event; False when it repeats one already yielded."""
        if ev.kind == pb.JobEvent.KIND_SNAPSHOT:
            return True
        if ev.revision <= self.since:
            return False
        self.since = ev.revision
        return True


class RoundsCursor:
    """WatchRounds: each round as the controller publishes it. A reopened stream sends
    only the rounds published after it opened (`rounds()` has the ones missed)."""

    service, method = CLUSTER, "WatchRounds"

    def request(self) -> pb.WatchRoundsRequest:
        return pb.WatchRoundsRequest()

    def accept(self, rnd: pb.Round) -> bool:
        return True


def newest_id(events: Sequence[pb.Event]) -> int:
    """The id of the newest of `events` (0: none): where a
    watch "from now" starts, so that reopening it after a break misses nothing."""
    return max((e.id for e in events), default=0)


class EventsCursor:
    """WatchEvents: the cluster's events after an id, then each new one. A reopened
    stream resumes after the last id yielded (none missed, none twice)."""

    service, method = CLUSTER, "WatchEvents"

    def __init__(self, where: pb.EventFilter, after_id: int) -> None:
        self.where, self.after = where, after_id

    def request(self) -> pb.WatchEventsRequest:
        return pb.WatchEventsRequest(filter=self.where, after_id=self.after)

    def accept(self, event: pb.Event) -> bool:
        if event.id <= self.after:
            return False
        self.after = event.id
        return True


Cursor = WatchCursor | RoundsCursor | EventsCursor  # a stream: the transports' `_stream` takes one


class Follow:
    """A job's versions until it ends (`JobHandle.watch`, `wait`): the current one
    (`start`, with GetJob's reply), then each newer one its watch events carry (`next`)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.job = pb.Job()

    @property
    def done(self) -> bool:
        return is_terminal(self.job)

    def start(self, job: JobView) -> JobView:
        self.job = job.proto
        return job

    def watch(self) -> WatchCursor:
        """The job's events after the version `start` saw."""
        return WatchCursor(self.job_id, self.job.revision)

    def next(self, ev: pb.JobEvent) -> JobView | None:
        """The job's next version from a watch event (None if the event adds nothing)."""
        if ev.job.job_id != self.job_id:
            return None
        if ev.kind == pb.JobEvent.KIND_DELETED:
            raise ApiError(grpc.StatusCode.NOT_FOUND,
                           f"job {self.job_id!r} was deleted before it finished",
                           reason="JOB_NOT_FOUND", metadata={"job": self.job_id})
        if ev.job.revision and ev.job.revision <= self.job.revision:
            return None
        self.job = ev.job
        return JobView(ev.job)

    def ended(self) -> ApiError:
        """The error for a watch that ended before the job did."""
        return ApiError(grpc.StatusCode.UNAVAILABLE,
                        f"the controller ended the watch before job {self.job_id!r} finished")
