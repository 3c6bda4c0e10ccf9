"""The controller: its async shell assembled from its parts, started and closed, and
its timers.

All decisions are `ControllerState.handle` (pure, synchronous); the shell only
turns RPCs, agent streams and timers into events, one at a time, and carries out
the actions: persist (the store, on one writer thread, before an RPC says OK), send
to agents (only once that write has committed: write-ahead, `event_loop`), solve (in
a spawn process pool, never on the loop: `_solve` here), publish rounds
(`round_log`). The parts are listed in `controller/shell/__init__.py`.
"""

from __future__ import annotations

import asyncio
import collections
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sia_grpc import api
from sia_grpc.api import pb
from sia_grpc.clock import Clock, WallClock
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.service.services import AgentService, ClusterService, JobService
from sia_grpc.controller.shell.agent_streams import AgentStreams
from sia_grpc.controller.shell.api_calls import ApiCalls
from sia_grpc.controller.shell.base import Status
from sia_grpc.controller.shell.creates import Creates
from sia_grpc.controller.shell.event_loop import EventLoop
from sia_grpc.controller.shell.leadership import SQLITE_TERM, LeaderGate, Leadership, not_leader
from sia_grpc.controller.shell.limits import TenantLimits
from sia_grpc.controller.shell.listeners import Listeners
from sia_grpc.controller.shell.round_log import ROUNDS_KEPT, RoundLog
from sia_grpc.controller.shell.solver_pool import SolverPool
from sia_grpc.controller.stores import describe, is_postgres, open_store
from sia_grpc.observability import setup_telemetry
from sia_grpc.policy import params as policy_params

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


class Controller(EventLoop, ApiCalls, Listeners, Creates, RoundLog, AgentStreams, Leadership):
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
        # (each attribute is declared, with what it means, in base.ShellBase)
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
        self._event_watchers = set()
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
        self._pending_events = []
        self._told = {}

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
        from sia_grpc.controller.service.policy_service import PolicyService
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
            self._told[stored.job.job_id] = (stored.job.status.state, stored.job.status.reason)
        for node, reason in (await self._in_store(self._store.drains)).items():
            self.state.restore_drain(node, reason, now)
        self.state.queues = self._queues  # (before any event: the state machine's from the start)
        self._queues_in_force(self._queues)
        # The round history outlives a restart, and round numbers go on from it.
        # (in (term, round) order: the store keeps them in the order they were published)
        self.rounds.extend(sorted(await self._in_store(self._store.rounds),
                                  key=lambda r: (r.term, r.round)))
        if self.rounds:
            self.state.restore_rounds(self.rounds[-1].round)
        who = getattr(self, "_holder", "") or "the controller"
        self._note(pb.EVENT_KIND_LEADER,
                   f"{who} took office at term {self.term}: "
                   f"{len(self._told)} jobs, {len(self.state.drained)} drains loaded; rounds "
                   f"go on from {self.rounds[-1].round + 1 if self.rounds else 1}",
                   taking_office=True)
        try:  # the term's first event, before it serves anything
            await self._persist(())
        except Exception:  # StoreError: it goes with the first batch's write instead
            log.exception("the Leader event not written yet; retried with the next write")
        self._tasks = [asyncio.create_task(self._process(), name="sia-events"),
                       asyncio.create_task(self._timer(), name="sia-rounds"),
                       asyncio.create_task(self._liveness(), name="sia-liveness")]
        # A new leader with work to do acts at once (an early round), not at its first
        # timer round: a drain or a submit just before a handover (their early round
        # died with the old leader) is acted on within early_round_delay.
        if self.state.drained or any(r.state not in sm.TERMINAL
                                     for r in self.state.jobs.values()):
            self._schedule_early("took office")
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
            await self._save_history()
            if self._shared and self._closing_term:  # after the last write: the standby leads
                await self._release_lease(self._closing_term)
            await self._in_store(self._store.close)
        self._writer.shutdown(wait=True)
        if self._lock is not None:
            self._lock.release()



    async def _warm(self) -> None:
        """Start the solver process now, not in the first round (spawn + imports)."""
        try:
            policy = await self._pool.warm()
        except Exception:
            log.exception("solver pool failed to start; rounds will retry it")
        else:
            self.policy = policy
            log.info("policy", name=policy.name, settings=policy_params.current(policy))


    # ------------------------------------------------------------ rounds

    async def _timer(self) -> None:
        while True:
            await self.clock.sleep(self.config.round_duration)
            self.post(sm.Tick(self.clock.time(), "timer"))
            # Off the timer's path: waiting for the store here would stretch every round.
            if self._upkeep is None or self._upkeep.done():  # else: the next tick
                self._upkeep = asyncio.create_task(self._store_upkeep(), name="sia-upkeep")

    async def _save_history(self) -> None:
        """At close: the events and rounds published since the last batch's write."""
        try:
            await self._persist(())
        except Exception:  # StoreError, Fenced: what the last batch did not write is lost
            log.exception("events and rounds not saved at close",
                          events=len(self._pending_events), rounds=len(self._unsaved_rounds))

    async def _store_upkeep(self) -> None:
        """Once per timer round: trim the changelog (WatchJobs' history) and the event
        history to their newest entries."""
        assert self._store is not None  # (open from start on)
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
