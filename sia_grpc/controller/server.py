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
import types
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sia_grpc import api
from sia_grpc.api import node_state_name, pb, state_name
from sia_grpc.api.errors import (
    ApiError,
    failed_precondition,
    not_found,
)
from sia_grpc.clock import Clock, WallClock
from sia_grpc.controller import state as sm
from sia_grpc.controller.agent_streams import AgentStream, AgentStreams
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.creates import Creates
from sia_grpc.controller.exclusive import StoreLock
from sia_grpc.controller.limits import TenantLimits
from sia_grpc.controller.listeners import Listeners
from sia_grpc.controller.round_log import ROUNDS_KEPT, RoundLog
from sia_grpc.controller.services import AgentService, ClusterService, JobService
from sia_grpc.controller.solver_pool import SolverPool
from sia_grpc.controller.store import Store as JobStore
from sia_grpc.controller.store import StoreError
from sia_grpc.controller.validation import check_job_id
from sia_grpc.observability import MetricsServer, setup_telemetry
from sia_grpc.policy import params as policy_params
from sia_grpc.policy.types import Policy
from sia_grpc.security import auth
from sia_grpc.security.tokens import Principal, TokenStore

log = structlog.get_logger("sia.controller")


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


class Controller(Listeners, Creates, RoundLog, AgentStreams):
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
        self.state = sm.ControllerState(sm.ControllerSettings.of(config))
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
        self._solves: set[asyncio.Task] = set()  # solves in flight
        self._persist_retry_at = 0.0  # (monotonic) when to write them again
        self._agents: dict[str, AgentStream] = {}
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

    # ------------------------------------------------------------ security

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
        for t in [*self._tasks, *self._solves, self._early, self._create_flush]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*[t for t in (*self._tasks, *self._solves) if t],
                             return_exceptions=True)
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
                # Kept, so close() can wait for it (a dropped task may be collected).
                task = asyncio.create_task(self._solve(action), name=f"sia-solve-{action.round_no}")
                self._solves.add(task)
                task.add_done_callback(self._solves.discard)
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

    # ------------------------------------------------------------ jobs

    @property
    def serving(self) -> bool:
        return self.status is Status.RUNNING

    @property
    def agents(self) -> Mapping[str, AgentStream]:
        """The agents connected now, by node id (a read-only view): who is on each
        stream (`instance_id`, `peer`) and when it was last heard (`heard`, on the
        controller's clock). GetCluster is the API's view of the nodes; this one is
        for the process that embeds the controller (demos, test harnesses)."""
        return types.MappingProxyType(self._agents)

    async def list_jobs(self, *, states: tuple[int, ...], tenant: str | None, page_size: int,
                        page_token: str) -> tuple[list[pb.Job], str]:
        """A page of jobs from the store, each in its live version (the store lags
        the live state by at most one write); ValueError for a malformed token."""
        jobs, token = await self._in_store(self._store.list_jobs, states=states, tenant=tenant,
                                           page_size=page_size, page_token=page_token)
        return [self.state.job(j.job_id) or j for j in jobs], token

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
            while self.serving:
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


def _not_lost(node: str, state: int) -> ApiError:
    return failed_precondition(
        f"node {node!r} is {node_state_name(state)}; only a LOST node can be forgotten "
        "(stop its agent, and it is LOST after heartbeat_timeout)", "NODE_NOT_LOST")


# ---------------------------------------------------------------- services


