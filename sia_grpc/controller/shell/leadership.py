"""Leader election among controllers that share a PostgreSQL store.

A controller on a shared store starts as a *standby*: its ports are bound, health
says NOT_SERVING, every sia.v1 call is refused with UNAVAILABLE (reason NOT_LEADER,
metadata `leader`: the leader's advertised address, so a client goes straight
there), and it loads nothing. Every `lease_ttl_s / 3` it tries to take the store's
lease (`JobStore.try_acquire`). Having won term T it fences the store at T (every
write transaction then checks, in the database, that the lease is still held at
T), ends the transactions another controller left open (`_end_deposed`), loads the
state, and leads: health SERVING, agents accepted, rounds run. It
renews every third of the TTL and steps down (`_step_down`: rounds stopped, agent
streams closed, calls refused, in-memory state dropped) when a renewal is refused,
or has not succeeded by its local deadline.

Why two controllers never act as leader at once (docs/architecture.md, "Leader
election"): a renewal (or the acquire) sent at local monotonic time `s` makes the
database set the expiry to its own `now + ttl`, read while executing, i.e. after
`s`; so the database's lease ends no earlier than `s + ttl`. This controller acts
as leader (`leading`: answers calls, sends to agents) only while its monotonic
clock reads less than `s + ttl - guard`, checked at each use, so even a process
paused past its lease (SIGSTOP, a long GC) stops acting the instant it resumes.
Another controller acquires only once the database's lease has expired. The two
intervals are disjoint by at least `guard` (a bound on the two clocks' drift over
one TTL, and on the time a step-down takes). What a deposed leader still has in
flight is stopped by fencing (its store writes are refused: `Fenced`) and by terms
(every message to an agent carries T; an agent refuses a lower term than the
highest it has seen).

Terms after a database restore: the restored lease row holds the term of the
backup's time, below terms led since, so the next leader's term may be one the
agents have seen (or below it), and they would refuse it. An agent's Register
carries the highest term it has seen (`highest_term`); a leader that finds it at or
above its own (`_check_agent_term`) stops leading, then, still holding the lease at
its term, raises the lease's term to that one as it releases it (`release(...,
raise_to=)`), and the next election takes a term above every one the agents know.

A SQLite store is not shared (the file lock keeps its controller single): that
controller leads at once, at term `SQLITE_TERM`, unfenced.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable

import grpc
import structlog

from sia_grpc.api.errors import ApiError, invalid, unavailable
from sia_grpc.controller.shell.base import ShellBase
from sia_grpc.controller.stores import MAX_TERM, StoreError

log = structlog.get_logger("sia.controller")

SQLITE_TERM = 1  # the term of a controller on an unshared (SQLite) store
NOT_LEADER = "NOT_LEADER"  # the ErrorInfo reason of a standby's refusal
_SIA_METHODS = "/sia.v1."  # the services a standby refuses (health, reflection stay open)


def not_leader(leader: str) -> ApiError:
    """A standby's answer: UNAVAILABLE naming the leader (metadata `leader`) if known."""
    where = f"the leader is {leader}" if leader else "no leader is known yet; retry shortly"
    return ApiError(grpc.StatusCode.UNAVAILABLE, f"this controller is a standby: {where}",
                    reason=NOT_LEADER, metadata={"leader": leader} if leader else {})


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses every sia.v1 call that starts while `leading()` is False (`not_leader`)."""

    def __init__(self, leading: Callable[[], bool], leader: Callable[[], str]) -> None:
        self._leading, self._leader = leading, leader

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if (handler is None or not handler_call_details.method.startswith(_SIA_METHODS)
                or self._leading()):
            return handler
        return _refusing(handler, not_leader(self._leader()))


def _refusing(handler: grpc.RpcMethodHandler, err: ApiError) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s kind that aborts every call with `err`."""
    async def refuse(request, context):
        await context.abort_with_status(err.to_status())

    for kind, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                       ("unary_stream", grpc.unary_stream_rpc_method_handler),
                       ("stream_stream", grpc.stream_stream_rpc_method_handler),
                       ("stream_unary", grpc.stream_unary_rpc_method_handler)):
        if getattr(handler, kind) is not None:
            return make(refuse, request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    return handler


class Leadership(ShellBase):
    """A part of `Controller`: the election (the module docstring). The controller
    provides `_take_office()` (load and serve, once fenced) and `_leave_office()`
    (stop, refuse, drop the state). Its attributes (`term`, `leader_address`, the
    lease, `offices`) are declared in `ShellBase`."""

    def _monotonic(self) -> float:
        return time.monotonic()

    @property
    def leading(self) -> bool:
        """Whether this controller acts as leader now: in office, and (on a shared
        store) before the local end of its lease, read at each use."""
        if not self._elected:
            return False
        return not self._shared or self._monotonic() < self._lease_end - self._guard

    @property
    def _guard(self) -> float:
        """How long before the database's earliest expiry the local lease ends."""
        return self.config.lease_ttl_s / 6

    @property
    def holder(self) -> str:
        """Who this controller is in the lease: host, pid and a random suffix."""
        if not hasattr(self, "_holder"):
            self._holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        return self._holder

    @property
    def advertised(self) -> str:
        """Where clients reach this controller: `advertise`, else the bound listen address."""
        return self.config.advertise or f"{self.config.listen.rpartition(':')[0]}:{self.port}"

    async def _lease(self, fn, *args, **kw):
        """A lease call, on a thread of its own: never queued behind the store's writes."""
        return await asyncio.to_thread(fn, *args, **kw)

    # -- the loop -------------------------------------------------------------------

    async def _elect(self) -> None:
        """Standby until the lease is won, leader until it is lost; and again."""
        assert self._store is not None  # (open from start on)
        ttl = self.config.lease_ttl_s
        while True:
            sent = self._monotonic()
            try:
                term = await self._lease(self._store.try_acquire, self.holder, ttl,
                                         address=self.advertised)
            except StoreError as err:
                log.warning("lease: cannot reach the store", error=str(err))
                term = None
            if term is None:
                await asyncio.sleep(await self._standby_wait(ttl))
                continue
            self._lease_end = sent + ttl
            why = await self._serve_term(term)
            await self._step_down(term, why)
            if self._outranked_by:  # only now: nothing acts at `term` any more
                await self._release_lease(term, raise_to=self._outranked_by)

    async def _standby_wait(self, ttl: float) -> float:
        """Learn who leads; how long to wait before trying again (just past the
        leader's expiry when that is sooner than a third of the TTL)."""
        assert self._store is not None  # (open from start on)
        try:
            lease = await self._lease(self._store.leader)
        except StoreError:
            return ttl / 3
        if lease is None:  # expired just now, nobody took it yet
            return min(0.05, ttl / 3)
        if lease.address != self.leader_address:
            log.info("standby: the leader", leader=lease.address, term=lease.term)
            self.leader_address = lease.address
        return max(0.01, min(ttl / 3, lease.expires_in_s + 0.01))

    async def _serve_term(self, term: int) -> str:
        """Lead in `term` until the lease is lost; why it was."""
        self.term = term
        self._outranked_by, self._resign = 0, asyncio.Event()
        log.warning("elected leader", term=term, holder=self.holder, advertise=self.advertised)
        holding = asyncio.create_task(self._hold(term), name="sia-lease")
        office = asyncio.create_task(self._enter_office(term), name="sia-take-office")
        await asyncio.wait((holding, office), return_when=asyncio.FIRST_COMPLETED)
        if not office.done():  # lost while loading
            office.cancel()
            await asyncio.gather(office, return_exceptions=True)
            return await holding
        if (exc := office.exception()) is not None:
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
            log.error("could not take office", term=term, error=repr(exc))
            await self._release_lease(term)
            return f"could not take office: {exc!r}"
        return await holding

    async def _enter_office(self, term: int) -> None:
        assert self._store is not None  # (open from start on)
        self._store.fence(term)  # before the first read: nothing unfenced is written
        await self._end_deposed(term)
        await self._take_office()
        self._elected = True
        self.leader_address = self.advertised
        self._offices().append((term, self._monotonic(), None))

    async def _end_deposed(self, term: int) -> None:
        """End the transactions a deposed leader left open (cut off from the database
        or stopped inside a write): their row locks would refuse every write of this
        term until the server saw that connection dead (`JobStore.end_deposed`)."""
        assert self._store is not None  # (open from start on)
        try:
            ended = await self._lease(self._store.end_deposed)
        except StoreError as err:  # (not allowed to, say): its locks hold until it ends
            log.warning("could not end another controller's open transactions",
                        term=term, error=str(err))
            return
        if ended:
            log.warning("ended another controller's open transactions", term=term,
                        transactions=ended)

    def _offices(self) -> collections.deque:
        if not hasattr(self, "offices"):
            self.offices = collections.deque(maxlen=100)
        return self.offices

    async def _hold(self, term: int) -> str:
        """Renew every third of the TTL; return why the lease is lost (refused, or
        not renewed by the local deadline)."""
        assert self._store is not None  # (open from start on)
        ttl = self.config.lease_ttl_s
        every, retry = ttl / 3, ttl / 12
        last = self._monotonic()
        while True:
            if await self._resigned(max(0.0, last + every - self._monotonic())):
                return f"an agent has seen term {self._outranked_by}, not below ours"
            sent = self._monotonic()
            left = self._lease_end - self._guard - sent
            if left <= 0:
                return "lease not renewed in time"
            try:
                held = await asyncio.wait_for(
                    self._lease(self._store.renew, self.holder, term, ttl), left)
            except TimeoutError:
                self._renew_failed("timeout")
                return f"lease renewal took longer than {left:.2f} s"
            except StoreError as err:  # transient (a dropped connection): again soon
                self._renew_failed("error")
                log.warning("lease renewal failed; retrying", term=term, error=str(err))
                last = sent - every + retry
                continue
            if not held:
                self._renew_failed("refused")
                return "lease lost (expired or taken)"
            self._lease_end = sent + ttl
            last = sent

    async def _resigned(self, within: float) -> bool:
        """Wait `within` seconds; True as soon as an agent has outranked this term."""
        assert self._resign is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._resign.wait(), within)
        return self._resign.is_set()

    def _check_agent_term(self, node: str, seen: int) -> None:
        """Refuse the Register of an agent that has seen term `seen`, if this
        controller must not lead it at its own term: `seen` is higher, or the same
        but not sent to this node by this controller (the store handed the term out
        twice: it went back, a restore). On a shared store this controller then
        steps down to take a higher term (`_outrank`); on SQLite, whose term is
        fixed, the operator is told what to do."""
        if seen >= MAX_TERM:  # (a raised term + 1 must fit the database's integers)
            raise invalid("register.highest_term", f"must be below {MAX_TERM}, got {seen}")
        term = self.term
        if seen < term or (seen == term and (not self._shared or node in self._greeted())):
            return
        if not self._shared:
            log.warning("an agent has seen a higher term than a SQLite controller's: refused",
                        node_id=node, seen=seen, term=term)
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this agent has seen term {seen}, from controllers on a shared (PostgreSQL) "
                f"store; this controller's store is SQLite, whose term is always {term}, "
                "which the agent would refuse: restart the agent (it forgets the terms it "
                "has seen) to move it to this controller, or check its --controller addresses",
                reason="TERM_AHEAD", metadata={"seen": str(seen), "term": str(term)})
        self._outrank(node, seen)
        raise ApiError(grpc.StatusCode.UNAVAILABLE,
                       f"this controller's term {term} is not above term {seen} this agent has "
                       "seen: it is stepping down so that a higher term is taken; retry shortly",
                       reason=NOT_LEADER)

    def _outrank(self, node: str, seen: int) -> None:
        """End this term because an agent has seen term `seen` (see `_elect`)."""
        if seen <= self._outranked_by:
            return  # (another agent said so already)
        log.warning(f"an agent has seen term {seen} >= ours ({self.term}): the store's term "
                    "went back (a restore?); stepping down to take a higher one",
                    node_id=node, seen=seen, term=self.term)
        self._outranked_by = seen
        if self._resign is not None:
            self._resign.set()

    def _greeted(self) -> set[str]:
        """The nodes this controller sent a Registered in its current term."""
        if getattr(self, "_greeted_term", None) != self.term:
            self._greeted_term, self._greeted_nodes = self.term, set()
        return self._greeted_nodes

    def _renew_failed(self, reason: str) -> None:
        """Count it (sia.lease.renew_failures): what precedes a step-down, and more often
        a database or network in trouble."""
        if self.telemetry is not None:
            self.telemetry.count_renew_failure(reason)

    async def _step_down(self, term: int, why: str) -> None:
        was = self._elected
        self._elected = False
        self.leader_address = ""  # not this one any more; the lease will say who
        if was:  # it acted as leader until now, or until its lease ran out if sooner
            _, since, _ = self._offices()[-1]
            until = min(self._monotonic(), self._lease_end - self._guard)
            self.offices[-1] = (term, since, until)
        log.warning("stepping down: standby", term=term, why=why)
        if was:
            await self._leave_office()
        # The store stays fenced at `term`: a write still in flight is refused.

    def _check_office(self) -> None:
        """At the end of a watch: NOT_LEADER if this controller runs on but stepped
        down (so the client moves to the leader); UNAVAILABLE if it closes (a watch
        is forever: the client reopens it after what it saw, on the controller that
        comes back or on the other of a pair, as a Kubernetes client re-watches when
        its API server goes away; an OK end read as "nothing more, ever")."""
        if self._shared and not self._elected and self.status.value == "running":
            raise not_leader(self.leader_address)
        raise unavailable("the controller is shutting down: reopen the watch after the "
                          "last event seen", "SHUTTING_DOWN")

    async def _release_lease(self, term: int, *, raise_to: int = 0) -> None:
        """Give the lease up (a clean stop): the standby need not wait for its expiry.
        `raise_to`: its term raised to that as well (an agent had seen it)."""
        assert self._store is not None  # (open from start on)
        try:
            released = await asyncio.wait_for(
                self._lease(self._store.release, self.holder, term, raise_to=raise_to),
                self.config.lease_ttl_s / 3)
        except (StoreError, TimeoutError) as err:
            # Its term stays: the next leader's may be refused too, and step down again.
            log.warning("lease not released; it expires", term=term, error=str(err),
                        raise_to=raise_to or None)
            return
        if not released and raise_to:
            log.warning("lease not held any more: its term not raised", term=term,
                        raise_to=raise_to)
        elif released and raise_to > term:
            log.warning("lease released, its term raised: the next leader's is above it",
                        term=term, raised_to=raise_to)
