"""Several controller addresses (a leader and its standby): which one a client talks
to now, and moving to the leader after a failed call.

A standby answers every call with UNAVAILABLE, reason NOT_LEADER, and metadata
`leader` naming the leader's advertised address: the client goes straight there,
without a pause. Any other UNAVAILABLE (the controller is down, or unreachable)
moves it to the next address, after the usual backoff. With several addresses a
call retries until its deadline (the client's `timeout`, or the wait's), since a
failover takes a lease's TTL; with one, as many times as `read_retries` says.

One host name with several DNS records counts as several addresses, one per
record (`api/addresses.py`: the parsing and resolving the node agent shares),
resolved before the first call and again once every address known has failed (a
replaced pod has a new IP). With TLS, a channel to a record's IP, or to the IP a standby
names as the leader, verifies the certificate against the host name the user gave
(the channel's `grpc.default_authority`), since the certificate names the DNS name
or Service, not the pods' IPs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc

from sia_grpc.api.addresses import Resolve, expand, host_name, normalize, resolve, split_targets
from sia_grpc.api.errors import ApiError

# (controller/shell/leadership.py's; not imported: the SDK is server-free)
NOT_LEADER = "NOT_LEADER"
# What sends a client with several addresses to the next one: the controller is down,
# unreachable or a standby; or it did not answer one try in time (paused, hung).
_MOVE_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Targets:
    """The addresses a client knows and the one it uses now, each with its channel,
    opened on first use by `make(address, name)` (`name`: the host name to verify
    the TLS certificate against, or None) or the one channel given. The given
    targets are resolved (`expand`) before the first call, and again after every
    address known has failed: `refresh()` (blocking) or `refresh_async()`."""

    def __init__(self, target: str, make: Callable[[str, str | None], Any] | None,
                 channel: Any = None, *, resolve: Resolve = resolve) -> None:
        self.given = [normalize(t) for t in split_targets(target)]
        self._resolve = resolve
        self.names: dict[str, str | None] = dict.fromkeys(self.given)
        self.addresses = list(self.names)
        self.current = self.addresses[0]
        self.stale = channel is None  # a channel given is used as it is
        self._make = make
        self._channels: dict[str, Any] = {}
        if channel is not None:
            self._channels[self.current] = channel

    @property
    def several(self) -> bool:
        return len(self.addresses) > 1

    def refresh(self) -> None:
        """Resolve the given targets if due (blocking: the sync client)."""
        if self.stale:
            self._update(expand(self.given, self._resolve))

    async def refresh_async(self) -> None:
        """As `refresh`, off the event loop (getaddrinfo blocks; this is what
        loop.getaddrinfo does too: the default executor)."""
        if self.stale:
            self._update(await asyncio.to_thread(expand, self.given, self._resolve))

    def _update(self, found: dict[str, str | None]) -> None:
        # Addresses a standby named are dropped: they failed too; the next standby
        # names the leader again. Channels to old addresses stay open until close().
        self.names, self.addresses, self.stale = found, list(found), False
        if self.current not in found:
            self.current = self.addresses[0]

    def channel(self) -> Any:
        found = self._channels.get(self.current)
        if found is None:
            # (no `make` only where a channel was given: tests that open none)
            assert self._make is not None, "Targets without make opens no channel"
            found = self._channels[self.current] = self._make(
                self.current, self.names.get(self.current))
        return found

    def channels(self) -> list[Any]:
        return list(self._channels.values())

    def moved(self, err: grpc.RpcError) -> bool:
        """After a failed call: to the leader a standby named (True: retry now), or,
        on another UNAVAILABLE or a try that timed out (a hung controller), to the
        next address (False: after the backoff; all of them failed: `stale`)."""
        if rpc_code(err) not in _MOVE_ON:
            return False
        info = ApiError.from_rpc_error(err)
        leader = info.metadata.get("leader", "") if info.reason == NOT_LEADER else ""
        if leader and leader != self.current:
            if leader not in self.addresses:  # e.g. a pod IP behind the name we were given
                self.addresses.append(leader)
                self.names[leader] = leader_name(leader, self.current,
                                                 self.names.get(self.current))
            self.current = leader
            return True
        if self.several:
            at = (self.addresses.index(self.current) + 1) % len(self.addresses)
            self.current, self.stale = self.addresses[at], at == 0
        return False

    def not_leader(self, err: grpc.RpcError) -> bool:
        """Whether `err` is a standby's refusal (nothing was done: safe to send again)."""
        return (rpc_code(err) == grpc.StatusCode.UNAVAILABLE
                and ApiError.from_rpc_error(err).reason == NOT_LEADER)


class FailoverStub:
    """A service stub on whichever address `targets` uses at the moment of each call
    (so a retry goes where the last failure moved it)."""

    def __init__(self, targets: Targets, stub: Callable[[Any], Any]) -> None:
        self._targets, self._stub = targets, stub
        self._stubs: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            channel = self._targets.channel()
            stub = self._stubs.get(id(channel))
            if stub is None:
                stub = self._stubs[id(channel)] = self._stub(channel)
            return getattr(stub, name)(*args, **kw)
        call.__name__ = name
        return call


def leader_name(leader: str, standby: str, name: str | None) -> str | None:
    """The TLS name for the `leader` address that the standby at `standby` (verified
    against `name`) named: an IP (a pod's, `advertise = $(POD_IP)`) is verified against
    the name we reached the standby by, the DNS name or Service the certificate names;
    a host name against itself (None)."""
    if host_name(leader) is not None:
        return None
    via = host_name(standby)
    return name or (via[0] if via else None)


def rpc_code(err: grpc.RpcError) -> grpc.StatusCode:
    """The status code of a failed call (UNKNOWN for an error that carries none)."""
    code = getattr(err, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


class Attempts:
    """One call's retries over several addresses: whether to try again after a
    failure, and how long to wait first (0 after a redirect to the leader)."""

    def __init__(self, targets: Targets, backoff: Any, timeout: float,
                 deadline: float | None = None, *, idempotent: bool = True) -> None:
        self.targets, self.backoff, self.idempotent = targets, backoff, idempotent
        # several addresses: the call's own deadline bounds the retries, not a count
        if deadline is None and targets.several:
            deadline = time.monotonic() + timeout
        self.deadline = deadline
        self.attempt = 0

    def try_timeout(self, timeout: float) -> float:
        """One try's timeout: the client's (half of it with several addresses, so a
        hung controller leaves time for the other), cut to what is left of the call's."""
        if self.deadline is None:
            return timeout
        per_try = timeout / 2 if self.targets.several else timeout
        return min(per_try, max(self.deadline - time.monotonic(), 0.001))

    def retry(self, err: grpc.RpcError) -> float | None:
        """The pause before the next try after `err`, or None to give up."""
        refused = self.targets.not_leader(err)
        redirected = self.targets.moved(err)
        attempt, self.attempt = self.attempt, self.attempt + 1
        if not (refused or self.idempotent):
            return None  # a write that may have happened: the caller decides
        if self.targets.several or refused:
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if rpc_code(err) not in _MOVE_ON or (left is not None and left <= 0):
                return None
            if left is None and attempt >= 2 * self.backoff.retries + 2:
                return None  # one address, refused again and again, and no deadline
            delay = 0.0 if redirected else self.backoff.delay(min(attempt, 8))
            return delay if left is None else min(delay, left)
        if not self.backoff.should_retry(err, attempt):
            return None
        return self.backoff.delay(attempt)
