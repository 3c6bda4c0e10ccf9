"""The node agent: one bidirectional stream to the controller, directives applied
at most once, workers that outlive a lost connection.

Stream: Register first (inventory, version, the jobs still running here), then
Heartbeats every `Registered.heartbeat_interval_s`, Telemetry every
`telemetry_interval_s`, and DirectiveAck / JobExit as things happen. When the
stream fails the agent reconnects with full-jitter exponential backoff; workers
keep running meanwhile and the next Register lists them.

Everything the agent sends goes through one FIFO outbox that outlives a stream,
so a JobExit is never lost to a reconnect and always precedes the ack of the
directive that caused it. Directives are applied one at a time, in arrival
order, by one task that also outlives streams; acks of the last
`ACK_MEMORY` directive ids are kept, so a re-delivered directive is answered
with the same ack and changes nothing.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import math
import random
import types
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from sia_grpc import __version__
from sia_grpc.api import AgentServiceStub, pb
from sia_grpc.api.addresses import Resolve, expand, normalize
from sia_grpc.api.addresses import resolve as dns_resolve
from sia_grpc.clock import Clock, MonotonicClock
from sia_grpc.nodeagent.backend import Launch, WorkerBackend
from sia_grpc.security.tls import probe_tls

__all__ = ["ACK_MEMORY", "AgentConfig", "AgentConfigError", "AgentStatus", "NodeAgent",
           "full_jitter_backoff"]

ACK_MEMORY = 1000  # directive ids whose acks are remembered for re-delivery
TERMS_KEPT = 10_000  # received messages' terms kept in NodeAgent.terms


def _issue_command(node_id: str) -> str:
    return f"sia certs issue DIR --agent {node_id}"


class AgentConfigError(Exception):
    """The agent cannot work as configured (e.g. its certificate is refused); the
    message names the fix. `NodeAgent.run()` raises it once the agent has closed."""


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}: must be a positive number, got {value!r}")


@dataclass(frozen=True)
class AgentConfig:
    """What one node agent needs. Times are clock (real) seconds unless named modeled."""

    node_id: str
    # "host:port", or several comma-separated (a controller pair: the agent finds the
    # leader, following a standby's NOT_LEADER answer, else trying the next one); a
    # host name with several DNS records counts as several (api/addresses.py)
    controller: str
    gpu_type: str
    num_gpus: int
    time_scale: float = 1.0  # modeled seconds per real second (modeled workers)
    telemetry_interval_s: float = 2.0
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 10.0
    heartbeat_interval_s: float = 5.0  # only if Registered leaves it unset
    register_timeout_s: float = 10.0  # for the controller's Registered
    # HTTP/2 keepalive: with nothing read for this long the agent pings, and a ping
    # unanswered for as long again ends the stream. Else a partition (no RST, no FIN)
    # leaves the agent writing into a dead TCP connection for many minutes.
    keepalive_s: float = 20.0
    close_grace_s: float = 2.0  # close(): time to flush final JobExits
    agent_version: str = __version__
    # Mutual TLS (docs/security.md): the CA of the controller's certificate, and this
    # node's client certificate (CN or SAN = node_id). Read again on every
    # reconnect, so renewed files are picked up without a restart.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id: must not be empty")
        for address in self.controllers:  # (normalize: ValueError for dns://SERVER/, xds:)
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"controller: expected HOST:PORT[,HOST:PORT...], got "
                                 f"{self.controller!r}")
        if not self.gpu_type:
            raise ValueError("gpu_type: must not be empty")
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus: must be >= 1, got {self.num_gpus}")
        for name in ("time_scale", "telemetry_interval_s", "backoff_base_s", "backoff_cap_s",
                     "heartbeat_interval_s", "register_timeout_s", "keepalive_s"):
            _positive(name, getattr(self, name))
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("backoff_cap_s: must be >= backoff_base_s")
        if self.close_grace_s < 0:
            raise ValueError("close_grace_s: must be >= 0")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert, tls_key: give both (the client certificate and its key)")
        if self.tls_cert and not self.tls_ca:
            raise ValueError("tls_ca: required with tls_cert (the controller's CA)")
        if self.tls_ca and not self.tls_cert:
            # A TLS controller admits agents only with a client certificate: without
            # one every handshake on its agent port fails ("Socket closed"), for ever.
            raise ValueError(f"tls_cert, tls_key: an agent connecting with TLS needs its "
                             f"client certificate (CN = node id); issue one with "
                             f"`{_issue_command(self.node_id)}`")

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controller addresses, in the order tried."""
        return tuple(normalize(a.strip(), "controller") for a in self.controller.split(",")
                     if a.strip()) or ("",)

    def channel(self, address: str | None = None, name: str | None = None) -> grpc.aio.Channel:
        """A new channel to the controller at `address` (the first by default): TLS
        when tls_ca is set, else plaintext. `name`: the host name the controller's
        certificate is verified against when `address` is an IP it resolved to (the
        channel's authority, as in the SDK's `_channel_setup`)."""
        address = address or self.controllers[0]
        ms = max(int(self.keepalive_s * 1000), 1000)  # the controller accepts 1 ping/s
        options: list[tuple[str, int | str]] = [
            ("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
        if name:
            options.append(("grpc.default_authority", name))
        if not self.tls_ca:
            return grpc.aio.insecure_channel(address, options=options)
        from sia_grpc.security.tls import channel_credentials

        return grpc.aio.secure_channel(
            address, channel_credentials(self.tls_ca, self.tls_cert, self.tls_key),
            options=options)


def full_jitter_backoff(attempt: int, *, base: float, cap: float,
                        rng: random.Random | None = None) -> float:
    """Seconds to wait before reconnect `attempt` (0-based): uniform(0, min(cap,
    base·2^attempt)), so agents that lost the controller together do not return
    together."""
    bound = min(cap, base * 2.0 ** min(attempt, 64))
    return (rng or random).uniform(0.0, bound)


class AgentStatus(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"  # opening a stream, waiting for Registered
    REGISTERED = "registered"  # stream up
    BACKOFF = "backoff"  # waiting to reconnect
    CLOSING = "closing"
    CLOSED = "closed"


class _Outbox:
    """FIFO of AgentMessages that survives reconnects; a failed write goes back
    to the front so order is kept."""

    def __init__(self) -> None:
        self._items: collections.deque[pb.AgentMessage] = collections.deque()
        self._ready = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._writing = 0

    def put(self, msg: pb.AgentMessage) -> None:
        self._items.append(msg)
        self._ready.set()
        self._empty.clear()

    def put_front(self, msg: pb.AgentMessage) -> None:
        self._items.appendleft(msg)
        self._ready.set()
        self._empty.clear()

    async def get(self) -> pb.AgentMessage:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        self._writing += 1
        return self._items.popleft()

    def done(self) -> None:
        """The message from the last `get` was written (or handed back)."""
        self._writing -= 1
        if not self._items and not self._writing:
            self._empty.set()

    async def flushed(self) -> None:
        await self._empty.wait()

    @property
    def pending(self) -> bool:
        """Messages queued or being written."""
        return not self._empty.is_set()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[pb.AgentMessage]:
        """The messages queued, oldest first."""
        return iter(self._items)


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
        self.drain_reason: str | None = None  # set by Drain: no new RUNs
        self.registrations = 0  # streams that got as far as Registered
        # Sent in every Register: the controller tells this agent's reconnects from a
        # second agent with the same node id (which it refuses while this one lives).
        self.instance_id = uuid.uuid4().hex
        self.conflicts = 0  # registrations refused: another agent holds the node id
        self.fatal: str | None = None  # why the agent gave up (AgentConfigError), if it did
        self._told: set[str] = set()  # errors logged in this streak of failures
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self._log = structlog.get_logger().bind(node_id=config.node_id)
        self._outbox = _Outbox()
        # Directives and profiling requests, applied one at a time in the order sent,
        # each with the number of the stream it came on (`_streams` is the current
        # one's); `_applying` is held while one is applied (`_register_message`).
        self._directives: asyncio.Queue[tuple[int, pb.Directive | pb.ProfileRequest]] = \
            asyncio.Queue()
        self._streams = 0
        self._applying = asyncio.Lock()
        self._acks: collections.OrderedDict[int, pb.DirectiveAck] = collections.OrderedDict()
        # Whether the stream's controller reads a STOP's exit inside its ack
        # (`Registered.acks_carry_exits`), and the exit the directive being applied
        # ended a job with, to go with its ack then (`_stopped`).
        self._acks_carry_exits = False
        self._exit_for_ack: pb.JobExit | None = None
        # Jobs that completed here -> generation (the most recent ACK_MEMORY of them).
        self._completed: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._profiling: dict[int, str] = {}  # local GPU -> job being profiled on it
        self._passes: dict[asyncio.Task[None], pb.ProfileRequest] = {}  # in flight
        self._connector: asyncio.Task[None] | None = None
        self._processor: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._stream_up = False  # registered on a live stream
        self._call: Any = None  # that stream
        self._session_over = asyncio.Event()  # set when it ends
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
        # The controller addresses, config.controllers resolved (api/addresses.py's
        # `expand`: address -> the name to verify its certificate against), resolved
        # before the first stream and again once every one has failed.
        self._resolve = resolve
        self._names: dict[str, str | None] = dict.fromkeys(config.controllers)
        self._addresses = list(self._names)
        self._stale = True
        self._target = 0  # index into _addresses: where the next stream goes

    # -- lifecycle ------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.drain_reason is not None

    @property
    def profiling(self) -> Mapping[int, str]:
        """The profiling passes running now: local GPU -> job id (a read-only view;
        those GPUs refuse RUNs until their pass ends)."""
        return types.MappingProxyType(self._profiling)

    async def start(self) -> None:
        """Begin connecting (in the background); returns at once. Idempotent."""
        if self.status is not AgentStatus.INIT:
            if self.status in (AgentStatus.CLOSING, AgentStatus.CLOSED):
                raise RuntimeError("NodeAgent: closed, cannot start again")
            return
        self.status = AgentStatus.CONNECTING
        self._processor = asyncio.create_task(self._process_directives(),
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
            await _cancel(*[t for t in (self._processor, *self._passes) if t is not None])
            # All at once: each stop may take the back-end's whole grace period.
            jobs = [job.job_id for job in self.backend.running()]
            results = await asyncio.gather(*(self.backend.stop(j) for j in jobs),
                                           return_exceptions=True)
            for job_id, res in zip(jobs, results, strict=True):
                if isinstance(res, BaseException):  # still close the rest
                    self._log.error("checkpoint on close failed", job_id=job_id,
                                    error=repr(res))
                else:
                    self._send(exit=res)
            if self._stream_up:  # disconnected: the controller learns from the lost node
                await self._end_stream()
        finally:
            if self._connector is not None:
                await _cancel(self._connector)
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
                if self._follow_leader(exc):
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
            self._next_target()
            delay = self._backoff(attempt)
            attempt += 1
            self._set_status(AgentStatus.BACKOFF)
            self._log.info("reconnecting", attempt=attempt, delay_s=round(delay, 3))
            await self.clock.sleep(delay)

    def _next_target(self) -> None:
        """The next stream goes to the next controller address (one: the same);
        after the last, the addresses are resolved again (a replaced pod's new IP)."""
        self._target = (self._target + 1) % len(self._addresses)
        self._stale = self._target == 0

    async def _refresh(self) -> None:
        """Resolve the controller addresses if due, off the event loop."""
        if not self._stale:
            return
        now = self._addresses[self._target]
        found = await asyncio.to_thread(expand, list(self.config.controllers), self._resolve)
        self._names, self._addresses, self._stale = found, list(found), False
        self._target = self._addresses.index(now) if now in found else 0

    def _follow_leader(self, exc: grpc.aio.AioRpcError) -> bool:
        """A standby's NOT_LEADER naming one of our addresses: go there next, now.
        (Only ours: with mutual TLS agents use other ports than the clients' address
        a standby names; then the next address is tried, with the backoff.)"""
        from sia_grpc.api.errors import ApiError

        err = ApiError.from_rpc_error(exc)
        if err.reason != "NOT_LEADER":
            return False
        leader, addresses = err.metadata.get("leader", ""), self._addresses
        if leader not in addresses or addresses.index(leader) == self._target:
            return False
        self._log.info("controller is a standby: to the leader", standby=addresses[self._target],
                       leader=leader)
        self._target = addresses.index(leader)
        return True

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
        cfg, address = self.config, self._addresses[self._target]
        problem = await asyncio.to_thread(probe_tls, address, cfg.tls_ca, cfg.tls_cert,
                                          cfg.tls_key, name=self._names.get(address))
        if problem is None:
            return None
        return problem.hint(ca=cfg.tls_ca, cert=cfg.tls_cert, ca_flag="--tls-ca FILE",
                            cert_flags="--tls-cert FILE --tls-key FILE",
                            issue=_issue_command(cfg.node_id))

    async def _session(self) -> None:
        """One stream, from Register until it fails or ends."""
        # A fresh channel each time, so gRPC's own reconnect backoff never stacks
        # on top of ours.
        await self._refresh()
        address = self._addresses[self._target]
        async with self.config.channel(address, self._names.get(address)) as channel:
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
                await _cancel(*tasks)
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
        async with self._applying:
            self._streams += 1  # what is still queued is of an older stream: not begun
            passes = [(r.job_id, r.generation, r.local_gpu) for r in self._passes.values()]
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
        self._acks_carry_exits = msg.acks_carry_exits
        if msg.heartbeat_interval_s > 0:
            self.heartbeat_interval_s = msg.heartbeat_interval_s
        else:
            self._log.warning("Registered without heartbeat_interval_s; using the default",
                              heartbeat_interval_s=self.config.heartbeat_interval_s)
            self.heartbeat_interval_s = self.config.heartbeat_interval_s

    async def _read(self, call: Any) -> None:
        stream = self._streams
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            if not self._check_term(msg):
                continue
            kind = msg.WhichOneof("kind")
            if kind == "directive":
                self.received.append((msg.term, msg.directive))
                self._directives.put_nowait((stream, msg.directive))
            elif kind == "profile":  # in order with the directives: a STOP sent
                self._directives.put_nowait((stream, msg.profile))  # after it also ends it
            elif kind == "drain" and msg.drain.cancel:
                if self.drain_reason is not None:
                    self._log.warning("drain ended: taking new jobs", was=self.drain_reason)
                self.drain_reason = None
            elif kind == "drain":
                self.drain_reason = msg.drain.reason or "unspecified"
                self._log.warning("draining: no new jobs", reason=self.drain_reason)
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
            self._send(heartbeat=pb.Heartbeat())

    async def _telemetry(self) -> None:
        while True:
            await self.clock.sleep(self.config.telemetry_interval_s)
            for t in self.backend.telemetry():
                self._send(telemetry=t)

    def _send(self, **kind: Any) -> None:
        self._outbox.put(pb.AgentMessage(**kind))

    # -- directives -----------------------------------------------------------------

    async def _process_directives(self) -> None:
        while True:
            stream, d = await self._directives.get()
            async with self._applying:
                if stream == self._streams:
                    await self._process(d)
                else:  # (`_register_message`: its controller sends it again if need be)
                    self._log.info("not begun before the stream ended: dropped",
                                   job_id=d.job_id, kind=type(d).__name__)

    async def _process(self, d: pb.Directive | pb.ProfileRequest) -> None:
        if isinstance(d, pb.ProfileRequest):
            self._start_profile(d)  # (the pass runs on; the next message is not held up)
            return
        ack = self._acks.get(d.directive_id) if d.directive_id else None
        log = self._log.bind(job_id=d.job_id, generation=d.generation,
                             directive_id=d.directive_id, round=d.round)
        if ack is not None:
            log.info("directive re-delivered: same ack, no change", ok=ack.ok)
        else:
            self._exit_for_ack = None
            try:
                error = await self._apply(d, log)
            except Exception as exc:  # the ack must still go out
                log.exception("directive failed")
                error = f"internal error: {type(exc).__name__}: {exc}"
            ack = pb.DirectiveAck(directive_id=d.directive_id, job_id=d.job_id,
                                  generation=d.generation, ok=not error, error=error,
                                  exit=self._exit_for_ack)
            self._exit_for_ack = None
            if d.directive_id:
                self._acks[d.directive_id] = ack
                while len(self._acks) > ACK_MEMORY:
                    self._acks.popitem(last=False)
            if error:
                self.rejected.append((d, error))
                log.warning("directive rejected", error=error)
        self._send(ack=ack)

    async def _apply(self, d: pb.Directive, log: Any) -> str:
        """Carry out `d`; the error for its ack, "" if it succeeded."""
        if not d.directive_id:
            return "directive_id: must be set"
        if not d.job_id:
            return "job_id: must be set"
        running = {r.job_id: r for r in self.backend.running()}
        current = running.get(d.job_id)
        if d.action == pb.Directive.ACTION_RUN:
            if current is not None and current.generation == d.generation:
                if d.HasField("allocation") and _batch_of(d.allocation) != _batch_of(
                        self.backend.allocation(d.job_id)):
                    await self.backend.rebatch(d.job_id, d.allocation)
                    log.info("batch changed", batch=d.allocation.batch_size)
                else:
                    log.info("already running this generation")
                return ""
            if current is not None and current.generation > d.generation:
                return f"stale generation {d.generation} (running {current.generation})"
            if current is None and self._completed.get(d.job_id, -1) >= d.generation:
                # A RUN (a batch change) that crossed the job's completion: started
                # again it would hold GPUs the controller gives to others once the
                # exit arrives. Its JobExit is already on its way.
                log.info("already completed this generation here: not started again")
                return ""
            if self.draining:
                return f"node draining ({self.drain_reason})"
            error = self._check_gpus(d.local_gpus, d.job_id, running)
            if error:
                return error
            launch = Launch.from_directive(d)
            try:
                self.backend.check(launch)
            except ValueError as exc:
                return str(exc)
            if current is not None:
                log.info("stopping the older generation first", old=current.generation)
                self._stopped(await self.backend.stop(d.job_id))
            await self.backend.start(launch, self._on_exit)
            log.info("running", gpus=list(d.local_gpus))
            return ""
        if d.action == pb.Directive.ACTION_STOP:
            # A job cancelled while being profiled: its passes end with it, and the
            # ack goes out only once their GPUs are free (the controller then frees
            # them in its books).
            passes = await self._stop_profiles(d.job_id)
            if current is None:
                log.info("stop: not running here", profiling_passes_stopped=passes or None)
                return ""
            if current.generation > d.generation:
                return f"stale generation {d.generation} (running {current.generation})"
            self._stopped(await self.backend.stop(d.job_id))
            log.info("stopped", generation=current.generation)
            return ""
        return f"action: unsupported ({pb.Directive.Action.Name(d.action)})"

    def _stopped(self, exit_: pb.JobExit) -> None:
        """A job the directive being applied stopped: its exit goes before the ack, in
        the ack itself where the controller reads it there (one message, not two: a
        round that moves 800 jobs sends 800 fewer), else as a message of its own."""
        if not self._acks_carry_exits:
            self._send(exit=exit_)
            return
        if self._exit_for_ack is not None:  # (an earlier one, in order: not held back)
            self._send(exit=self._exit_for_ack)
        self._exit_for_ack = exit_

    def _check_gpus(self, gpus: Any, job_id: str, running: dict[str, pb.RunningJob]) -> str:
        n = self.config.num_gpus
        if not gpus:
            return "local_gpus: empty"
        if len(set(gpus)) != len(gpus):
            dup = next(g for g in gpus if list(gpus).count(g) > 1)
            return f"local_gpus: GPU {dup} listed twice"
        held = {g: f"held by job {r.job_id} generation {r.generation}"
                for r in running.values() if r.job_id != job_id for g in r.local_gpus}
        held.update({g: f"profiling job {j}" for g, j in self._profiling.items()})
        for g in gpus:
            if g >= n:
                return f"local_gpus: GPU {g} does not exist (this node has GPUs 0..{n - 1})"
            if g in held:
                return f"local_gpus: GPU {g} is {held[g]}"
        return ""

    def _on_exit(self, exit_: pb.JobExit) -> None:
        if exit_.kind == pb.JobExit.KIND_COMPLETED:
            self._completed[exit_.job_id] = exit_.generation
            self._completed.move_to_end(exit_.job_id)
            while len(self._completed) > ACK_MEMORY:
                self._completed.popitem(last=False)
        self._log.info("job exited", job_id=exit_.job_id, generation=exit_.generation,
                       kind=pb.JobExit.Kind.Name(exit_.kind), progress=exit_.progress)
        self._send(exit=exit_)

    # -- profiling ------------------------------------------------------------------

    def _start_profile(self, req: pb.ProfileRequest) -> None:
        log = self._log.bind(job_id=req.job_id, generation=req.generation, gpu=req.local_gpu)
        if self._profiling.get(req.local_gpu) == req.job_id:
            # Re-sent after a reconnect: the pass in flight answers it.
            log.info("profile request re-delivered: already profiling")
            return
        running = {r.job_id: r for r in self.backend.running()}
        error = self._check_gpus([req.local_gpu], "", running)
        if error:  # answered, so the controller does not wait for it
            log.warning("profile request refused", error=error)
            self._send(telemetry=pb.Telemetry(
                job_id=req.job_id, generation=req.generation, profile=True,
                profile_gpu=req.local_gpu, profile_refused=True,
                profile_error=f"{self.config.node_id} refused: {error}"))
            return
        self._profiling[req.local_gpu] = req.job_id
        task = asyncio.create_task(self._profile(req, log), name=f"nodeagent:profile:{req.job_id}")
        self._passes[task] = req

        def done(_: asyncio.Task[None]) -> None:  # also for a task cancelled before it ran
            self._passes.pop(task, None)
            if self._profiling.get(req.local_gpu) == req.job_id:
                del self._profiling[req.local_gpu]
        task.add_done_callback(done)

    async def _stop_profiles(self, job_id: str) -> int:
        """End `job_id`'s profiling passes here (a cancelled pass reports nothing)."""
        tasks = [t for t, r in self._passes.items() if r.job_id == job_id]
        await _cancel(*tasks)
        return len(tasks)

    async def _profile(self, req: pb.ProfileRequest, log: Any) -> None:
        try:
            result = await self.backend.profile(req)
        except Exception as exc:
            log.exception("profile failed")
            result = pb.Telemetry(job_id=req.job_id, generation=req.generation, profile=True,
                                  profile_error=f"{type(exc).__name__}: {exc}"[:1000])
        finally:  # free before the controller hears of it
            if self._profiling.get(req.local_gpu) == req.job_id:
                del self._profiling[req.local_gpu]
        result.profile_gpu = req.local_gpu  # which pass this answers
        self._send(telemetry=result)


def _batch_of(a: pb.Allocation) -> tuple[int, int, int]:
    return a.batch_size, a.atomic_batch_size, a.accum_steps


async def _raise_status(call: Any) -> None:
    """A write to a call that has ended ("RPC already finished": the controller went
    away under it, as in a failover) fails as the call's reads do: its status as an
    `AioRpcError` (a failed stream, logged as a warning and retried), or nothing when
    the controller ended it cleanly; not as an unexpected error with a traceback."""
    code = await call.code()
    if code != grpc.StatusCode.OK:
        raise grpc.aio.AioRpcError(code, await call.initial_metadata(),
                                   await call.trailing_metadata(), await call.details())


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
