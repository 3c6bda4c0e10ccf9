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

The two clients differ only in call shapes (`await`, `async for`); request
building, the retry schedule, watch resumption and the terminal-state check are
shared module-level pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from sia_grpc.api import (
    TERMINAL_STATES,
    ClusterServiceStub,
    JobServiceStub,
    JobState,
    job_state,
    pb,
    state_name,
)
from sia_grpc.api.addresses import Resolve
from sia_grpc.api.addresses import resolve as dns_resolve
from sia_grpc.api.errors import ApiError
from sia_grpc.client.failover import Attempts, FailoverStub, Targets
from sia_grpc.client.spec import spec_from_mapping
from sia_grpc.security.tls import PemSource, channel_credentials

DEFAULT_TARGET = os.environ.get("SIA_CONTROLLER") or "127.0.0.1:50051"


def is_terminal(job: pb.Job | JobView) -> bool:
    """Whether the job has finished for good (SUCCEEDED, FAILED or CANCELLED)."""
    return job.status.state in TERMINAL_STATES


# -- what the calls return -----------------------------------------------------------


class _View:
    """Read-only access to a message's fields; `.proto` is the message itself."""

    __slots__ = ("proto",)

    def __init__(self, proto: Any) -> None:
        object.__setattr__(self, "proto", proto)

    def __getattr__(self, name: str) -> Any:
        if name == "proto":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.proto, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only; change .proto instead")

    def __eq__(self, other: object) -> bool:
        return self.proto == (other.proto if isinstance(other, _View) else other)

    __hash__ = None  # type: ignore[assignment]  (as the messages: mutable, unhashable)


class StatusView(_View):
    """A `pb.JobStatus` whose `state` is a `JobState` ("RUNNING" when printed)."""

    __slots__ = ()

    @property
    def state(self) -> JobState | int:
        return job_state(self.proto.state)

    def __repr__(self) -> str:
        return f"StatusView(state={state_name(self.proto.state)})"


class JobView(_View):
    """A `pb.Job` as the SDK returns it: every field of the message, with
    `status.state` (and the shortcut `state`) a `JobState`, so `print(job.state)`
    shows "RUNNING" and `job.state == pb.JOB_STATE_RUNNING` holds. Where a `pb.Job`
    itself is needed (a message field, `CopyFrom`), pass `job.proto`."""

    __slots__ = ()

    @property
    def status(self) -> StatusView:
        return StatusView(self.proto.status)

    @property
    def state(self) -> JobState | int:
        return job_state(self.proto.status.state)

    def __repr__(self) -> str:
        return f"JobView({self.proto.job_id!r}, state={state_name(self.proto.status.state)})"


def _as_spec(spec: pb.JobSpec | Mapping[str, Any]) -> pb.JobSpec:
    """A JobSpec, or the mapping a spec file holds, as a JobSpec (SpecError naming the
    field when the mapping has a wrong one, as `sia submit` reports it)."""
    if isinstance(spec, pb.JobSpec):
        return spec
    if isinstance(spec, Mapping):
        return spec_from_mapping(spec)
    raise TypeError(f"spec: expected a pb.JobSpec or a mapping of its fields, "
                    f"got {type(spec).__name__}")


