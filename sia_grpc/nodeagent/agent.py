"""The node agent: one bidirectional stream to the controller, directives applied
at most once, workers that outlive a lost connection.

Stream: Register first (inventory, version, the jobs still running here), then
Heartbeats every `Registered.heartbeat_interval_s`, Telemetry every
`telemetry_interval_s`, and DirectiveAck / JobExit as things happen. When the
stream fails the agent reconnects with full-jitter exponential backoff; workers
keep running meanwhile and the next Register lists them.

`NodeAgent` (here) holds the stream and the agent's life; its collaborators hold
the rest. Everything the agent sends goes through one FIFO outbox that outlives a
stream (outbox.py). Directives are applied one at a time, in arrival order, by one
task that also outlives streams, at most once (directives.py); profiling passes run
beside them (profiling.py). targets.py says which controller the next stream goes
to; config.py holds `AgentConfig`.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import random
import types
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import grpc
import structlog

from sia_grpc.api import AgentServiceStub, pb
from sia_grpc.api.addresses import Resolve
from sia_grpc.api.addresses import resolve as dns_resolve
from sia_grpc.clock import Clock, MonotonicClock
from sia_grpc.nodeagent.backend import WorkerBackend
from sia_grpc.nodeagent.config import (
    AgentConfig,
    AgentConfigError,
    full_jitter_backoff,
    issue_command,
)
from sia_grpc.nodeagent.directives import Directives
from sia_grpc.nodeagent.outbox import Outbox
from sia_grpc.nodeagent.profiling import Profiler
from sia_grpc.nodeagent.targets import ControllerTargets
from sia_grpc.nodeagent.tasks import cancel
from sia_grpc.security.tls import probe_tls

__all__ = ["AgentStatus", "NodeAgent"]

TERMS_KEPT = 10_000  # received messages' terms kept in NodeAgent.terms


class AgentStatus(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"  # opening a stream, waiting for Registered
    REGISTERED = "registered"  # stream up
    BACKOFF = "backoff"  # waiting to reconnect
    CLOSING = "closing"
    CLOSED = "closed"


class _ProtocolError(Exception):
    pass


class NodeAgent:
    """The daemon on one node. `async with NodeAgent(config) as agent: await agent.run()`.

    `backend` defaults to modeled workers (`ModeledBackend`) on `clock`;
    `backoff(attempt) -> seconds` defaults to `full_jitter_backoff` with the
    config's base and cap; `resolve(host, port)` to getaddrinfo (tests inject one).
    """

    def __init__(self, config: AgentConfig, backend: WorkerBackend | None = None, *,
                 clock: Clock | None = None,
                 backoff: Callable[[int], float] | None = None,
                 resolve: Resolve = dns_resolve) -> None:
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        if backend is None:
            from sia_grpc.nodeagent.modeled import ModeledBackend

            backend = ModeledBackend(config.gpu_type, time_scale=config.time_scale,
                                     clock=self.clock, node_id=config.node_id)
        self.backend = backend
        self._backoff = backoff or functools.partial(
            full_jitter_backoff, base=config.backoff_base_s, cap=config.backoff_cap_s,
            rng=random.Random())
        self.status = AgentStatus.INIT
        self.registrations = 0  # streams that got as far as Registered
        # Sent in every Register: the controller tells this agent's reconnects from a
        # second agent with the same node id (which it refuses while this one lives).
        self.instance_id = uuid.uuid4().hex
        self.conflicts = 0  # registrations refused: another agent holds the node id
        self.fatal: str | None = None  # why the agent gave up (AgentConfigError), if it did
        self._told: set[str] = set()  # errors logged in this streak of failures
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self._log = structlog.get_logger().bind(node_id=config.node_id)
        # Controllers' terms (ControllerMessage.term): the highest seen, and every
        # message's in arrival order (the newest TERMS_KEPT, refused ones included).
        self.term = 0
        self.terms: collections.deque[int] = collections.deque(maxlen=TERMS_KEPT)
        self.stale_refused = 0  # messages refused for a term below `term`
        # What each leader asked and what was refused (the newest TERMS_KEPT), for
        # tests and `sia bench failover`: (term, directive) as received, and
        # (directive, error) for every rejected one.
        self.received: collections.deque[tuple[int, pb.Directive]] = collections.deque(
            maxlen=TERMS_KEPT)
        self.rejected: collections.deque[tuple[pb.Directive, str]] = collections.deque(
            maxlen=TERMS_KEPT)
        self._outbox = Outbox()
        self._profiler = Profiler(config, backend, self._outbox, self._log)
        self._directives = Directives(backend, self._outbox, self._profiler, self._log,
                                      self.rejected)
        self._targets = ControllerTargets(config.controllers, resolve, self._log)
        self._connector: asyncio.Task[None] | None = None
        self._processor: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._stream_up = False  # registered on a live stream
        self._call: Any = None  # that stream
        self._session_over = asyncio.Event()  # set when it ends

    # -- lifecycle ------------------------------------------------------------------

    @property
    def drain_reason(self) -> str | None:
        """Why the node drains (set by the controller's Drain: no new RUNs), or None."""
        return self._directives.drain_reason

    @property
    def draining(self) -> bool:
        return self.drain_reason is not None

    @property
    def profiling(self) -> Mapping[int, str]:
        """The profiling passes running now: local GPU -> job id (a read-only view;
        those GPUs refuse RUNs until their pass ends)."""
        return types.MappingProxyType(self._profiler.gpus)

    async def start(self) -> None:
        """Begin connecting (in the background); returns at once. Idempotent."""
        if self.status is not AgentStatus.INIT:
            if self.status in (AgentStatus.CLOSING, AgentStatus.CLOSED):
                raise RuntimeError("NodeAgent: closed, cannot start again")
            return
        self.status = AgentStatus.CONNECTING
        self._processor = asyncio.create_task(self._directives.run(),
                                              name="nodeagent:directives")
        self._connector = asyncio.create_task(self._connect_loop(), name="nodeagent:connect")
        self._log.info("agent started", controller=self.config.controller,
                       gpu_type=self.config.gpu_type, num_gpus=self.config.num_gpus)

    async def run(self) -> None:
        """Start if needed and run until `close()`; AgentConfigError if the agent
        closed itself because it cannot work as configured."""
        await self.start()
        await self._closed.wait()
        if self.fatal is not None:
            raise AgentConfigError(self.fatal)

    async def close(self) -> None:
        """Checkpoint running jobs (their JobExits sent if connected, within
        `close_grace_s`), end the stream, stop everything. Safe to call twice."""
        if self._close_task is None:
            self._close_task = asyncio.create_task(self._close(), name="nodeagent:close")
        await asyncio.shield(self._close_task)

    async def __aenter__(self) -> NodeAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _close(self) -> None:
        self.status = AgentStatus.CLOSING
        try:
            await cancel(*[t for t in (self._processor, *self._profiler.passes) if t is not None])
            # All at once: each stop may take the back-end's whole grace period.
            jobs = [job.job_id for job in self.backend.running()]
            results = await asyncio.gather(*(self.backend.stop(j) for j in jobs),
                                           return_exceptions=True)
            for job_id, res in zip(jobs, results, strict=True):
                if isinstance(res, BaseException):  # still close the rest
                    self._log.error("checkpoint on close failed", job_id=job_id,
                                    error=repr(res))
                else:
                    self._outbox.send(exit=res)
            if self._stream_up:  # disconnected: the controller learns from the lost node
                await self._end_stream()
        finally:
            if self._connector is not None:
                await cancel(self._connector)
            await self.backend.close()
            self.status = AgentStatus.CLOSED
            self._closed.set()
            self._log.info("agent closed")

    async def _end_stream(self) -> None:
        """Flush the outbox, half-close, and let the controller end the call: a
        cancelled call may lose what was written just before."""
        call = self._call
        try:
            async with asyncio.timeout(self.config.close_grace_s):
                await self._outbox.flushed()
                if call is not None:
                    await call.done_writing()
                    await self._session_over.wait()
        except TimeoutError:
            self._log.warning("closing without a clean end of stream", unsent=len(self._outbox))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:  # already failing
            self._log.info("stream failed while closing", error=str(exc))

    # -- the stream -----------------------------------------------------------------

    async def _connect_loop(self) -> None:
        attempt = 0
        while True:
            self._set_status(AgentStatus.CONNECTING)
            before = self.registrations
            try:
                await self._session()
                if self.status is AgentStatus.CLOSING:
                    return  # close() ended it
                self._log.warning("stream ended by the controller")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if self._targets.follow_leader(exc):
                    continue  # straight to the leader a standby named
                if await self._stream_failed(exc):
                    return
            except (_ProtocolError, TimeoutError) as exc:
                self._log.warning("stream failed", error=str(exc) or type(exc).__name__)
            except asyncio.InvalidStateError:  # written after the half-close (an ended
                # call's write fails with its status instead: `_raise_status`)
                if self.status is AgentStatus.CLOSING:
                    return  # a late report after close() half-closed the stream: dropped
                self._log.exception("stream failed unexpectedly")
            except Exception:  # a bug here must not stop the agent for good
                self._log.exception("stream failed unexpectedly")
            if self.status is AgentStatus.CLOSING:
                return
            if self.registrations > before:
                attempt = 0  # the controller was there: start the backoff afresh
                self._told.clear()
            self._targets.next()
            delay = self._backoff(attempt)
            attempt += 1
            self._set_status(AgentStatus.BACKOFF)
            self._log.info("reconnecting", attempt=attempt, delay_s=round(delay, 3))
            await self.clock.sleep(delay)

    def _check_term(self, msg: pb.ControllerMessage) -> bool:
        """Record `msg`'s term; False (refused: logged once per stale term, counted)
        when it is below the highest seen, i.e. from a deposed leader."""
        self.terms.append(msg.term)
        if msg.term >= self.term:
            if msg.term > self.term and self.term:
                self._log.warning("a new leader's term", term=msg.term, was=self.term)
            self.term = msg.term
            return True
        self.stale_refused += 1
        self._tell(f"term {msg.term}", "refusing a message from a deposed leader",
                   term=msg.term, highest=self.term, kind=msg.WhichOneof("kind"))
        return False

    async def _stream_failed(self, exc: grpc.aio.AioRpcError) -> bool:
        """Log a failed stream, and say whether the agent must give up (True: it is
        closing, with `fatal` set). ALREADY_EXISTS (another agent holds this node id)
        is retried with the growing backoff, so this one takes over once the other
        is gone. A bare UNAVAILABLE may hide a TLS mismatch that no retry can cure
        (`_tls_hint`): before the first registration that is fatal, a configuration
        error; later it is logged and retried (the files are read again on every
        reconnect, so fixing them is enough)."""
        code = exc.code()
        if code == grpc.StatusCode.ALREADY_EXISTS:
            self.conflicts += 1
            self._tell("conflict", "registration refused: another agent is connected with "
                       "this node id; retrying until it is gone", details=exc.details())
            return False
        self._log.warning("stream failed", code=code.name, details=exc.details())
        if code != grpc.StatusCode.UNAVAILABLE or "tls" in self._told:
            return False
        hint = await self._tls_hint()
        if hint is None:
            return False
        if self.registrations:
            self._tell("tls", "cannot connect; retrying", error=hint)
            return False
        self.fatal = hint
        self._log.error("cannot connect: configuration error", error=hint)
        if self._close_task is None:  # close from outside this task: it cancels us
            self._close_task = asyncio.create_task(self._close(), name="nodeagent:close")
        return True

    def _tell(self, what: str, event: str, **kw: Any) -> None:
        """Log `event` as an error the first time in a streak of failures, then as info."""
        log = self._log.info if what in self._told else self._log.error
        self._told.add(what)
        log(event, **kw)

    async def _tls_hint(self) -> str | None:
        """What a handshake of our own finds wrong with TLS to the controller, said
        with the agent's flags; None if nothing (e.g. the controller is down)."""
        cfg, address = self.config, self._targets.address
        problem = await asyncio.to_thread(probe_tls, address, cfg.tls_ca, cfg.tls_cert,
                                          cfg.tls_key, name=self._targets.name(address))
        if problem is None:
            return None
        return problem.hint(ca=cfg.tls_ca, cert=cfg.tls_cert, ca_flag="--tls-ca FILE",
                            cert_flags="--tls-cert FILE --tls-key FILE",
                            issue=issue_command(cfg.node_id))

    async def _session(self) -> None:
        """One stream, from Register until it fails or ends."""
        # A fresh channel each time, so gRPC's own reconnect backoff never stacks
        # on top of ours.
        await self._targets.refresh()
        address = self._targets.address
        async with self.config.channel(address, self._targets.name(address)) as channel:
            call = AgentServiceStub(channel).Connect()
            tasks: list[asyncio.Task[Any]] = []
            try:
                register = await self._register_message()
                running = register.running
                await call.write(pb.AgentMessage(register=register))
                async with asyncio.timeout(self.config.register_timeout_s):
                    first = await call.read()
                if first is grpc.aio.EOF:
                    raise _ProtocolError("stream closed before Registered")
                if first.WhichOneof("kind") != "registered":
                    raise _ProtocolError(f"expected Registered first, got "
                                         f"{first.WhichOneof('kind')}")
                if not self._check_term(first):
                    raise _ProtocolError(f"a deposed leader (term {first.term} < {self.term})")
                self._on_registered(first.registered)
                self.registrations += 1
                self._stream_up, self._call = True, call
                self._session_over.clear()
                self._set_status(AgentStatus.REGISTERED)
                self._log.info("registered", running=[r.job_id for r in running],
                               heartbeat_interval_s=self.heartbeat_interval_s)
                tasks = [asyncio.create_task(coro, name=f"nodeagent:{name}") for name, coro in (
                    ("read", self._read(call)), ("write", self._write(call)),
                    ("heartbeat", self._heartbeats()), ("telemetry", self._telemetry()))]
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if (exc := t.exception()) is not None:
                        raise exc
            finally:
                self._stream_up, self._call = False, None
                self._session_over.set()
                await cancel(*tasks)
                call.cancel()

    async def _register_message(self) -> pb.Register:
        """What this node runs, for the Register that opens a stream.

        The rule: the Register lists every GPU busy here (a worker or a profiling
        pass), and nothing an older stream sent starts after it. The controller books
        GPUs from this report; a pass or a worker that started after it (a request
        still queued from the old leader's stream) would be on a GPU its books call
        free. So: wait for the directive being applied to finish, and drop those not
        begun. Nothing is lost: a controller re-sends, on registering, every
        directive not acknowledged and every pass its books hold that is not
        listed here; a new leader decides afresh.

        A pass is listed until its report (result or refusal) is sent: one that
        ended while no stream was up, its report still queued, too. Else that
        report, arriving just after the Register, would be taken for the report of
        the same job's pass the controller requests on that GPU next (same job,
        generation and GPU): the books would free the GPU while the new pass ran."""
        async with self._directives.applying:
            self._directives.stream += 1  # what is still queued is of an older stream: not begun
            passes = [(r.job_id, r.generation, r.local_gpu) for r in self._profiler.passes.values()]
            passes += [(m.telemetry.job_id, m.telemetry.generation, m.telemetry.profile_gpu)
                       for m in self._outbox
                       if m.WhichOneof("kind") == "telemetry" and m.telemetry.profile]
            return pb.Register(
                node_id=self.config.node_id,
                gpus=[pb.GpuInventory(gpu_type=self.config.gpu_type, count=self.config.num_gpus)],
                agent_version=self.config.agent_version, running=self.backend.running(),
                profiling=[pb.ProfilingPass(job_id=j, generation=g, local_gpu=gpu)
                           for j, g, gpu in dict.fromkeys(passes)],
                draining=self.draining, instance_id=self.instance_id,
                isolation=getattr(self.backend, "isolation_level", "modeled"),
                # A leader below it, or at it without having sent it, steps down.
                highest_term=self.term)

    def _set_status(self, status: AgentStatus) -> None:
        if self.status not in (AgentStatus.CLOSING, AgentStatus.CLOSED):
            self.status = status

    def _on_registered(self, msg: pb.Registered) -> None:
        self._directives.acks_carry_exits = msg.acks_carry_exits
        if msg.heartbeat_interval_s > 0:
            self.heartbeat_interval_s = msg.heartbeat_interval_s
        else:
            self._log.warning("Registered without heartbeat_interval_s; using the default",
                              heartbeat_interval_s=self.config.heartbeat_interval_s)
            self.heartbeat_interval_s = self.config.heartbeat_interval_s

    async def _read(self, call: Any) -> None:
        stream = self._directives.stream
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            if not self._check_term(msg):
                continue
            kind = msg.WhichOneof("kind")
            if kind == "directive":
                self.received.append((msg.term, msg.directive))
                self._directives.put(stream, msg.directive)
            elif kind == "profile":  # in order with the directives: a STOP sent
                self._directives.put(stream, msg.profile)  # after it also ends it
            elif kind == "drain":
                self._directives.drain(msg.drain)
            elif kind == "registered":
                self._on_registered(msg.registered)
            else:
                self._log.warning("ignoring an empty or unknown controller message")

    async def _write(self, call: Any) -> None:
        while True:
            msg = await self._outbox.get()
            try:
                await call.write(msg)
            except BaseException as exc:
                self._outbox.put_front(msg)  # for the next stream, in order
                if isinstance(exc, asyncio.InvalidStateError) and call.done():
                    await _raise_status(call)
                    return  # the controller ended it cleanly: this stream is over
                raise
            finally:
                self._outbox.done()

    async def _heartbeats(self) -> None:
        while True:
            await self.clock.sleep(self.heartbeat_interval_s)
            self._outbox.send(heartbeat=pb.Heartbeat())

    async def _telemetry(self) -> None:
        while True:
            await self.clock.sleep(self.config.telemetry_interval_s)
            for t in self.backend.telemetry():
                self._outbox.send(telemetry=t)


async def _raise_status(call: Any) -> None:
    """A write to a call that has ended ("RPC already finished": the controller went
    away under it, as in a failover) fails as the call's reads do: its status as an
    `AioRpcError` (a failed stream, logged as a warning and retried), or nothing when
    the controller ended it cleanly; not as an unexpected error with a traceback."""
    code = await call.code()
    if code != grpc.StatusCode.OK:
        raise grpc.aio.AioRpcError(code, await call.initial_metadata(),
                                   await call.trailing_metadata(), await call.details())
