"""How the SDK sends the calls `calls.py` describes: channels, credentials, retries,
failover and stream reconnects, once blocking (`SyncTransport`, over `grpc`) and once
for asyncio (`AsyncTransport`, over `grpc.aio`). The two differ only in the loop
(`await`, `async for`); which address to use and when to retry is `failover.py`'s.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import grpc

from sia_grpc.api import ClusterServiceStub, JobServiceStub
from sia_grpc.api.addresses import Resolve
from sia_grpc.api.addresses import resolve as dns_resolve
from sia_grpc.api.errors import ApiError
from sia_grpc.client.calls import CLUSTER, JOBS, READ, SAFE_WRITE, Cursor, Rpc
from sia_grpc.client.failover import Attempts, FailoverStub, Targets, rpc_code
from sia_grpc.security.tls import PemSource, channel_credentials

T = TypeVar("T")

DEFAULT_TARGET = os.environ.get("SIA_CONTROLLER") or "127.0.0.1:50051"


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
        return attempt < self.retries and rpc_code(err) == grpc.StatusCode.UNAVAILABLE

    def delay(self, attempt: int) -> float:
        return self.rand() * min(self.cap, self.base * 2 ** attempt)


class _Reconnects:
    """How long to wait before reopening a broken stream, or whether to give up: the
    retries of one call (`Attempts`) from the first failure after the last message, so
    the budget bounds consecutive failures, not a long stream's lifetime. With several
    addresses that is the client's timeout, as for a unary call: a stream rides through
    a failover (the old leader refusing, the standby saying NOT_LEADER until it leads),
    following the leader; with one, the backoff's retry count."""

    def __init__(self, targets: Targets, backoff: Backoff, timeout: float) -> None:
        self.targets, self.backoff, self.timeout = targets, backoff, timeout
        self.tries: Attempts | None = None

    def received(self) -> None:
        self.tries = None

    def retry(self, err: grpc.RpcError) -> float | None:
        """The delay before reconnecting after `err` (0: to the leader a standby
        named), or None to give up."""
        if self.tries is None:
            self.tries = Attempts(self.targets, self.backoff, self.timeout)
        return self.tries.retry(err)


# gRPC waits 1 s, then up to 120 s, between attempts to reconnect a channel, and fails
# every call on it meanwhile: after a controller restart, a client's reads (retried for
# about a second with one address) and its reopened watches failed with the controller
# back. A controller is one address and comes back in a second: try every 0.1-1 s.
_RECONNECT = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000))


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
    options: list[tuple[str, Any]] = [*_RECONNECT]
    if name:
        options.append(("grpc.default_authority", name))
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


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out waiting for the job to finish")
    return left


def _timed_out(err: grpc.RpcError, deadline: float | None) -> bool:
    # The 10 ms slack: grpc fires the deadline at (not after) the instant we computed.
    return (deadline is not None and rpc_code(err) == grpc.StatusCode.DEADLINE_EXCEEDED
            and time.monotonic() >= deadline - 0.01)


class _Transport:
    """What both transports hold: the addresses with their channels (`_targets`), the
    per-call metadata, the retry schedule. `_grpc` (grpc or grpc.aio) opens channels."""

    _grpc: Any
    _default_sleep: Callable[[float], Any]

    def __init__(self, target: str = DEFAULT_TARGET, *, timeout: float = 10.0,
                 read_retries: int = 4, channel: grpc.Channel | grpc.aio.Channel | None = None,
                 sleep: Callable[[float], Any] | None = None,
                 rand: Callable[[], float] = random.random, token: str | None = None,
                 ca: PemSource | None = None, cert: PemSource | None = None,
                 key: PemSource | None = None, resolve: Resolve = dns_resolve) -> None:
        self.target = target
        self._timeout = timeout
        self._backoff = Backoff(retries=read_retries, rand=rand)
        self._sleep = sleep or self._default_sleep
        self._owns_channel = channel is None
        secure, insecure = self._grpc.secure_channel, self._grpc.insecure_channel
        _, self._md = _channel_setup(target, token, ca, cert, key, secure, insecure, False)
        self._targets = Targets(target, lambda t, name: _channel_setup(
            t, token, ca, cert, key, secure, insecure, True, name)[0],
            channel, resolve=resolve)
        self._stubs = {JOBS: FailoverStub(self._targets, JobServiceStub),
                       CLUSTER: FailoverStub(self._targets, ClusterServiceStub)}
        self._closed = False

    def _method(self, service: str, method: str) -> Callable[..., Any]:
        """The stub method, sent each time to the address in use at that moment."""
        return getattr(self._stubs[service], method)

    def _attempts(self, rpc: Rpc[Any], deadline: float | None = None) -> Attempts:
        """The retries `rpc` allows: a read, always; a write, where sending it again is
        safe (a standby refused it, or a SAFE_WRITE with several addresses)."""
        idempotent = rpc.kind == READ or (rpc.kind == SAFE_WRITE and self._targets.several)
        return Attempts(self._targets, self._backoff, self._timeout, deadline,
                        idempotent=idempotent)


