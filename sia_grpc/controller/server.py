"""The controller's async shell: gRPC services, the event queue, the round timer.

All decisions are `ControllerState.handle` (pure, synchronous); this module only
turns RPCs, agent streams and timers into events, one at a time, and carries out
the actions: persist (SQLite, on one writer thread, before an RPC says OK), send
to agents, solve (in a spawn process pool, never on the loop), publish rounds.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sia_grpc import __version__, api
from sia_grpc.api import node_state_name, pb, state_name
from sia_grpc.api.convert import MAX_GPUS_PER_NODE
from sia_grpc.api.errors import (
    ApiError,
    already_exists,
    failed_precondition,
    invalid,
    not_found,
    permission_denied,
    unavailable,
)
from sia_grpc.clock import Clock, WallClock
from sia_grpc.controller import state as sm
from sia_grpc.controller.config import ConfigError, ControllerConfig
from sia_grpc.controller.exclusive import StoreLock, check_bindable
from sia_grpc.controller.limits import TenantLimits
from sia_grpc.controller.solver_pool import SolverPool
from sia_grpc.controller.store import Store as JobStore
from sia_grpc.controller.store import StoreError
from sia_grpc.controller.validation import Resolved, check_job_id, resolve
from sia_grpc.observability import MetricsServer, setup_telemetry
from sia_grpc.policy import params as policy_params
from sia_grpc.policy.types import Policy
from sia_grpc.security import auth
from sia_grpc.security.tls import ReloadingCertificates, is_loopback, read_pem
from sia_grpc.security.tokens import Principal, TokenError, TokenStore

log = structlog.get_logger("sia.controller")
VERSION = __version__
ROUNDS_KEPT = 1000  # published rounds kept (in memory and in the store) for ListRounds
# The state names the sia_jobs / sia_nodes gauges always report (the CLI's names).
_JOB_STATES = tuple(state_name(v) for v in pb.JobState.values() if v)
_NODE_STATES = tuple(node_state_name(v) for v in pb.NodeState.values() if v)


def loop_factory():
    """uvloop's event loop when installed (faster gRPC and sockets), else asyncio's;
    for `asyncio.Runner(loop_factory=...)`, never a global policy."""
    try:
        import uvloop
    except ImportError:  # optional (not on Windows)
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class Status(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


def rpc(method: Callable[..., Awaitable]) -> Callable[..., Awaitable]:
    """Typed errors become statuses; anything else is INTERNAL, logged, never a crash."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except ApiError as err:
            await context.abort_with_status(err.to_status())
        except StoreError as err:
            log.error("store error", error=str(err), rpc=method.__name__)
            await context.abort_with_status(unavailable(str(err), "STORE_UNAVAILABLE").to_status())
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("internal error", rpc=method.__name__)
            await context.abort_with_status(ApiError(
                grpc.StatusCode.INTERNAL, "internal error; the controller logged it",
                reason="INTERNAL").to_status())
    return wrapper


@dataclass
class _Agent:
    node_id: str
    outbox: asyncio.Queue
    context: grpc.aio.ServicerContext
    instance_id: str = ""  # Register.instance_id: the same agent reconnecting
    heard: float = 0.0  # controller clock: its last message (Register included)
    peer: str = "unknown"  # where the stream comes from, read once when it opened


