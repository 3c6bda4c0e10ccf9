"""The controller's async shell: gRPC services, the event queue, the round timer.

All decisions are `ControllerState.handle` (pure, synchronous); this module only
turns RPCs, agent streams and timers into events, one at a time, and carries out
the actions: persist (the store, on one writer thread, before an RPC says OK), send
to agents (only once that write has committed: write-ahead, `_process`), solve (in a
spawn process pool, never on the loop), publish rounds.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
import types
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar, cast

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
from sia_grpc.controller.agent_streams import AgentStreams
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.creates import Creates
from sia_grpc.controller.leadership import SQLITE_TERM, LeaderGate, Leadership, not_leader
from sia_grpc.controller.limits import TenantLimits
from sia_grpc.controller.listeners import Listeners
from sia_grpc.controller.round_log import ROUNDS_KEPT, RoundLog
from sia_grpc.controller.services import AgentService, ClusterService, JobService
from sia_grpc.controller.shell_base import AgentStream, Status
from sia_grpc.controller.solver_pool import SolverPool
from sia_grpc.controller.store import StoreError, describe, open_store
from sia_grpc.controller.stores import is_postgres
from sia_grpc.controller.validation import check_job_id
from sia_grpc.observability import setup_telemetry
from sia_grpc.policy import params as policy_params
from sia_grpc.security import auth
from sia_grpc.security.tokens import Principal

log = structlog.get_logger("sia.controller")
P = ParamSpec("P")
T = TypeVar("T")


def loop_factory():
    """uvloop's event loop when installed (faster gRPC and sockets), else asyncio's;
    for `asyncio.Runner(loop_factory=...)`, never a global policy."""
    try:
        import uvloop
    except ImportError:  # optional (not on Windows)
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class Controller(Listeners, Creates, RoundLog, AgentStreams, Leadership):
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
        # (each attribute is declared, with what it means, in shell_base.ShellBase)
        self.status = Status.CREATED
        self._limits = TenantLimits(config.max_active_jobs, config.create_rate,
                                    config.create_burst)
        self.port = 0
        self.agent_port = 0
        self.metrics_port = 0
        self._metrics = None
        self.tokens = None
        self._solves = set()
        self._agents = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="sia-store")
        self._store = None
        self._lock = None
        self._pool = SolverPool(config.policy_spec, inline=config.inline_solver)
        self.policy = None
        self._tasks = []
        self._server = None
        self._health = health.aio.HealthServicer()
        self._job_watchers = set()
        self._round_watchers = set()
        self._early = None
        self._upkeep = None
        self._create_flush = None
        self._election = None
        self._closing_term = 0
        self._collector_release = None
        self._collector_cap = None
        self._fresh_state()

    def _fresh_state(self) -> None:
        """The in-memory state as before any load: at creation, and when a leader
        steps down (a standby holds nothing; the next term loads it again)."""
        self.state = sm.ControllerState(sm.ControllerSettings.of(self.config))
        self._pending_creates = collections.Counter()
        self._oversubscribed = None
        self.rounds = collections.deque(maxlen=ROUNDS_KEPT)
        self._events = asyncio.Queue()
        self._unpersisted = set()
        self._persist_retry_at = 0.0
        self._creates = []
        self._round_clock = {}
        self._tick_began_ns = 0
        self._unacked_rounds = {}
        self._unsaved_rounds = []
        self._outgoing = []

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
        self._queues = self._read_queues()  # (so is a bad queues file)
        self._claim()  # a second controller on this store or address stops here
        self._serve_metrics()  # next: a port in use fails before anything else is open
        self._store = await self._in_store(open_store, self.config.store_target,
                                           password=self.config.store_password(),
                                           synchronous=self.config.store_synchronous,
                                           rounds_limit=ROUNDS_KEPT)
        self._shared = is_postgres(self.config.store_target)  # elected, not leader at once
        opts = [("grpc.max_receive_message_length", self.config.max_message_bytes),
                ("grpc.max_send_message_length", self.config.max_message_bytes),
                # Agents ping to detect a partition (AgentConfig.keepalive_s); gRPC's
                # default (one ping per 5 min without data) would GOAWAY them.
                ("grpc.http2.min_ping_interval_without_data_ms", 1000),
                ("grpc.keepalive_permit_without_calls", 1),
                # gRPC sets SO_REUSEPORT by default: a second controller on this port
                # would then serve beside this one, clients alternating between them.
                ("grpc.so_reuseport", 0)]
        # The gate first: a standby names the leader to any caller (an address is no secret).
        gate = LeaderGate(lambda: self.leading, lambda: self.leader_address)
        server = grpc.aio.server(options=opts, interceptors=[gate, self._auth])
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
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server = server
        self.status = Status.RUNNING
        await self._warm()  # ready only once the solver process can take a round
        if self._shared:  # a standby until it wins the lease (leadership.py)
            self._election = asyncio.create_task(self._elect(), name="sia-election")
        else:
            self.term = SQLITE_TERM
            await self._take_office()
            self._elected = True
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("controller started", listen=self.config.listen, port=self.port,
                 store=describe(self.config.store_target), standby=self._shared or None,
                 agent_port=self.agent_port or None, metrics_port=self.metrics_port or None,
                 tls=self.config.tls, jobs=len(self.state.jobs), policy=self.config.policy)

    async def _set_health(self, status: int) -> None:
        for name in ("", *api.SERVICE_NAMES):
            await self._health.set(name, status)

    async def _take_office(self) -> None:
        """Load the state from the store and start the event loop and the timers: at
        start on SQLite, on winning the lease on PostgreSQL (the store fenced first)."""
        assert self._store is not None  # (open from start on)
        now = self.clock.time()
        self.state.started_at = now
        for stored in await self._in_store(self._store.all_jobs):
            self.state.restore(stored.job, stored.extra, now)
        for node, reason in (await self._in_store(self._store.drains)).items():
            self.state.restore_drain(node, reason, now)
        self.state.queues = self._queues  # (before any event: the state machine's from the start)
        self._queues_in_force(self._queues)
        # The round history outlives a restart, and round numbers go on from it.
        self.rounds.extend(await self._in_store(self._store.rounds))
        if self.rounds:
            self.state.restore_rounds(self.rounds[-1].round)
        self._tasks = [asyncio.create_task(self._process(), name="sia-events"),
                       asyncio.create_task(self._timer(), name="sia-rounds"),
                       asyncio.create_task(self._liveness(), name="sia-liveness")]
        if self._shared:
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def _leave_office(self) -> None:
        """Step down: NOT_SERVING, rounds and timers stopped, waiting calls failed,
        agent streams ended, the in-memory state dropped (a standby holds nothing)."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._stop_work(drop_queued=True)
        refused = not_leader(self.leader_address)
        while not self._events.empty():
            _, done = self._events.get_nowait()
            if done is not None and not done.done():
                done.set_exception(refused)
        for _, _, fut in self._creates:
            if not fut.done():
                fut.set_exception(refused)
        for _ in range(3):  # continuations of what was just answered run now, refused
            await asyncio.sleep(0)
        self._fresh_state()
        log.info("in-memory state dropped; standby")

    async def _stop_work(self, *, drop_queued: bool = False) -> None:
        """Cancel the timers, the event loop and the solves; end every agent stream
        (with `drop_queued`, what is still queued to an agent is never sent) and
        every watch."""
        self._resume_collector()  # (a round in flight now never ends)
        self._notify_watchers()  # open WatchJobs streams see `serving` off and end
        for q in self._round_watchers:
            q.put_nowait(None)
        for t in [*self._tasks, *self._solves, self._early, self._create_flush]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*[t for t in (*self._tasks, *self._solves) if t],
                             return_exceptions=True)
        self._tasks = []
        for agent in self._agents.values():
            while drop_queued and not agent.outbox.empty():
                agent.outbox.get_nowait()
            agent.outbox.put_nowait(None)

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
        await self._health.enter_graceful_shutdown()
        # Out of office at once (new calls are refused, naming no one); the lease is
        # released after the last write.
        self._closing_term, self._elected = (self.term if self._elected else 0), False
        if self._election is not None:
            self._election.cancel()
            await asyncio.gather(self._election, return_exceptions=True)
        await self._stop_work()
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
            if self._shared and self._closing_term:  # after the last write: the standby leads
                await self._release_lease(self._closing_term)
            await self._in_store(self._store.close)
        self._writer.shutdown(wait=True)
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------ events

    async def submit(self, event: sm.Event) -> None:
        """Handle `event` and carry out its actions; returns once they are durable."""
        if not self._elected:  # a call that began as the leader stepped down
            raise not_leader(self.leader_address)
        done = asyncio.get_running_loop().create_future()
        await self._events.put((event, done))
        await done

    def post(self, event: sm.Event) -> None:
        if self._elected:  # else: a late event of a term that ended (its state is gone)
            self._events.put_nowait((event, None))

    async def _process(self) -> None:
        """Handle queued events in batches: decide each in order, carry out the
        actions, write every touched job in one transaction, then send what the
        batch decided to tell agents and answer the RPCs waiting on them (group
        commit: 1,000 events cost one fsync, not 1,000).

        Write-ahead, enforced here (it is about I/O order, so not a state-machine
        invariant): no message leaves for an agent before the state it follows from
        is durable. A RUN sent before its round's write commits, by a leader killed
        in between, starts a worker the store does not know of, and the next leader
        stops it again (a needless restart); a STOP that ends a job, the same with
        its record still RUNNING in the store. So the batch's messages wait, in
        order, for the batch's commit (one per batch, not one per directive), and
        while any write is failing nothing is sent at all: a failed write's
        messages go out after it is retried and commits, or never, once the term
        ends (`Fenced`: a deposed leader's decisions are dropped with its state)."""
        while True:
            batch = [await self._events.get()]
            while not self._events.empty() and len(batch) < 1024:
                batch.append(self._events.get_nowait())
            touched: dict[str, None] = {}
            failed: dict[int, Exception] = {}
            for k, (event, _) in enumerate(batch):
                if isinstance(event, sm.JobCreated):  # the state machine counts it now
                    self._pending_creates[event.job.spec.tenant] -= 1
                if type(event) is sm.Tick:  # (its round's jobs are built in the pause)
                    self._tick_began_ns = time.time_ns()
                    self._pause_collector()
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
                if type(event) is sm.Tick and not self._round_clock:  # no round began
                    self._resume_collector()
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
            if not self._unpersisted:  # everything decided so far is in the store
                self._send_outgoing()
            for k, (_, done) in enumerate(batch):
                if done is not None and not done.done():
                    failure = failed.get(k) or error
                    if failure is None:
                        done.set_result(None)
                    else:
                        done.set_exception(failure)

    def _perform(self, action: sm.Action) -> None:
        match action:
            case sm.Send():
                agent = self._agents.get(action.node_id)
                if agent is not None:  # else: re-sent when it reconnects
                    self._outgoing.append((agent, action.message))  # after the commit
            case sm.Solve():  # (from the tick's handling on: it built the round's jobs)
                self._round_clock[action.round_no] = [self._tick_began_ns, 0]
                # Kept, so close() can wait for it (a dropped task may be collected).
                task = asyncio.create_task(self._solve(action), name=f"sia-solve-{action.round_no}")
                self._solves.add(task)
                task.add_done_callback(self._solves.discard)
            case sm.RoundDone():
                self._round_done(action.round)
                self._check_oversubscribed()
                if self.telemetry is not None:
                    self.telemetry.count_preemptions(action.preempted)
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
                if agent is not None:  # ends the stream (behind what was decided before)
                    self._outgoing.append((agent, None))  # it registers again

    def _send_outgoing(self) -> None:
        """Hand the messages decided so far to their streams, in order: called once
        the store holds every state change they follow from (`_process`)."""
        outgoing, self._outgoing = self._outgoing, []
        for agent, message in outgoing:
            agent.outbox.put_nowait(message)

    async def _persist(self, job_ids: tuple[str, ...]) -> None:
        assert self._store is not None  # (open from start on)
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

    async def _in_store(self, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
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
        assert self._store is not None  # (open from start on)
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
                                            timeout=self.config.solve_timeout,
                                            queues=action.queues)
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
        return self.status is Status.RUNNING and self._elected

    @property
    def agents(self) -> Mapping[str, AgentStream]:
        """The agents connected now, by node id (a read-only view): who is on each
        stream (`instance_id`, `peer`) and when it was last heard (`heard`, on the
        controller's clock). GetCluster is the API's view of the nodes; this one is
        for the process that embeds the controller (demos, test harnesses)."""
        return types.MappingProxyType(self._agents)

    async def list_jobs(self, *, states: tuple[int, ...], tenant: str, page_size: int,
                        page_token: str) -> tuple[list[pb.Job], str]:
        """A page of jobs from the store, each in its live version (the store lags
        the live state by at most one write); ValueError for a malformed token."""
        assert self._store is not None  # (open from start on)
        jobs, token = await self._in_store(self._store.list_jobs, states=states, tenant=tenant,
                                           page_size=page_size, page_token=page_token)
        return [self.state.job(j.job_id) or j for j in jobs], token

    async def get_job(self, job_id: str) -> pb.Job:
        """The live version; a job accepted a moment ago may be only in the store."""
        assert self._store is not None  # (open from start on)
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
        assert self._store is not None  # (open from start on)
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
        assert self._store is not None  # (open from start on)
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
                        # (the store keeps the kind as its number)
                        yield pb.JobEvent(kind=cast("pb.JobEvent.Kind", kind),
                                          revision=revision, job=job)
                if not events:
                    await changed.wait()
            self._check_office()
        finally:
            self._job_watchers.discard(changed)

    # ------------------------------------------------------------ nodes

    async def set_drain(self, node: str, reason: str | None) -> pb.Node:
        """Drain `node` (durably, before the state machine acts) or end its drain."""
        assert self._store is not None  # (open from start on)
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
        assert self._store is not None  # (open from start on)
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