# -- shared pieces -------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Which failures to retry and how long to wait: full jitter, U(0, min(cap, base*2^n)).

    Full jitter spreads the retries of many clients that failed together (a
    controller restart) instead of having them return in lockstep.
    """

    retries: int = 4
    base: float = 0.1
    cap: float = 2.0
    rand: Callable[[], float] = random.random

    def should_retry(self, err: grpc.RpcError, attempt: int) -> bool:
        """Retry attempt number `attempt` (0-based) after `err`?"""
        return attempt < self.retries and _code(err) == grpc.StatusCode.UNAVAILABLE

    def delay(self, attempt: int) -> float:
        return self.rand() * min(self.cap, self.base * 2 ** attempt)


def _channel_setup(target: str, token: str | None, ca: PemSource | None,
                   cert: PemSource | None, key: PemSource | None,
                   secure: Callable[..., Any], insecure: Callable[..., Any],
                   make: bool, name: str | None = None
                   ) -> tuple[Any, tuple[tuple[str, str], ...]]:
    """(channel or None, per-call metadata) for these credentials.

    With `ca`: TLS, the token as call credentials (composite). Without: plaintext,
    the token as metadata on each call. `name`: the host name the user gave for this
    address (an IP it resolved to, or a leader's): the channel's authority, which
    gRPC verifies the server's certificate against (`grpc.default_authority`; the
    `ssl_target_name_override` that does the same is documented for tests only).
    """
    options = [("grpc.default_authority", name)] if name else []
    token = (token or "").strip() or None
    if ca is None and (cert is not None or key is not None):
        raise ValueError("cert/key: a client certificate needs TLS; give ca= as well")
    if ca is not None:
        creds = channel_credentials(ca, cert, key)
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        return (secure(target, creds, options=options) if make else None), ()
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return (insecure(target, options=options) if make else None), metadata


def _code(err: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(err, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


def _create_request(spec: pb.JobSpec, job_id: str, request_id: str | None) -> Any:
    # A fresh request_id per submit makes a retry of this same call (by grpc or a
    # proxy) harmless: the server returns the job it already created.
    return pb.CreateJobRequest(spec=spec, job_id=job_id,
                               request_id=str(uuid.uuid4()) if request_id is None else request_id)


def _list_request(states: Iterable[int], tenant: str, page_size: int, token: str) -> Any:
    return pb.ListJobsRequest(states=list(states), tenant=tenant, page_size=page_size,
                              page_token=token)


class _Reconnects:
    """How long to wait before reopening a broken stream: `failures` counts reconnects
    since the last message, so the retry budget bounds consecutive failures, not a
    long stream's lifetime."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff, self.failures = backoff, 0

    def received(self) -> None:
        self.failures = 0

    def retry(self, err: grpc.RpcError) -> float | None:
        """The delay before reconnecting after `err`, or None to give up."""
        if not self.backoff.should_retry(err, self.failures):
            return None
        self.failures += 1
        return self.backoff.delay(self.failures - 1)


class _WatchCursor(_Reconnects):
    """Where a watch stands, so that a broken stream resumes without gaps or repeats.

    A reconnect asks for the changes after the last revision yielded, and drops any
    change at or before it that a server repeats. Snapshot events (since_revision=0)
    do not move the cursor: they are not in revision order, so a snapshot cut short
    is requested whole again; seeing a job's state twice is harmless, skipping the
    jobs not yet sent is not.
    """

    def __init__(self, job_id: str, since_revision: int, backoff: Backoff) -> None:
        super().__init__(backoff)
        self.job_id, self.since = job_id, since_revision

    def request(self) -> Any:
        return pb.WatchJobsRequest(job_id=self.job_id, since_revision=self.since)

    def accept(self, ev: Any) -> bool:
        """Record an event; False when it repeats one already yielded."""
        self.received()
        if ev.kind == pb.JobEvent.KIND_SNAPSHOT:
            return True
        if ev.revision <= self.since:
            return False
        self.since = ev.revision
        return True


def _next_version(job: Any, ev: Any) -> Any | None:
    """The followed job's next version from a watch event (None if the event adds nothing)."""
    if ev.job.job_id != job.job_id:
        return None
    if ev.kind == pb.JobEvent.KIND_DELETED:
        raise ApiError(grpc.StatusCode.NOT_FOUND,
                       f"job {job.job_id!r} was deleted before it finished",
                       reason="JOB_NOT_FOUND", metadata={"job": job.job_id})
    if ev.job.revision and ev.job.revision <= job.revision:
        return None
    return ev.job