class Controller:
    """`async with Controller(config) as c:` serves until closed; `c.port` is the bound port
    (`c.metrics_port` the Prometheus one, with `metrics_listen`).

    `telemetry` (observability.Telemetry) records rounds and gauges; with `metrics_listen`
    it must have been made with `prometheus=True`, and when none is given the controller
    makes one that feeds only /metrics."""

    def __init__(self, config: ControllerConfig | None = None, *,
                 clock: Clock | None = None, telemetry=None) -> None:
        self.config = config = config or ControllerConfig()
        self.clock = clock or WallClock()
        if telemetry is None and config.metrics_listen:
            telemetry = setup_telemetry(env={}, prometheus=True)
        self.telemetry = telemetry
        self.status = Status.CREATED
        self.state = sm.ControllerState(sm.ControllerSettings(
            heartbeat_timeout=config.heartbeat_timeout,
            checkpoint_root=config.checkpoint_root, profile_wait=config.round_duration))
        self._limits = TenantLimits(config.max_active_jobs, config.create_rate,
                                    config.create_burst)
        self._pending_creates: collections.Counter[str] = collections.Counter()
        self.port = 0
        self.agent_port = 0  # the mutual-TLS port for agents (0: agents use `port`)
        self.metrics_port = 0  # where /metrics is served (0: metrics_listen is off)
        self._metrics: MetricsServer | None = None
        self.tokens: TokenStore | None = None
        self.rounds: collections.deque[pb.Round] = collections.deque(maxlen=ROUNDS_KEPT)
        self._events: asyncio.Queue = asyncio.Queue()
        self._unpersisted: set[str] = set()  # jobs whose last write failed
        self._persist_retry_at = 0.0  # (monotonic) when to write them again
        self._agents: dict[str, _Agent] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="sia-store")
        self._store: JobStore | None = None
        self._lock: StoreLock | None = None  # on the store file, for the controller's life
        self._pool = SolverPool(config.policy_spec, inline=config.inline_solver)
        self.policy: Policy | None = None  # as the solver process built it (start-up)
        self._tasks: list[asyncio.Task] = []
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._job_watchers: set[asyncio.Event] = set()  # one per WatchJobs, set on commits
        self._round_watchers: set[asyncio.Queue] = set()
        self._early: asyncio.Task | None = None
        self._creates: list[tuple[pb.Job, str, asyncio.Future]] = []
        # round -> [tick ns, solve done ns]; the round is published when acknowledged
        self._round_clock: dict[int, list[int]] = {}
        self._unacked_rounds: dict[int, pb.Round] = {}
        self._unsaved_rounds: list[pb.Round] = []  # published, not yet in the store
        self._upkeep: asyncio.Task | None = None  # the timer's store upkeep
        self._create_flush: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        if self.status is not Status.CREATED:
            return
        try:
            await self._start()
        except BaseException:
            await self.close(grace=0)  # what the start took (the store lock first) goes back
            raise

    async def _start(self) -> None:
        self._auth = self._security()  # first: a bad file is a ConfigError
        self._claim()  # a second controller on this store or address stops here
        self._serve_metrics()  # next: a port in use fails before anything else is open
        self._store = await self._in_store(JobStore, self.config.db_path,
                                           synchronous=self.config.store_synchronous,
                                           rounds_limit=ROUNDS_KEPT)
        now = self.clock.time()
        self.state.started_at = now
        for stored in await self._in_store(self._store.all_jobs):
            self.state.restore(stored.job, stored.extra, now)
        for node, reason in (await self._in_store(self._store.drains)).items():
            self.state.restore_drain(node, reason, now)
        # The round history outlives a restart, and round numbers go on from it.
        self.rounds.extend(await self._in_store(self._store.rounds))
        if self.rounds:
            self.state.round_no = max(self.state.round_no, self.rounds[-1].round)
        opts = [("grpc.max_receive_message_length", self.config.max_message_bytes),
                ("grpc.max_send_message_length", self.config.max_message_bytes),
                # Agents ping to detect a partition (AgentConfig.keepalive_s); gRPC's
                # default (one ping per 5 min without data) would GOAWAY them.
                ("grpc.http2.min_ping_interval_without_data_ms", 1000),
                ("grpc.keepalive_permit_without_calls", 1),
                # gRPC sets SO_REUSEPORT by default: a second controller on this port
                # would then serve beside this one, clients alternating between them.
                ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=opts, interceptors=[self._auth])
        api.add_JobServiceServicer_to_server(JobService(self), server)
        api.add_ClusterServiceServicer_to_server(ClusterService(self), server)
        api.add_AgentServiceServicer_to_server(AgentService(self), server)
        from sia_grpc.controller.policy_service import PolicyService
        api.add_PolicyServiceServicer_to_server(PolicyService(), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*api.SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        self._bind(server)
        if self._lock is not None:  # the port bound, for whoever the lock refuses next
            self._lock.describe(f"listen {self.config.listen.rpartition(':')[0]}:{self.port}")
        await server.start()
        self._server = server
        for name in ("", *api.SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.status = Status.RUNNING
        await self._warm()  # ready only once the solver process can take a round
        self._tasks = [asyncio.create_task(self._process(), name="sia-events"),
                       asyncio.create_task(self._timer(), name="sia-rounds"),
                       asyncio.create_task(self._liveness(), name="sia-liveness")]
        log.info("controller started", listen=self.config.listen, port=self.port,
                 agent_port=self.agent_port or None, metrics_port=self.metrics_port or None,
                 tls=self.config.tls, jobs=len(self.state.jobs), policy=self.config.policy)

    # ------------------------------------------------------------ metrics

    def _observe(self) -> None:
        """The gauges' callables. They run on the metric reader's thread (a scrape, an
        OTLP export), so each reads a snapshot (the state's views copy what they scan)."""
        state = self.state
        self.telemetry.observe(
            queue_length=lambda: state.jobs_by_state().get("QUEUED", 0),
            queue_max_wait=lambda: state.queue_max_wait(self.clock.time()),
            events_pending=self._events.qsize,
            # Every state, 0 included: a series that vanished would hide from alerts.
            jobs_by_state=lambda: dict.fromkeys(_JOB_STATES, 0) | state.jobs_by_state(),
            nodes_by_state=lambda: dict.fromkeys(_NODE_STATES, 0) | state.nodes_by_state(),
            gpus_allocated=state.gpus_allocated, gpus_capacity=state.gpus_capacity,
            agents_connected=lambda: len(self._agents),
            solve_timeout=lambda: self.config.solve_timeout)

    def _serve_metrics(self) -> None:
        """Register the gauges and, with metrics_listen, bind and serve /metrics."""
        if self.telemetry is None:
            return
        self._observe()
        address = self.config.metrics_listen
        if not address:
            return
        registry = getattr(self.telemetry, "prometheus_registry", None)
        if registry is None:
            raise ConfigError("metrics_listen: the controller's telemetry has no Prometheus "
                              "reader; make it with setup_telemetry(prometheus=True)")
        try:
            self._metrics = MetricsServer(registry, address)
        except OSError as err:
            raise OSError(f"metrics_listen: cannot bind {address}: {err}") from None
        self.metrics_port = self._metrics.port
        log.info("serving Prometheus metrics over plain HTTP, unauthenticated",
                 metrics_listen=address, metrics_port=self.metrics_port)

    # ------------------------------------------------------------ security

    def _security(self) -> auth.AuthInterceptor:
        """Load the tokens, say how the controller is exposed, build the interceptor."""
        cfg = self.config
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            try:
                read_pem(getattr(cfg, name), name)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        if cfg.tokens_file:
            try:
                self.tokens = TokenStore(cfg.tokens_file)
            except TokenError as err:
                raise ConfigError(f"tokens_file: {err}") from None
            log.info("clients authenticate with bearer tokens", tokens_file=cfg.tokens_file,
                     tokens=len(self.tokens))
        else:
            log.warning("no tokens_file: every caller is an anonymous admin "
                        "(development mode; see docs/security.md)")
        exposed = not all(is_loopback(a) for a in (cfg.listen, cfg.agent_address) if a)
        if not cfg.tls and exposed:
            log.warning("INSECURE: serving WITHOUT TLS on a non-loopback address because "
                        "allow_insecure is set; anyone on the network can read and forge "
                        "requests and register agents", listen=cfg.listen)
        elif not cfg.tls:
            log.info("serving WITHOUT TLS on loopback only", listen=cfg.listen)
        elif not cfg.tls_client_ca:
            log.warning("TLS without tls_client_ca: node agents cannot register")
        return auth.AuthInterceptor(self.tokens, tls=cfg.tls, agent_hint=cfg.agent_address)

    def _claim(self) -> None:
        """Lock the store file and check that the ports are free, so a second
        controller refuses to start with one line naming the other holder."""
        cfg = self.config
        check_bindable(cfg.listen, "listen")  # first: a refused start leaves no lock file
        for name, address in (("agent_listen", cfg.agent_address),
                              ("metrics_listen", cfg.metrics_listen)):
            if address:
                check_bindable(address, name)
        if cfg.db_path != ":memory:":
            self._lock = StoreLock(cfg.db_path, f"listen {cfg.listen}")

    def _bind(self, server: grpc.aio.Server) -> None:
        cfg = self.config
        try:
            # the files are re-read when they change: rotation needs no restart
            certs = (ReloadingCertificates(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
                     if cfg.tls else None)
            self.port = _add_port(server, "listen", cfg.listen,
                                  certs and certs.credentials())
            agent_listen = cfg.agent_address
            if not agent_listen:
                return
            # every connection here presents a certificate from tls_client_ca
            self.agent_port = _add_port(server, "agent_listen", agent_listen,
                                        certs and certs.credentials(require_client_cert=True))
        except ValueError as err:  # an unreadable or malformed PEM file
            raise ConfigError(str(err)) from None
        self._auth.agent_hint = f"{agent_listen.rpartition(':')[0]}:{self.agent_port}"

    def reload_tokens(self) -> bool:
        """Read the tokens file again now (SIGHUP); False if it failed or is not set."""
        return self.tokens.reload() if self.tokens is not None else False

    async def close(self, grace: float = 2.0) -> None:
        """Graceful stop: NOT_SERVING, timers off, in-flight work finished or capped,
        agent streams drained, server stopped, pool and store closed. Safe twice."""
        if self.status in (Status.CLOSING, Status.CLOSED):
            return
        if self.status is Status.CREATED:  # never started, or a start that failed
            self.status = Status.CLOSED
            await self._release(grace)
            return
        self.status = Status.CLOSING
        self._notify_watchers()  # open WatchJobs streams see CLOSING and end
        await self._health.enter_graceful_shutdown()
        for t in [*self._tasks, self._early, self._create_flush]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*[t for t in self._tasks if t], return_exceptions=True)
        for agent in self._agents.values():
            agent.outbox.put_nowait(None)
        await self._release(grace)
        if self.telemetry is not None:
            self.telemetry.shutdown()
        self.status = Status.CLOSED
        log.info("controller stopped")

    async def _release(self, grace: float) -> None:
        """Stop serving, then let go of the solver, the store and, last, its lock."""
        if self._metrics is not None:  # before the telemetry: scrapes end cleanly
            await asyncio.to_thread(self._metrics.close)
        if self._server is not None:
            await self._server.stop(grace)
        self._pool.close()
        if self._store is not None:
            if self._upkeep is not None:  # awaited, not cancelled: its writes are queued
                await asyncio.gather(self._upkeep, return_exceptions=True)
            await self._save_rounds()
            await self._in_store(self._store.close)
        self._writer.shutdown(wait=True)
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------ events

    async def submit(self, event: sm.Event) -> None:
        """Handle `event` and carry out its actions; returns once they are durable."""
        done = asyncio.get_running_loop().create_future()
        await self._events.put((event, done))
        await done

    def post(self, event: sm.Event) -> None:
        self._events.put_nowait((event, None))

    async def _process(self) -> None:
        """Handle queued events in batches: decide each in order, carry out the
        actions, write every touched job in one transaction, then answer the RPCs
        waiting on them (group commit: 1,000 creates cost one fsync, not 1,000)."""
        while True:
            batch = [await self._events.get()]
            while not self._events.empty() and len(batch) < 1024:
                batch.append(self._events.get_nowait())
            touched: dict[str, None] = {}
            failed: dict[int, Exception] = {}
            for k, (event, _) in enumerate(batch):
                if isinstance(event, sm.JobCreated):  # the state machine counts it now
                    self._pending_creates[event.job.spec.tenant] -= 1
                try:
                    actions = self.state.handle(event)
                except Exception as exc:  # the loop must survive any one event
                    log.exception("event failed", event=type(event).__name__)
                    failed[k] = exc
                    continue
                for action in actions:
                    if isinstance(action, sm.Persist):
                        touched.update(dict.fromkeys(action.job_ids))
                        continue
                    try:
                        self._perform(action)
                    except Exception:  # one failed action must not stop the controller
                        log.exception("action failed", action=type(action).__name__)
            error: Exception | None = None
            retry = self._unpersisted and time.monotonic() >= self._persist_retry_at
            if retry:
                touched.update(dict.fromkeys(self._unpersisted))
            try:
                await self._persist(tuple(touched))
                if retry:
                    self._unpersisted.clear()
            except Exception as exc:
                # Written again later (a second on, with a batch): the store must not
                # stay behind the live state for a job nothing else touches again;
                # not at once, or a locked store would hold every write up.
                log.exception("persist failed; retried later", jobs=len(touched))
                self._unpersisted.update(touched)
                self._persist_retry_at = time.monotonic() + 1.0
                error = exc
            for k, (_, done) in enumerate(batch):
                if done is not None and not done.done():
                    exc = failed.get(k) or error
                    if exc is None:
                        done.set_result(None)
                    else:
                        done.set_exception(exc)

    def _perform(self, action: sm.Action) -> None:
        match action:
            case sm.Send():
                agent = self._agents.get(action.node_id)
                if agent is not None:  # else: re-sent when it reconnects
                    agent.outbox.put_nowait(action.message)
            case sm.Solve():
                self._round_clock[action.round_no] = [time.time_ns(), 0]
                asyncio.create_task(self._solve(action), name=f"sia-solve-{action.round_no}")
            case sm.RoundDone():
                self._round_done(action.round)
            case sm.RoundSkipped():
                self._publish_round(action.round)
                log.info("round skipped", trigger=action.round.trigger,
                         why=action.round.note.removeprefix("skipped: "))
            case sm.RoundAcked():
                self._round_acked(action.round_no)
            case sm.WantRound():
                self._schedule_early(action.trigger)
            case sm.Reconnect():
                agent = self._agents.get(action.node_id)
                if agent is not None:
                    agent.outbox.put_nowait(None)  # ends the stream; it registers again

    async def _persist(self, job_ids: tuple[str, ...]) -> None:
        if not job_ids:
            return
        items = [(pb.Job.FromString(self.state.jobs[j].job.SerializeToString()),
                  self.state.extra(j)) for j in job_ids if j in self.state.jobs]
        if items:
            revisions = await self._in_store(self._store.put_jobs, items)
            for (job, _), revision in zip(items, revisions, strict=True):
                live = self.state.jobs.get(job.job_id)
                if live is not None:  # what GetJob shows is what WatchJobs says
                    live.job.revision = revision
            self._notify_watchers()

    def _notify_watchers(self) -> None:
        for changed in self._job_watchers:
            changed.set()

    async def _warm(self) -> None:
        """Start the solver process now, not in the first round (spawn + imports)."""
        try:
            policy = await self._pool.warm()
        except Exception:
            log.exception("solver pool failed to start; rounds will retry it")
        else:
            self.policy = policy
            log.info("policy", name=policy.name, settings=policy_params.current(policy))

    async def _in_store(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(
            self._writer, functools.partial(fn, *args, **kw))

    # ------------------------------------------------------------ rounds

    async def _timer(self) -> None:
        while True:
            await self.clock.sleep(self.config.round_duration)
            self.post(sm.Tick(self.clock.time(), "timer"))
            # Off the timer's path: waiting for the store here would stretch every round.
            if self._upkeep is None or self._upkeep.done():  # else: the next tick
                self._upkeep = asyncio.create_task(self._store_upkeep(), name="sia-upkeep")

    async def _store_upkeep(self) -> None:
        """Once per timer round: save the rounds published since the last time, and
        trim the changelog (WatchJobs' history) to its newest entries."""
        await self._save_rounds()
        try:
            dropped = await self._in_store(self._store.compact)
        except Exception:  # StoreError: logged; the next round tries again
            log.exception("changelog compaction failed")
        else:
            if dropped:
                log.info("changelog compacted", dropped=dropped)

    async def _liveness(self) -> None:
        while True:
            await self.clock.sleep(self.config.heartbeat_interval)
            self.post(sm.Liveness(self.clock.time()))

    def _schedule_early(self, trigger: str) -> None:
        if self._early is not None and not self._early.done():
            return

        async def later() -> None:
            await self.clock.sleep(self.config.early_round_delay)
            self.post(sm.Tick(self.clock.time(), trigger, early=True))
        self._early = asyncio.create_task(later(), name="sia-early-round")

    async def _solve(self, action: sm.Solve) -> None:
        structlog.contextvars.bind_contextvars(round=action.round_no)
        try:
            result = await self._pool.solve(action.cluster, action.jobs, action.previous,
                                            timeout=self.config.solve_timeout)
            error = ""
        except TimeoutError:
            result, error = None, (f"solver timed out after {self.config.solve_timeout:g} s: "
                                   "previous allocation kept")
        except Exception as exc:
            log.exception("solve failed")
            result, error = None, f"solve failed ({type(exc).__name__}): previous allocation kept"
        self.post(sm.SolveFinished(self.clock.time(), action.round_no, result, error))

    def _round_done(self, rnd: pb.Round) -> None:
        """The round's decisions are made and its directives sent; it is published
        once they are all acknowledged (`_round_acked`)."""
        clock = self._round_clock.get(rnd.round)
        if clock is not None:
            clock[1] = time.time_ns()
        self._unacked_rounds[rnd.round] = rnd

    def _publish_round(self, rnd: pb.Round) -> None:
        """Into the round history (saved to the store with the timer) and to
        WatchRounds streams."""
        if not rnd.HasField("end_time"):
            rnd.end_time.FromNanoseconds(int(self.clock.time() * 1e9))
        self.rounds.append(rnd)
        self._unsaved_rounds.append(rnd)
        for q in list(self._round_watchers):
            q.put_nowait(rnd)

    async def _save_rounds(self) -> None:
        """The rounds published since the last save into the store, in one write per
        timer round (`_store_upkeep`) and at close, not one per round: a slow or locked
        store would hold up the creates queued behind each. A crash loses those."""
        batch, self._unsaved_rounds = self._unsaved_rounds, []
        if not batch:
            return
        try:
            await self._in_store(self._store.add_rounds, batch)
        except Exception:  # StoreError: kept for the next try, as many as the store keeps
            log.exception("rounds not saved", rounds=len(batch))
            self._unsaved_rounds[:0] = batch
            del self._unsaved_rounds[:-ROUNDS_KEPT]

    def _round_acked(self, round_no: int) -> None:
        rnd = self._unacked_rounds.pop(round_no, None)
        clock = self._round_clock.pop(round_no, None)
        if rnd is None or clock is None:
            return  # a late directive of an already published round
        tick, solved = clock
        end = time.time_ns()
        rnd.dispatch_ms = (end - solved) / 1e6
        rnd.total_ms = (end - tick) / 1e6
        self._publish_round(rnd)
        log.info("round", round=rnd.round, trigger=rnd.trigger, jobs=rnd.jobs,
                 gpus=rnd.gpus_allocated, moved=rnd.jobs_moved, solve_ms=round(rnd.solve_ms, 1),
                 total_ms=round(rnd.total_ms, 1), note=rnd.note or None)
        if self.telemetry is not None:
            # estimate, solve and place ran in the solver process: laid end to end from
            # the tick; the rest of the solve wait is queueing and transfer. A solve that
            # timed out or failed reported no timings: its phase is the whole wait (else
            # the solve histogram would count the slowest solves as 0 s).
            solve_ms = rnd.solve_ms
            if rnd.note and not (rnd.estimate_ms or solve_ms or rnd.place_ms):
                solve_ms = (solved - tick) / 1e6
            phases, t = [], tick
            for name, ms in (("estimate", rnd.estimate_ms), ("solve", solve_ms),
                             ("place", rnd.place_ms)):
                phases.append((name, t, t + int(ms * 1e6)))
                t += int(ms * 1e6)
            phases.append(("dispatch", max(t, solved), max(t, end)))
            self.telemetry.record_round(
                rnd.round, trigger=rnd.trigger, start_ns=tick, phases=phases,
                attributes={"jobs": rnd.jobs, "gpus": rnd.gpus_allocated,
                            "jobs_moved": rnd.jobs_moved, "objective": rnd.objective},
                error=rnd.note or None, end_ns=end)

    # ------------------------------------------------------------ jobs

    async def create_job(self, request: pb.CreateJobRequest) -> pb.Job:
        resolved = resolve(request.spec)
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
        job = pb.Job(job_id=request.job_id or f"{request.spec.name or 'job'}-"
                     f"{uuid.uuid4().hex[:8]}", spec=request.spec)
        if not request.job_id and len(job.job_id) > 63:
            job.job_id = f"job-{uuid.uuid4().hex[:12]}"
        now = self.clock.time()
        # As the state machine will have it, so the store, WatchJobs and the reply
        # agree with `sia ls` from the start (it profiles first).
        job.status.state = pb.JOB_STATE_PROFILING
        job.status.reason = "waiting: profiling on each GPU type"
        job.status.create_time.FromNanoseconds(int(now * 1e9))
        job.status.update_time.CopyFrom(job.status.create_time)
        fut = asyncio.get_running_loop().create_future()
        # Group commit: concurrent creates share one transaction.
        self._creates.append((job, request.request_id, fut))
        if self._create_flush is None or self._create_flush.done():
            self._create_flush = asyncio.create_task(self._flush_creates())
        stored, created = await fut
        if created:
            # Durable now; the state machine takes it up in order (no need to wait).
            self.post(sm.JobCreated(now, stored, resolved))
            log.debug("job created", job_id=stored.job_id, application=stored.spec.application)
            return stored
        if request.job_id and stored.job_id != request.job_id:
            raise already_exists("request", request.request_id,
                                 f"request_id: already used for job {stored.job_id!r}, "
                                 f"not {request.job_id!r}")
        self._pending_creates[request.spec.tenant] -= 1  # a repeat: nothing new to count
        current = self.state.job(stored.job_id)
        return pb.Job.FromString(current.SerializeToString()) if current else stored

    async def _flush_creates(self) -> None:
        while self._creates:
            batch, self._creates = self._creates, []
            try:
                results = await self._in_store(self._store.create_jobs,
                                               [(j, r) for j, r, _ in batch])
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
                    fut.set_result(res)

    async def get_job(self, job_id: str) -> pb.Job:
        """The live version; a job accepted a moment ago may be only in the store."""
        job = self.state.job(job_id)
        if job is not None:
            return pb.Job.FromString(job.SerializeToString())
        stored = await self._in_store(self._store.get_job, job_id)
        if stored is None:
            raise not_found("job", job_id)
        return stored.job

    async def cancel_job(self, job_id: str) -> pb.Job:
        await self.get_job(job_id)
        await self.submit(sm.JobCancelRequested(self.clock.time(), job_id))
        return await self.get_job(job_id)

    async def delete_job(self, job_id: str) -> None:
        job = await self.get_job(job_id)
        if job.status.state not in sm.TERMINAL:
            raise failed_precondition(
                f"job {job_id!r} is {state_name(job.status.state)}; cancel it first",
                "JOB_NOT_FINISHED")
        await self._in_store(self._store.delete_job, job_id)
        self._notify_watchers()
        await self.submit(sm.JobDeleted(self.clock.time(), job_id))

    async def watch_jobs(self, request: pb.WatchJobsRequest,
                         caller: Principal | None = None) -> AsyncIterator[pb.JobEvent]:
        """Job events; with a non-admin `caller`, only that tenant's jobs."""
        tenant = None if caller is None or caller.admin else caller.tenant

        def wanted(job: pb.Job) -> bool:
            return ((not request.job_id or job.job_id == request.job_id)
                    and (tenant is None or job.spec.tenant == tenant))

        rev = request.since_revision
        if rev == 0:
            rev = self._store.revision
            for stored in await self._in_store(self._store.all_jobs):
                if wanted(stored.job):
                    yield pb.JobEvent(kind=pb.JobEvent.KIND_SNAPSHOT, revision=stored.job.revision,
                                      job=stored.job)
        # Each watcher has its own event: cleared before it reads, set by every
        # commit, so a commit between its read and its wait is never missed.
        changed = asyncio.Event()
        self._job_watchers.add(changed)
        try:
            while self.status is Status.RUNNING:
                changed.clear()
                try:
                    events = await self._in_store(self._store.events_since, rev, 500)
                except StoreError as err:
                    raise failed_precondition(
                        f"since_revision {rev}: {err}; watch from 0 for a fresh snapshot",
                        "REVISION_COMPACTED") from None
                for revision, kind, job in events:
                    rev = revision
                    if wanted(job):
                        yield pb.JobEvent(kind=kind, revision=revision, job=job)
                if not events:
                    await changed.wait()
        finally:
            self._job_watchers.discard(changed)

    # ------------------------------------------------------------ nodes

    async def set_drain(self, node: str, reason: str | None) -> pb.Node:
        """Drain `node` (durably, before the state machine acts) or end its drain."""
        check_job_id(node, "node")
        if node not in self.state.nodes:
            raise not_found("node", node)
        await self._in_store(self._store.set_drain, node, reason)
        await self.submit(sm.NodeDrainChanged(self.clock.time(), node, reason))
        log.warning("node drained" if reason is not None else "node drain ended",
                    node_id=node, reason=reason, by=auth.current().name)
        return self.state.node_pb(node)

    async def forget_node(self, node: str) -> pb.Node:
        """Remove a LOST node and its drain; its last record."""
        check_job_id(node, "node")
        if node not in self.state.nodes:
            raise not_found("node", node)
        last = self.state.node_pb(node)
        if last.state != pb.NODE_STATE_LOST:
            raise _not_lost(node, last.state)
        await self.submit(sm.NodeForgotten(self.clock.time(), node))
        if node not in self.state.drained:  # the stored drain follows the state machine's
            await self._in_store(self._store.set_drain, node, None)
        back = self.state.nodes.get(node)
        if back is not None:  # its agent registered again in the meantime
            raise _not_lost(node, back.state)
        log.warning("node forgotten", node_id=node, by=auth.current().name)
        return last

    # ------------------------------------------------------------ agents

    def _check_takeover(self, old: _Agent, instance_id: str, new_peer: str) -> None:
        """May a new stream for `old.node_id` replace `old`? Yes for the same agent
        (its reconnect) and for a stream that ended or fell silent past the heartbeat
        timeout (a crashed agent must not lock its node out); otherwise this is a
        second agent with the node's id: ALREADY_EXISTS, and `old` is untouched."""
        if (instance_id and instance_id == old.instance_id) or old.context.done():
            return  # its own reconnect, or a stream that is over already
        silent = self.clock.time() - old.heard
        node, peer = old.node_id, old.peer
        if silent > self.config.heartbeat_timeout:
            log.warning("agent stream silent: replaced by a new one", node_id=node,
                        silent_s=round(silent, 1), old_peer=peer, peer=new_peer)
            return
        log.warning("second agent for a connected node refused", node_id=node,
                    connected=peer, refused=new_peer)
        raise ApiError(
            grpc.StatusCode.ALREADY_EXISTS,
            f"node {node!r} is already connected from {peer} (heard {silent:.0f} s ago): "
            f"a second agent with this node id is refused while that one is alive (give "
            f"this one another --node-id, or stop the other; it is replaced once silent for "
            f"{self.config.heartbeat_timeout:g} s)",
            reason="NODE_CONNECTED", metadata={"node": node, "peer": peer})

    async def agent_stream(self, requests, context) -> AsyncIterator[pb.ControllerMessage]:
        # The peer is read now, while the call is surely alive: gRPC's peer() on a
        # call the client has cancelled may read freed memory (a segfault seen in
        # the fuzz run; grpc/grpc#29927).
        peer = _peer(context)
        first = await anext(aiter(requests), None)
        if first is None:
            return
        if first.WhichOneof("kind") != "register":
            raise invalid("register", "the first message on the stream must be register")
        reg = first.register
        check_job_id(reg.node_id, "register.node_id")
        auth.check_node_id(reg.node_id)
        if len(reg.gpus) != 1 or reg.gpus[0].count == 0 or not reg.gpus[0].gpu_type:
            raise invalid("register.gpus", "one GPU type with a positive count per node")
        if reg.gpus[0].count > MAX_GPUS_PER_NODE:
            raise invalid("register.gpus[0].count", f"at most {MAX_GPUS_PER_NODE} GPUs per "
                          f"node, got {reg.gpus[0].count}")
        check_job_id(reg.gpus[0].gpu_type, "register.gpus[0].gpu_type")
        node = reg.node_id
        old = self._agents.get(node)
        if old is not None:
            self._check_takeover(old, reg.instance_id, peer)
            old.outbox.put_nowait(None)  # its own older stream, or a silent one: replaced
        agent = _Agent(node, asyncio.Queue(), context, reg.instance_id, self.clock.time(), peer)
        self._agents[node] = agent
        log.info("agent connected", node_id=node, gpu_type=reg.gpus[0].gpu_type,
                 gpus=reg.gpus[0].count)
        agent.outbox.put_nowait(pb.ControllerMessage(registered=pb.Registered(
            controller_version=VERSION,
            # Agents keep real time; the interval is in the controller's clock.
            heartbeat_interval_s=self.config.heartbeat_interval / self.clock.rate)))
        await self.submit(sm.AgentRegistered(
            self.clock.time(), node, reg.gpus[0].gpu_type, reg.gpus[0].count, reg.agent_version,
            tuple((r.job_id, r.generation, tuple(r.local_gpus)) for r in reg.running),
            tuple((r.job_id, r.generation, r.local_gpu) for r in reg.profiling), reg.draining))

        async def read() -> None:
            try:
                async for msg in requests:
                    agent.heard = self.clock.time()
                    if msg.WhichOneof("kind") is None:
                        continue
                    self.post(sm.AgentMessage(self.clock.time(), node, msg))
            finally:  # the stream ends with its reader, however that ends
                agent.outbox.put_nowait(None)

        reader = asyncio.create_task(read(), name=f"sia-agent-{node}")
        try:
            while True:
                msg = await agent.outbox.get()
                if msg is None:
                    break
                yield msg
            if reader.done() and not reader.cancelled():
                exc = reader.exception()
                if exc is not None and not isinstance(exc, grpc.aio.AioRpcError):
                    # An undecodable message: the agent is told, not left hanging.
                    log.warning("agent stream unreadable", node_id=node, error=repr(exc))
                    raise invalid("message", f"an AgentMessage could not be read: {exc!r}")
        finally:
            reader.cancel()
            await asyncio.wait([reader])  # its outcome was read above (or is moot)
            if self._agents.get(node) is agent:
                del self._agents[node]
                self.post(sm.AgentDisconnected(self.clock.time(), node))
                log.info("agent disconnected", node_id=node)


def _add_port(server: grpc.aio.Server, what: str, address: str,
              creds: grpc.ServerCredentials | None) -> int:
    """Bind `address` (TLS with `creds`); the bound port, or OSError naming it."""
    try:
        port = (server.add_secure_port(address, creds) if creds is not None
                else server.add_insecure_port(address))
    except RuntimeError as err:
        if "bind" not in str(err):  # grpc: a malformed certificate or key
            raise ConfigError(f"tls_cert/tls_key: {err}") from None
        port = 0  # taken since check_bindable looked: the same answer
    if port == 0:
        check_bindable(address, what)  # says why, when it can
        raise OSError(f"{what} {address}: cannot bind")
    return port


def _peer(context: grpc.aio.ServicerContext) -> str:
    """Where a stream comes from, e.g. "ipv4:10.0.0.3:51234" ("unknown" if gRPC cannot say)."""
    try:
        return context.peer() or "unknown"
    except Exception:  # a context without a transport (never expected on a live call)
        return "unknown"


def _not_lost(node: str, state: int) -> ApiError:
    return failed_precondition(
        f"node {node!r} is {node_state_name(state)}; only a LOST node can be forgotten "
        "(stop its agent, and it is LOST after heartbeat_timeout)", "NODE_NOT_LOST")


def _store_conflict(err: Exception, job_id: str) -> ApiError:
    from sia_grpc.controller.store import JobExists, RequestConflict

    if isinstance(err, JobExists):
        return already_exists("job", job_id)
    if isinstance(err, RequestConflict):
        return already_exists("request", job_id, "request_id: already used for a different spec")
    return unavailable(str(err), "STORE_UNAVAILABLE")


# ---------------------------------------------------------------- services


class JobService(api.JobServiceServicer):
    def __init__(self, controller: Controller) -> None:
        self.c = controller

    # Authorization: the caller (auth.current(), set by the interceptor) sees only
    # its tenant's jobs unless it is an admin. Another tenant's job answers
    # NOT_FOUND, exactly as a job that does not exist, so job ids do not leak.

    async def _own_job(self, job_id: str) -> pb.Job:
        job = await self.c.get_job(job_id)
        caller = auth.current()
        if not caller.admin and job.spec.tenant != caller.tenant:
            raise not_found("job", job_id)
        return job

    @rpc
    async def CreateJob(self, request, context):
        caller = auth.current()
        spec = request.spec
        if spec.tenant and spec.tenant != caller.tenant and not caller.admin:
            raise permission_denied(
                f"spec.tenant: {spec.tenant!r} is not your tenant; this token creates jobs "
                f"for tenant {caller.tenant!r} (leave spec.tenant empty or set it to that)",
                "TENANT_MISMATCH")
        if not spec.tenant and caller.tenant:
            spec.tenant = caller.tenant  # stamped before validation and the store see it
        return await self.c.create_job(request)

    @rpc
    async def GetJob(self, request, context):
        return await self._own_job(request.job_id)

    @rpc
    async def ListJobs(self, request, context):
        if request.page_size > 1000:
            raise invalid("page_size", "at most 1000")
        caller = auth.current()
        tenant = request.tenant
        if not caller.admin:
            if tenant and tenant != caller.tenant:
                raise permission_denied(
                    f"tenant: {tenant!r} is not your tenant; this token lists only the jobs "
                    f"of tenant {caller.tenant!r}", "TENANT_MISMATCH")
            tenant = caller.tenant
        try:
            jobs, token = await self.c._in_store(
                self.c._store.list_jobs, states=tuple(request.states), tenant=tenant,
                page_size=request.page_size or 100, page_token=request.page_token)
        except ValueError as err:  # the store's word on a malformed token
            raise invalid("page_token", str(err).split(": ", 1)[-1]) from None
        # The store lags the live state by at most one write: show the live version.
        live = [self.c.state.job(j.job_id) or j for j in jobs]
        return pb.ListJobsResponse(jobs=live, next_page_token=token)

    @rpc
    async def CancelJob(self, request, context):
        await self._own_job(request.job_id)
        return await self.c.cancel_job(request.job_id)

    @rpc
    async def DeleteJob(self, request, context):
        await self._own_job(request.job_id)
        await self.c.delete_job(request.job_id)
        return pb.DeleteJobResponse()

    async def WatchJobs(self, request, context):
        try:
            async for ev in self.c.watch_jobs(request, auth.current()):
                yield ev
        except ApiError as err:
            await context.abort_with_status(err.to_status())


class ClusterService(api.ClusterServiceServicer):
    def __init__(self, controller: Controller) -> None:
        self.c = controller

    @rpc
    async def GetCluster(self, request, context):
        caller = auth.current()
        out = self.c.state.cluster_pb(None if caller.admin else caller.tenant)
        out.policy = self.c.config.policy
        out.round_duration_s = self.c.config.round_duration
        return out

    @rpc
    async def ListRounds(self, request, context):
        limit = request.limit or 20
        return pb.ListRoundsResponse(rounds=list(self.c.rounds)[-limit:])

    @rpc
    async def DrainNode(self, request, context):
        _admin_only("DrainNode")
        if len(request.reason) > 256:
            raise invalid("reason", "at most 256 characters")
        return await self.c.set_drain(request.node, request.reason or "drained by an admin")

    @rpc
    async def UndrainNode(self, request, context):
        _admin_only("UndrainNode")
        return await self.c.set_drain(request.node, None)

    @rpc
    async def ForgetNode(self, request, context):
        _admin_only("ForgetNode")
        return await self.c.forget_node(request.node)

    async def WatchRounds(self, request, context):
        q: asyncio.Queue = asyncio.Queue()
        self.c._round_watchers.add(q)
        try:
            while self.c.status is Status.RUNNING:
                yield await q.get()
        finally:
            self.c._round_watchers.discard(q)


def _admin_only(what: str) -> None:
    caller = auth.current()
    if not caller.admin:
        raise permission_denied(f"{what}: only an admin may do this; this token is a "
                                f"{caller.role} of tenant {caller.tenant!r}", "ADMIN_ONLY")


class AgentService(api.AgentServiceServicer):
    def __init__(self, controller: Controller) -> None:
        self.c = controller

    async def Connect(self, request_iterator, context):
        try:
            async for msg in self.c.agent_stream(request_iterator, context):
                yield msg
        except ApiError as err:
            await context.abort_with_status(err.to_status())
