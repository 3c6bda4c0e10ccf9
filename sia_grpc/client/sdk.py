"""Client SDK for the Sia controller: a blocking `SiaClient` and an asyncio `AsyncSiaClient`.

    with SiaClient("127.0.0.1:50051") as sia:
        job = sia.submit(load_spec("job.yaml")).wait(timeout=3600)
        job = sia.submit({"name": "resnet", "application": "cifar10",
                          "adaptivity": "adaptive"}).wait()   # a spec file's mapping
        print(job.status.state)                               # SUCCEEDED

Jobs come back as `JobView`s: the `pb.Job` with `status.state` (and `.state`) as a
`JobState`, which prints as its name and equals the `pb.JOB_STATE_*` number;
`.proto` is the message itself. Watch events (`watch()`) are the wire messages.

Security (docs/security.md): `token=` sends `authorization: Bearer <token>` on every
call; `ca=` (a PEM path or bytes) makes the channel TLS, verified against that CA,
and `cert=`/`key=` add a client certificate. Without `ca` the channel is plaintext
(the loopback dev controller) and the token travels as plain call metadata, since
gRPC refuses call credentials on an insecure channel.

Every failed call raises `ApiError` (never a raw `grpc.RpcError`). Reads retry on
UNAVAILABLE with full-jitter exponential backoff; CreateJob is not retried here
(its request_id makes a retry by the caller safe), nor are Cancel and Delete.

A controller pair: `SiaClient("a:50051,b:50051")` talks to the leader, following a
standby's NOT_LEADER answer straight to it and moving to the other address when one
is down; every call then retries within its deadline (`timeout`), CreateJob (its
request_id: never a second job) and Cancel included (`failover.py`). One DNS name
with several records is several addresses (resolved at the first call and after all
failed; `resolve=` replaces getaddrinfo in tests); with TLS, a record's or a
redirected IP is verified against the name given.

How it is built, so that the API is written once and the two clients cannot drift:

- `calls.py` describes each call once, with no I/O: a unary call is an `Rpc` (the
  stub method, the request built from the method's arguments, the conversion of the
  reply, and whether it may be sent again: read, safe write, write); a stream is a
  cursor (the request that (re)opens it, which messages pass on); ListJobs's pages
  (`JobPages`) and a job's versions until it ends (`Follow`) are small state machines.
- `transports.py` sends them: `SyncTransport` over `grpc`, `AsyncTransport` over
  `grpc.aio`, each with one `_unary` loop (retries, failover, `ApiError`) and one
  `_stream` loop (reconnects); they share the constructor (channels, credentials,
  `Backoff`). `failover.py` decides which address, and whether to try again.
- Here, the clients and the job handles: each public method is a line or two on its
  transport (pick the call, return its result), and differs from its twin only by
  `async`/`await` and `for`/`async for`; the async twins take the blocking ones'
  docstrings. `tests/client/test_client_api.py` checks that the twins have the same
  methods with the same parameters, async exactly where the blocking one does I/O.
- `views.py`: `JobView`, `StatusView`, `is_terminal`.

Generating both clients' methods from one table was not done: the methods would
lose their signatures and types for editors, `help()` and type checkers.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any, TypeVar

from sia_grpc.api import TERMINAL_STATES, pb
from sia_grpc.client import calls
from sia_grpc.client.transports import DEFAULT_TARGET, AsyncTransport, Backoff, SyncTransport
from sia_grpc.client.views import JobView, StatusView, is_terminal

__all__ = [
    "DEFAULT_TARGET", "TERMINAL_STATES", "AsyncJobHandle", "AsyncSiaClient", "Backoff",
    "JobHandle", "JobView", "SiaClient", "StatusView", "is_terminal",
]

_C = TypeVar("_C", bound=type)


def _same_docs(model: type) -> Callable[[_C], _C]:
    """A class decorator: each public method of the class without a docstring takes
    the one of `model`'s method of that name (the async twin is documented once)."""
    def copy(cls: _C) -> _C:
        for name, method in vars(cls).items():
            if not name.startswith("_") and callable(method) and method.__doc__ is None:
                method.__doc__ = getattr(model, name).__doc__
        return cls
    return copy