def _watch_ended(job_id: str) -> ApiError:
    return ApiError(grpc.StatusCode.UNAVAILABLE,
                    f"the controller ended the watch before job {job_id!r} finished")


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out waiting for the job to finish")
    return left


def _timed_out(err: grpc.RpcError, deadline: float | None) -> bool:
    # The 10 ms slack: grpc fires the deadline at (not after) the instant we computed.
    return (deadline is not None and _code(err) == grpc.StatusCode.DEADLINE_EXCEEDED
            and time.monotonic() >= deadline - 0.01)


# -- blocking client -----------------------------------------------------------------


class SiaClient:
    """A blocking client for the controller's JobService and ClusterService."""

    def __init__(self, target: str = DEFAULT_TARGET, *, timeout: float = 10.0,
                 read_retries: int = 4, channel: grpc.Channel | None = None,
                 sleep: Callable[[float], None] | None = None,
                 rand: Callable[[], float] = random.random, token: str | None = None,
                 ca: PemSource | None = None, cert: PemSource | None = None,
                 key: PemSource | None = None, resolve: Resolve = dns_resolve) -> None:
        self.target = target
        self._timeout = timeout
        self._backoff = Backoff(retries=read_retries, rand=rand)
        self._sleep = sleep or time.sleep
        self._owns_channel = channel is None
        _, self._md = _channel_setup(target, token, ca, cert, key, grpc.secure_channel,
                                     grpc.insecure_channel, False)
        self._targets = Targets(target, lambda t, name: _channel_setup(
            t, token, ca, cert, key, grpc.secure_channel, grpc.insecure_channel, True, name)[0],
            channel, resolve=resolve)
        self._jobs = FailoverStub(self._targets, JobServiceStub)
        self._cluster = FailoverStub(self._targets, ClusterServiceStub)
        self._closed = False

    def close(self) -> None:
        """Close the channels (if this client opened them); safe to call twice."""
        if not self._closed:
            self._closed = True
            if self._owns_channel:
                for channel in self._targets.channels():
                    channel.close()

    def __enter__(self) -> SiaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls --

    def _write(self, method: Callable[..., Any], request: Any, *,
               idempotent: bool = False) -> Any:
        """A write: sent again only where that is safe (a standby refused it, or, with
        several addresses, `idempotent`)."""
        self._targets.refresh()  # how many addresses there are, first
        return self._read(method, request, idempotent=idempotent and self._targets.several)

    def _read(self, method: Callable[..., Any], request: Any,
              deadline: float | None = None, *, idempotent: bool = True) -> Any:
        self._targets.refresh()  # how many addresses there are decides the retries
        tries = Attempts(self._targets, self._backoff, self._timeout, deadline,
                         idempotent=idempotent)
        while True:
            try:
                return method(request, timeout=tries.try_timeout(self._timeout),
                              metadata=self._md)
            except grpc.RpcError as err:
                if _timed_out(err, deadline):
                    raise TimeoutError("timed out waiting for the job to finish") from err
                delay = tries.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            self._sleep(delay)
            self._targets.refresh()  # when every address has failed: resolve again

    def submit(self, spec: pb.JobSpec | Mapping[str, Any], *, job_id: str = "",
               request_id: str | None = None) -> JobHandle:
        """Create a job from a JobSpec or a spec file's mapping; `request_id` (a fresh
        uuid4 by default) makes a retry return it."""
        request = _create_request(_as_spec(spec), job_id, request_id)
        job = self._write(self._jobs.CreateJob, request, idempotent=True)
        return JobHandle(self, job.job_id)

    def get(self, job_id: str) -> JobView:
        return JobView(self._read(self._jobs.GetJob, pb.GetJobRequest(job_id=job_id)))

    def list(self, *, states: Iterable[int] = (), tenant: str = "",
             page_size: int = 100) -> Iterator[JobView]:
        """Every matching job, in creation order, fetching pages as it goes."""
        states, token = tuple(states), ""
        while True:
            page = self._read(self._jobs.ListJobs,
                              _list_request(states, tenant, page_size, token))
            yield from map(JobView, page.jobs)
            token = page.next_page_token
            if not token:
                return

    def cancel(self, job_id: str) -> JobView:
        return JobView(self._write(self._jobs.CancelJob, pb.CancelJobRequest(job_id=job_id),
                                   idempotent=True))

    def delete(self, job_id: str) -> None:
        self._write(self._jobs.DeleteJob, pb.DeleteJobRequest(job_id=job_id))

    def watch(self, *, job_id: str = "", since_revision: int = 0) -> Iterator[pb.JobEvent]:
        """Job events after `since_revision` (0: a snapshot of every job first), forever.

        A stream broken with UNAVAILABLE is reopened after the last revision yielded.
        """
        return self._events(job_id, since_revision, None)

    def _events(self, job_id: str, since_revision: int,
                deadline: float | None) -> Iterator[pb.JobEvent]:
        cursor = _WatchCursor(job_id, since_revision, self._backoff)
        while True:
            self._targets.refresh()
            call = self._jobs.WatchJobs(cursor.request(), timeout=_remaining(deadline),
                                        metadata=self._md)
            try:
                for ev in call:
                    if cursor.accept(ev):
                        yield ev
                return
            except grpc.RpcError as err:
                if _timed_out(err, deadline):
                    raise TimeoutError("timed out waiting for the job to finish") from err
                delay = 0.0 if self._targets.moved(err) else cursor.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            finally:
                call.cancel()
            left = _remaining(deadline)
            self._sleep(delay if left is None else min(delay, left))

    def _follow(self, job_id: str, deadline: float | None = None) -> Iterator[JobView]:
        job = self._read(self._jobs.GetJob, pb.GetJobRequest(job_id=job_id), deadline)
        yield JobView(job)
        if is_terminal(job):
            return
        events = self._events(job_id, job.revision, deadline)
        with contextlib.closing(events):
            for ev in events:
                nxt = _next_version(job, ev)
                if nxt is not None:
                    job = nxt
                    yield JobView(job)
                    if is_terminal(job):
                        return
        raise _watch_ended(job_id)

    def cluster(self) -> pb.Cluster:
        return self._read(self._cluster.GetCluster, pb.GetClusterRequest())

    def rounds(self, limit: int = 20) -> list[pb.Round]:
        """The most recent scheduling rounds."""
        return list(self._read(self._cluster.ListRounds,
                               pb.ListRoundsRequest(limit=limit)).rounds)

    def queues(self) -> pb.ListQueuesResponse:
        """Every queue: its guarantee, what it holds and borrows, its waiting jobs."""
        return self._read(self._cluster.ListQueues, pb.ListQueuesRequest())

    def drain(self, node: str, reason: str = "") -> pb.Node:
        """Admin: no new work on `node`; the next round moves its jobs elsewhere."""
        return self._write(self._cluster.DrainNode, pb.DrainNodeRequest(node=node, reason=reason))

    def undrain(self, node: str) -> pb.Node:
        """Admin: end `node`'s drain."""
        return self._write(self._cluster.UndrainNode, pb.UndrainNodeRequest(node=node))

    def forget_node(self, node: str) -> pb.Node:
        """Admin: remove a LOST node from the cluster (and its drain); returns its last
        record. Only a LOST node can be forgotten (FAILED_PRECONDITION otherwise)."""
        return self._write(self._cluster.ForgetNode, pb.ForgetNodeRequest(node=node))

    def handle(self, job_id: str) -> JobHandle:
        return JobHandle(self, job_id)


