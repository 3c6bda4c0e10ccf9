"""What the controller's shell is made of. `Controller` (server.py) is assembled from
parts, one per module (`EventLoop`, `ApiCalls`, `Listeners`, `Creates`, `RoundLog`,
`AgentStreams`, `Leadership`), that read and set each other's attributes; every part
inherits `ShellBase`, so each attribute is declared here once, with its type and what it
means, and the type checker sees it in every part. (`books.StateBase` is the same
for the state machine's parts.)

`Controller.__init__` and `_fresh_state` set the attributes; those with a value here
are class defaults until set. The methods under TYPE_CHECKING are what one part calls
of another, for the type checker only (each is defined in the module named; mypy
checks that the definitions match these).
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import grpc
from grpc_health.v1 import health

from sia_grpc.api import pb
from sia_grpc.clock import Clock
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.shell.exclusive import StoreLock
from sia_grpc.controller.shell.limits import TenantLimits
from sia_grpc.controller.shell.solver_pool import SolverPool
from sia_grpc.controller.stores import JobStore
from sia_grpc.observability import MetricsServer, Telemetry
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import Policy
from sia_grpc.security import auth
from sia_grpc.security.tokens import TokenStore

P = ParamSpec("P")
T = TypeVar("T")


class Status(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass
class AgentStream:
    """One agent's open stream, as `Controller.agents` lists it. Read it; only the
    controller changes it (`outbox` holds the messages queued to the agent)."""

    node_id: str
    # The messages to send, in order; None ends the stream.
    outbox: asyncio.Queue[pb.ControllerMessage | None]
    context: grpc.aio.ServicerContext[Any, Any]
    instance_id: str = ""  # Register.instance_id: the same agent reconnecting
    heard: float = 0.0  # controller clock: its last message (Register included)
    peer: str = "unknown"  # where the stream comes from, read once when it opened


class ShellBase:
    """The attributes of `Controller`, declared once for all its parts."""

    # -- set once, by Controller.__init__ ------------------------------------------
    # The controller's configuration.
    config: ControllerConfig
    # Its clock (the wall clock, or a test's): timestamps, round and liveness timers.
    clock: Clock
    # Rounds, gauges, lease failures (observability); None: none recorded.
    telemetry: Telemetry | None
    # Where in its life the controller is (start, close).
    status: Status
    # Each tenant's active-job limit and create rate (CreateJob).
    _limits: TenantLimits
    # The bound gRPC port (0 until bound).
    port: int
    # The mutual-TLS port for agents (0: agents use `port`).
    agent_port: int
    # Where /metrics is served (0: metrics_listen is off).
    metrics_port: int
    # The /metrics server (with metrics_listen, once started).
    _metrics: MetricsServer | None
    # The bearer tokens (tokens_file); None: every caller is an anonymous admin.
    tokens: TokenStore | None
    # The solves in flight (kept so that close() can wait for them).
    _solves: set[asyncio.Task[None]]
    # The agents' open streams, by node id.
    _agents: dict[str, AgentStream]
    # The one thread that runs the store's calls (`_in_store`), in order.
    _writer: ThreadPoolExecutor
    # The store (opened by start, closed by close; None before).
    _store: JobStore | None
    # The lock on the store file, for the controller's life (SQLite; None: none).
    _lock: StoreLock | None
    # The solver process(es) that run the rounds' policy.
    _pool: SolverPool
    # The policy as the solver process built it (at start-up; None until then).
    policy: Policy | None
    # The event loop, the round timer and the liveness timer, while in office.
    _tasks: list[asyncio.Task[None]]
    # The gRPC server (None until started).
    _server: grpc.aio.Server | None
    # The health service: SERVING while the controller leads.
    _health: health.aio.HealthServicer
    # One per WatchJobs, set on commits.
    _job_watchers: set[asyncio.Event]
    # One per WatchRounds: the rounds published (None: the stream ends).
    _round_watchers: set[asyncio.Queue[pb.Round | None]]
    # The early round waiting to be posted (`_schedule_early`).
    _early: asyncio.Task[None] | None
    # The timer's store upkeep (saves rounds, compacts the changelog).
    _upkeep: asyncio.Task[None] | None
    # The task that writes the creates queued (`_flush_creates`).
    _create_flush: asyncio.Task[None] | None
    # The election loop, on a shared store.
    _election: asyncio.Task[None] | None
    # The term close() found this controller leading in (0: none).
    _closing_term: int
    # A round's pause of the cyclic collector: what ends it (None: not paused).
    _collector_release: Callable[[], None] | None
    # The timer that ends that pause at the latest.
    _collector_cap: asyncio.TimerHandle | None

    # -- set by start ----------------------------------------------------------------
    # The gRPC interceptor that authenticates callers.
    _auth: auth.AuthInterceptor
    # The queues in force (queues_file or the config's; replaced by a reload).
    _queues: QueueSet

    # -- the in-memory state, made again when a leader steps down (_fresh_state) -------
    # The state machine: every decision.
    state: sm.ControllerState
    # Creates admitted, not yet handled by the state machine, by tenant.
    _pending_creates: collections.Counter[str]
    # The oversubscribed guarantees last warned of, by GPU type (None: none yet).
    _oversubscribed: dict[str, int] | None
    # The published rounds (ListRounds), the newest ROUNDS_KEPT.
    rounds: collections.deque[pb.Round]
    # The events to handle, each with the future of the call waiting on it (or None).
    _events: asyncio.Queue[tuple[sm.Event, asyncio.Future[None] | None]]
    # Jobs whose last write failed.
    _unpersisted: set[str]
    # (monotonic) when to write them again.
    _persist_retry_at: float
    # Creates waiting for their group commit: the job, its request id, and the future
    # of its (stored job, created) or its error.
    _creates: list[tuple[pb.Job, str, asyncio.Future[tuple[pb.Job, bool]]]]
    # round -> [tick ns, solve done ns]; the round is published when acknowledged.
    _round_clock: dict[int, list[int]]
    # When the tick being handled was taken up (ns).
    _tick_began_ns: int
    # Rounds decided, waiting for the acknowledgement of their directives.
    _unacked_rounds: dict[int, pb.Round]
    # Published, not yet in the store (written with the next batch: `_persist`).
    _unsaved_rounds: list[pb.Round]
    # The cluster's events decided, waiting for the next batch's write (they are
    # written with it, in the same transaction: `event_loop._persist`).
    _pending_events: list[pb.Event]
    # Each job's (state, reason) as last written: a write that changes either is
    # recorded as the job's JOB_CHANGED event.
    _told: dict[str, tuple[int, str]]
    # WatchEvents streams, each woken by every commit that recorded events.
    _event_watchers: set[asyncio.Event]
    # Messages to agents (None: end the stream) decided, waiting for the store write
    # of what they follow from (`_process`); each bound to the stream it was decided
    # for. Dropped, never sent, when the term ends.
    _outgoing: list[tuple[AgentStream, pb.ControllerMessage | None]]

    # -- the election (leadership.py) ------------------------------------------------
    # The term this controller leads (or last led) in; 0: never.
    term: int = 0
    # The leader's advertised address, as a standby last read it.
    leader_address: str = ""
    # Monotonic: where this controller's view of its lease ends.
    _lease_end: float = 0.0
    # In office (fenced, loaded); `leading` also checks the lease.
    _elected: bool = False
    # On a shared store: elected, not leader at once.
    _shared: bool = False
    # The term an agent had seen that ends this term (0: none).
    _outranked_by: int = 0
    # Set when an agent outranks this term.
    _resign: asyncio.Event | None = None
    # (term, from, to): when this controller acted as leader, on its monotonic clock
    # (`to` None while it still does); the newest 100 terms. Made on first use.
    offices: collections.deque[tuple[int, float, float | None]]
    # Who this controller is in the lease: host, pid and a random suffix (`holder`).
    _holder: str
    # The term `_greeted_nodes` is of.
    _greeted_term: int
    # The nodes this controller sent a Registered in that term.
    _greeted_nodes: set[str]

    if TYPE_CHECKING:
        # What one part calls of another.

        # event_loop.py
        async def _in_store(self, fn: Callable[P, T], *args: P.args,
                            **kw: P.kwargs) -> T: ...
        async def submit(self, event: sm.Event) -> None: ...
        def post(self, event: sm.Event) -> None: ...
        def _notify_watchers(self) -> None: ...
        async def _persist(self, job_ids: tuple[str, ...]) -> None: ...
        def _note(self, kind: pb.EventKind, message: str, *, at: float | None = None,
                  node: str = "", job_id: str = "", queue: str = "",
                  round_no: int = 0, taking_office: bool = False) -> None: ...

        # server.py
        async def _take_office(self) -> None: ...
        async def _leave_office(self) -> None: ...
        def _schedule_early(self, trigger: str) -> None: ...
        async def _solve(self, action: sm.Solve) -> None: ...

        # api_calls.py
        @property
        def serving(self) -> bool: ...

        # round_log.py
        def _pause_collector(self) -> None: ...
        def _resume_collector(self) -> None: ...
        def _round_done(self, rnd: pb.Round) -> None: ...
        def _publish_round(self, rnd: pb.Round) -> None: ...
        def _round_acked(self, round_no: int, interrupted: str = "") -> None: ...

        # listeners.py
        def _check_oversubscribed(self) -> None: ...

        # leadership.py
        @property
        def leading(self) -> bool: ...
        def _check_office(self) -> None: ...
        def _check_agent_term(self, node: str, seen: int) -> None: ...
        def _greeted(self) -> set[str]: ...