class SiaClient(SyncTransport):
    """A blocking client for the controller's JobService and ClusterService."""

    def submit(self, spec: pb.JobSpec | Mapping[str, Any], *, job_id: str = "",
               request_id: str | None = None) -> JobHandle:
        """Create a job from a JobSpec or a spec file's mapping; `request_id` (a fresh
        uuid4 by default) makes a retry return it."""
        return self.handle(self._unary(calls.create_job(spec, job_id, request_id)).job_id)

    def get(self, job_id: str) -> JobView:
        """The job's current version."""
        return self._unary(calls.get_job(job_id))

    def list(self, *, states: Iterable[int] = (), tenant: str = "",
             page_size: int = 100) -> Iterator[JobView]:
        """Every matching job, in creation order, fetching pages as it goes."""
        pages = calls.JobPages(states, tenant, page_size)
        while (page := pages.next()) is not None:
            yield from pages.jobs(self._unary(page))

    def cancel(self, job_id: str) -> JobView:
        """Cancel the job; its version after that."""
        return self._unary(calls.cancel_job(job_id))

    def delete(self, job_id: str) -> None:
        """Delete a finished job (FAILED_PRECONDITION while it is active)."""
        self._unary(calls.delete_job(job_id))

    def watch(self, *, job_id: str = "", since_revision: int = 0) -> Iterator[pb.JobEvent]:
        """Job events after `since_revision` (0: a snapshot of every job first), forever.

        A stream broken with UNAVAILABLE is reopened after the last revision yielded.
        """
        return self._stream(calls.WatchCursor(job_id, since_revision))

    def watch_rounds(self) -> Iterator[pb.Round]:
        """Each scheduling round as the controller publishes it, forever. A stream broken
        with UNAVAILABLE (a restart, a failover) is reopened; rounds published while it
        was down are not sent again (`rounds()` has them)."""
        return self._stream(calls.RoundsCursor())

    def cluster(self) -> pb.Cluster:
        """The nodes, their GPUs and jobs, and the GPUs by type."""
        return self._unary(calls.get_cluster())

    def rounds(self, limit: int = 20) -> builtins.list[pb.Round]:
        """The most recent scheduling rounds."""
        return self._unary(calls.list_rounds(limit))

    def queues(self) -> pb.ListQueuesResponse:
        """Every queue: its guarantee, what it holds and borrows, its waiting jobs."""
        return self._unary(calls.list_queues())

    def events(self, *, job_id: str = "", node: str = "", queue: str = "",
               kinds: Iterable[int] = (), after_id: int = 0,
               limit: int = 100) -> builtins.list[pb.Event]:
        """The newest `limit` events of the cluster's history after `after_id` that
        match, oldest first (a tenant sees its own jobs' events and none of others')."""
        return self._unary(calls.list_events(calls.event_filter(job_id, node, queue, kinds),
                                             after_id, limit))

    def watch_events(self, *, job_id: str = "", node: str = "", queue: str = "",
                     kinds: Iterable[int] = (), after_id: int = 0) -> Iterator[pb.Event]:
        """The events after `after_id` (0: from now: after the newest when called), then
        each new one, forever; a stream broken with UNAVAILABLE (a restart, a
        failover) resumes after the last one yielded, or after the newest at the call
        if none was yet (so nothing written meanwhile is missed)."""
        if not after_id:
            after_id = calls.newest_id(self.events(limit=1))
        return self._stream(calls.EventsCursor(calls.event_filter(job_id, node, queue, kinds),
                                               after_id))

    def drain(self, node: str, reason: str = "") -> pb.Node:
        """Admin: no new work on `node`; the next round moves its jobs elsewhere."""
        return self._unary(calls.drain_node(node, reason))

    def undrain(self, node: str) -> pb.Node:
        """Admin: end `node`'s drain."""
        return self._unary(calls.undrain_node(node))

    def forget_node(self, node: str) -> pb.Node:
        """Admin: remove a LOST node from the cluster (and its drain); returns its last
        record. Only a LOST node can be forgotten (FAILED_PRECONDITION otherwise)."""
        return self._unary(calls.forget_node(node))

    def handle(self, job_id: str) -> JobHandle:
        """The job `job_id` on this client (no call is made)."""
        return JobHandle(self, job_id)

    def _follow(self, job_id: str,
                deadline: float | None = None) -> Generator[JobView, None, None]:
        """The job's versions until a terminal one (`JobHandle.watch`, `.wait`)."""
        follow = calls.Follow(job_id)
        yield follow.start(self._unary(calls.get_job(job_id), deadline))
        if follow.done:
            return
        events = self._stream(follow.watch(), deadline)
        with contextlib.closing(events):
            for ev in events:
                if (job := follow.next(ev)) is not None:
                    yield job
                    if follow.done:
                        return
        raise follow.ended()