class SyncTransport(_Transport):
    """Blocking calls over `grpc` channels."""

    _grpc = grpc
    _default_sleep = staticmethod(time.sleep)

    def close(self) -> None:
        """Close the channels (if this client opened them); safe to call twice."""
        if not self._closed:
            self._closed = True
            if self._owns_channel:
                for channel in self._targets.channels():
                    channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, rpc: Rpc[T], deadline: float | None = None) -> T:
        """`rpc`'s converted reply, retried as its kind allows; `deadline` (monotonic):
        TimeoutError once it passes."""
        self._targets.refresh()  # how many addresses there are decides the retries
        tries, method = self._attempts(rpc, deadline), self._method(rpc.service, rpc.method)
        while True:
            try:
                return rpc.convert(method(rpc.request, timeout=tries.try_timeout(self._timeout),
                                          metadata=self._md))
            except grpc.RpcError as err:
                if _timed_out(err, deadline):
                    raise TimeoutError("timed out waiting for the job to finish") from err
                delay = tries.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            self._sleep(delay)
            self._targets.refresh()  # when every address has failed: resolve again

    def _stream(self, cursor: Cursor,
                deadline: float | None = None) -> Generator[Any, None, None]:
        """The stream's messages that `cursor` accepts, forever (or until the server ends
        it); one broken with UNAVAILABLE is reopened with `cursor.request()`."""
        method = self._method(cursor.service, cursor.method)
        reconnects = _Reconnects(self._targets, self._backoff, self._timeout)
        while True:
            self._targets.refresh()
            call = method(cursor.request(), timeout=_remaining(deadline), metadata=self._md)
            try:
                for message in call:
                    reconnects.received()
                    if cursor.accept(message):
                        yield message
                return
            except grpc.RpcError as err:
                if _timed_out(err, deadline):
                    raise TimeoutError("timed out waiting for the job to finish") from err
                delay = reconnects.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            finally:
                call.cancel()
            left = _remaining(deadline)
            self._sleep(delay if left is None else min(delay, left))


class AsyncTransport(_Transport):
    """The same calls over `grpc.aio` (a deadline is the caller's `asyncio.timeout`)."""

    _grpc = grpc.aio
    _default_sleep = staticmethod(asyncio.sleep)

    async def close(self) -> None:
        """Close the channels (if this client opened them); safe to call twice."""
        if not self._closed:
            self._closed = True
            if self._owns_channel:
                for channel in self._targets.channels():
                    await channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, rpc: Rpc[T]) -> T:
        await self._targets.refresh_async()
        tries, method = self._attempts(rpc), self._method(rpc.service, rpc.method)
        while True:
            try:
                return rpc.convert(await method(
                    rpc.request, timeout=tries.try_timeout(self._timeout), metadata=self._md))
            except grpc.RpcError as err:
                delay = tries.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            await self._sleep(delay)
            await self._targets.refresh_async()

    async def _stream(self, cursor: Cursor) -> AsyncGenerator[Any, None]:
        method = self._method(cursor.service, cursor.method)
        reconnects = _Reconnects(self._targets, self._backoff, self._timeout)
        while True:
            await self._targets.refresh_async()
            call = method(cursor.request(), metadata=self._md)
            try:
                async for message in call:
                    reconnects.received()
                    if cursor.accept(message):
                        yield message
                return
            except grpc.RpcError as err:
                delay = reconnects.retry(err)
                if delay is None:
                    raise ApiError.from_rpc_error(err) from err
            finally:
                call.cancel()
            await self._sleep(delay)