class JobHandle:
    """One job on a `SiaClient`: its current version, its progress, and waiting for it."""

    def __init__(self, client: SiaClient, job_id: str) -> None:
        self._client, self.job_id = client, job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"

    def job(self) -> JobView:
        return self._client.get(self.job_id)

    def status(self) -> StatusView:
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
        return self._client.cancel(self.job_id)


# -- asyncio client ------------------------------------------------------------------


class AsyncSiaClient:
    """The `SiaClient` API over `grpc.aio`: coroutines and async iterators."""

    def __init__(self, target: str = DEFAULT_TARGET, *, timeout: float = 10.0,
                 read_retries: int = 4, channel: grpc.aio.Channel | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 rand: Callable[[], float] = random.random, token: str | None = None,
                 ca: PemSource | None = None, cert: PemSource | None = None,
                 key: PemSource | None = None, resolve: Resolve = dns_resolve) -> None:
        self.target = target
        self._timeout = timeout
        self._backoff = Backoff(retries=read_retries, rand=rand)
        self._sleep = sleep or asyncio.sleep
        self._owns_channel = channel is None
        _, self._md = _channel_setup(target, token, ca, cert, key, grpc.aio.secure_channel,
                                     grpc.aio.insecure_channel, False)
        self._targets = Targets(target, lambda t, name: _channel_setup(
            t, token, ca, cert, key, grpc.aio.secure_channel, grpc.aio.insecure_channel,
            True, name)[0], channel, resolve=resolve)
        self._jobs = FailoverStub(self._targets, JobServiceStub)
        self._cluster = FailoverStub(self._targets, ClusterServiceStub)
        self._closed = False

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._owns_channel:
                for channel in self._targets.channels():
                    await channel.close()

    async def __aenter__(self) -> AsyncSiaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _write(self, method: Callable[..., Any], request: Any, *,
                     idempotent: bool = False) -> Any:
        """As SiaClient._write."""
        await self._targets.refresh_async()
        return await self._read(method, request,
                                idempotent=idempotent and self._targets.several)

    async def _read(self, method: Callable[..., Any], request: Any, *,
                    idempotent: bool = True) -> Any:
        await self._targets.refresh_async()
        tries = Attempts(self._targets, self._backoff, self._timeout, idempotent=idempotent)
        while True:
            try:
                return await method(request, timeout=tries.try_timeout(self._timeout),
                                    metadata=self._md)
            except grpc.RpcError as err:
                delay = tries.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            await self._sleep(delay)
            await self._targets.refresh_async()

    async def submit(self, spec: pb.JobSpec | Mapping[str, Any], *, job_id: str = "",
                     request_id: str | None = None) -> AsyncJobHandle:
        request = _create_request(_as_spec(spec), job_id, request_id)
        job = await self._write(self._jobs.CreateJob, request, idempotent=True)
        return AsyncJobHandle(self, job.job_id)

    async def get(self, job_id: str) -> JobView:
        return JobView(await self._read(self._jobs.GetJob, pb.GetJobRequest(job_id=job_id)))

    async def list(self, *, states: Iterable[int] = (), tenant: str = "",
                   page_size: int = 100) -> AsyncIterator[JobView]:
        states, token = tuple(states), ""
        while True:
            page = await self._read(self._jobs.ListJobs,
                                    _list_request(states, tenant, page_size, token))
            for job in page.jobs:
                yield JobView(job)
            token = page.next_page_token
            if not token:
                return

    async def cancel(self, job_id: str) -> JobView:
        return JobView(await self._write(self._jobs.CancelJob,
                                         pb.CancelJobRequest(job_id=job_id), idempotent=True))

    async def delete(self, job_id: str) -> None:
        await self._write(self._jobs.DeleteJob, pb.DeleteJobRequest(job_id=job_id))

    async def watch(self, *, job_id: str = "",
                    since_revision: int = 0) -> AsyncIterator[pb.JobEvent]:
        cursor = _WatchCursor(job_id, since_revision, self._backoff)
        while True:
            await self._targets.refresh_async()
            call = self._jobs.WatchJobs(cursor.request(), metadata=self._md)
            try:
                async for ev in call:
                    if cursor.accept(ev):
                        yield ev
                return
            except grpc.RpcError as err:
                delay = 0.0 if self._targets.moved(err) else cursor.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            finally:
                call.cancel()
            await self._sleep(delay)

    async def _follow(self, job_id: str) -> AsyncIterator[JobView]:
        job = await self._read(self._jobs.GetJob, pb.GetJobRequest(job_id=job_id))
        yield JobView(job)
        if is_terminal(job):
            return
        events = self.watch(job_id=job_id, since_revision=job.revision)
        async with contextlib.aclosing(events):
            async for ev in events:
                nxt = _next_version(job, ev)
                if nxt is not None:
                    job = nxt
                    yield JobView(job)
                    if is_terminal(job):
                        return
        raise _watch_ended(job_id)

    async def cluster(self) -> pb.Cluster:
        return await self._read(self._cluster.GetCluster, pb.GetClusterRequest())

    async def watch_rounds(self) -> AsyncIterator[pb.Round]:
        """Each scheduling round as the controller publishes it, forever. A stream broken
        with UNAVAILABLE (a restart, a failover) is reopened; rounds published while it
        was down are not sent again (`rounds()` has them)."""
        reconnects = _Reconnects(self._backoff)
        while True:
            await self._targets.refresh_async()
            call = self._cluster.WatchRounds(pb.WatchRoundsRequest(), metadata=self._md)
            try:
                async for rnd in call:
                    reconnects.received()
                    yield rnd
                return
            except grpc.RpcError as err:
                delay = 0.0 if self._targets.moved(err) else reconnects.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            finally:
                call.cancel()
            await self._sleep(delay)

    async def rounds(self, limit: int = 20) -> list[pb.Round]:
        resp = await self._read(self._cluster.ListRounds, pb.ListRoundsRequest(limit=limit))
        return list(resp.rounds)

    async def queues(self) -> pb.ListQueuesResponse:
        """Every queue: its guarantee, what it holds and borrows, its waiting jobs."""
        return await self._read(self._cluster.ListQueues, pb.ListQueuesRequest())

    async def drain(self, node: str, reason: str = "") -> pb.Node:
        """Admin: no new work on `node`; the next round moves its jobs elsewhere."""
        return await self._write(self._cluster.DrainNode,
                                 pb.DrainNodeRequest(node=node, reason=reason))

    async def undrain(self, node: str) -> pb.Node:
        """Admin: end `node`'s drain."""
        return await self._write(self._cluster.UndrainNode, pb.UndrainNodeRequest(node=node))

    async def forget_node(self, node: str) -> pb.Node:
        """Admin: remove a LOST node (and its drain); returns its last record."""
        return await self._write(self._cluster.ForgetNode, pb.ForgetNodeRequest(node=node))

    def handle(self, job_id: str) -> AsyncJobHandle:
        return AsyncJobHandle(self, job_id)


class AsyncJobHandle:
    """One job on an `AsyncSiaClient`."""

    def __init__(self, client: AsyncSiaClient, job_id: str) -> None:
        self._client, self.job_id = client, job_id

    def __repr__(self) -> str:
        return f"AsyncJobHandle({self.job_id!r})"

    async def job(self) -> JobView:
        return await self._client.get(self.job_id)

    async def status(self) -> StatusView:
        return (await self.job()).status

    def watch(self) -> AsyncIterator[JobView]:
        """The job's current version, then each new one until it reaches a terminal state."""
        return self._client._follow(self.job_id)

    async def wait(self, timeout: float | None = None) -> JobView:
        """The terminal job; TimeoutError if it has not finished within `timeout` seconds."""
        async with asyncio.timeout(timeout):
            versions = self._client._follow(self.job_id)
            async with contextlib.aclosing(versions):
                async for job in versions:
                    last = job
        return last

    async def cancel(self) -> JobView:
        return await self._client.cancel(self.job_id)