@_same_docs(SiaClient)
class AsyncSiaClient(AsyncTransport):
    """The `SiaClient` API over `grpc.aio`: coroutines and async iterators."""

    async def submit(self, spec: pb.JobSpec | Mapping[str, Any], *, job_id: str = "",
                     request_id: str | None = None) -> AsyncJobHandle:
        return self.handle((await self._unary(calls.create_job(spec, job_id, request_id))).job_id)

    async def get(self, job_id: str) -> JobView:
        return await self._unary(calls.get_job(job_id))

    async def list(self, *, states: Iterable[int] = (), tenant: str = "",
                   page_size: int = 100) -> AsyncIterator[JobView]:
        pages = calls.JobPages(states, tenant, page_size)
        while (page := pages.next()) is not None:
            for job in pages.jobs(await self._unary(page)):
                yield job

    async def cancel(self, job_id: str) -> JobView:
        return await self._unary(calls.cancel_job(job_id))

    async def delete(self, job_id: str) -> None:
        await self._unary(calls.delete_job(job_id))

    def watch(self, *, job_id: str = "", since_revision: int = 0) -> AsyncIterator[pb.JobEvent]:
        return self._stream(calls.WatchCursor(job_id, since_revision))

    def watch_rounds(self) -> AsyncIterator[pb.Round]:
        return self._stream(calls.RoundsCursor())

    async def cluster(self) -> pb.Cluster:
        return await self._unary(calls.get_cluster())

    async def rounds(self, limit: int = 20) -> builtins.list[pb.Round]:
        return await self._unary(calls.list_rounds(limit))

    async def queues(self) -> pb.ListQueuesResponse:
        return await self._unary(calls.list_queues())

    async def events(self, *, job_id: str = "", node: str = "", queue: str = "",
                     kinds: Iterable[int] = (), after_id: int = 0,
                     limit: int = 100) -> builtins.list[pb.Event]:
        return await self._unary(calls.list_events(
            calls.event_filter(job_id, node, queue, kinds), after_id, limit))

    async def watch_events(self, *, job_id: str = "", node: str = "", queue: str = "",
                           kinds: Iterable[int] = (),
                           after_id: int = 0) -> AsyncIterator[pb.Event]:
        if not after_id:  # (as the blocking client's: from now, pinned to an id)
            after_id = calls.newest_id(await self.events(limit=1))
        async for event in self._stream(calls.EventsCursor(
                calls.event_filter(job_id, node, queue, kinds), after_id)):
            yield event

    async def drain(self, node: str, reason: str = "") -> pb.Node:
        return await self._unary(calls.drain_node(node, reason))

    async def undrain(self, node: str) -> pb.Node:
        return await self._unary(calls.undrain_node(node))

    async def forget_node(self, node: str) -> pb.Node:
        return await self._unary(calls.forget_node(node))

    def handle(self, job_id: str) -> AsyncJobHandle:
        return AsyncJobHandle(self, job_id)

    async def _follow(self, job_id: str) -> AsyncGenerator[JobView, None]:
        """As SiaClient._follow; a deadline is the caller's (`asyncio.timeout`)."""
        follow = calls.Follow(job_id)
        yield follow.start(await self._unary(calls.get_job(job_id)))
        if follow.done:
            return
        events = self._stream(follow.watch())
        async with contextlib.aclosing(events):
            async for ev in events:
                if (job := follow.next(ev)) is not None:
                    yield job
                    if follow.done:
                        return
        raise follow.ended()


# -- one job on a client -------------------------------------------------------------


class _Handle:
    """What both handles share: the client, the job's id, the repr."""

    def __init__(self, client: Any, job_id: str) -> None:
        self._client, self.job_id = client, job_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.job_id!r})"


class JobHandle(_Handle):
    """One job on a `SiaClient`: its current version, its progress, and waiting for it."""

    _client: SiaClient

    def job(self) -> JobView:
        """The job's current version."""
        return self._client.get(self.job_id)

    def status(self) -> StatusView:
        """The job's current status."""
        return self.job().status

    def watch(self) -> Iterator[JobView]:
        """The job's current version, then each new one until it reaches a terminal state."""
        return self._client._follow(self.job_id)

    def wait(self, timeout: float | None = None) -> JobView:
        """The terminal job; TimeoutError if it has not finished within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        versions = self._client._follow(self.job_id, deadline)
        with contextlib.closing(versions):
            for job in versions:
                last = job
        return last

    def cancel(self) -> JobView:
        """Cancel the job; its version after that."""
        return self._client.cancel(self.job_id)


@_same_docs(JobHandle)
class AsyncJobHandle(_Handle):
    """One job on an `AsyncSiaClient`."""

    _client: AsyncSiaClient

    async def job(self) -> JobView:
        return await self._client.get(self.job_id)

    async def status(self) -> StatusView:
        return (await self.job()).status

    def watch(self) -> AsyncIterator[JobView]:
        return self._client._follow(self.job_id)

    async def wait(self, timeout: float | None = None) -> JobView:
        async with asyncio.timeout(timeout):
            versions = self._client._follow(self.job_id)
            async with contextlib.aclosing(versions):
                async for job in versions:
                    last = job
        return last

    async def cancel(self) -> JobView:
        return await self._client.cancel(self.job_id)
