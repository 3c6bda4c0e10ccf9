"""The controller's state, declared once: the books `ControllerState` keeps.

Each book is a dataclass that owns its fields, with what each one means; the state
holds one of each (`StateBase`), and the parts that handle events (`agents`,
`rounds`, `profiling`, `moves`, `ledger`, `state` itself) reach a field only
through its book: `self.move_book.moving`, never a bare attribute of the state.

    JobBook        the job records, and the jobs not yet ended per tenant
    NodeBook       the node records, the drains, the rendezvous ports per master node
    RoundBook      the round count, the solve in flight and what it was given, skips
    DirectiveBook  directives sent and not yet acknowledged: by id, by round, the STOPs
                   by (job, node); the RUNs agents refused
    MoveBook       jobs waiting for stops or GPUs to start again, in line, and the
                   nodes each waits on
    ProfileBook    jobs that may need a pass, passes shared between identical jobs,
                   the profile cache
    ChangeBook     what changed since the scans last looked (GPUs freed, moves woken,
                   passes changed, jobs that released GPUs): marks, reset by the scan
                   that reads them

Each handler module says in its docstring which books it changes ("Changes:");
tests/controller/test_books.py checks the claim against the code. A record's own
fields (`JobRec`, `NodeRec`: a job's state, a node's holders) are not a book's: they
are changed by the parts that handle that record, along `transitions.TRANSITIONS`.

The rules the books keep together (a STOP in `DirectiveBook.stops_due` for every
STOP pending, every moving job in `MoveBook.moving`, every GPU held explained) are
`invariants.check_invariants`, run after every event by the tests.
"""

from __future__ import annotations

import collections
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sia_grpc.api import pb
from sia_grpc.controller.machine.events import ControllerSettings
from sia_grpc.controller.machine.records import JobRec, NodeRec
from sia_grpc.models.efficiency import GradParams
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import JobAllocation, PolicyJob

# What a 1-GPU profile depends on (`profiling.profile_key`): application, command,
# GPUs per replica, GPU type, the type's micro-batch limits (min, max).
ProfileKey = tuple[str, tuple[str, ...], int, str, "tuple[int, int] | None"]

if TYPE_CHECKING:
    from sia_grpc.controller.machine.events import Action, AgentRegistered, Send
    from sia_grpc.policy.cluster import Cluster

# A directive sent and not yet acknowledged: (job, node, action, the message as sent).
Pending = tuple[str, str, int, pb.ControllerMessage]


@dataclass(frozen=True)
class CachedProfile:
    """What one pass measured on one GPU type: (batch size, step, sync) seconds."""

    points: tuple[tuple[int, float, float], ...]
    grad: GradParams | None


@dataclass(frozen=True)
class SolveInputs:
    """What a round's solve was given, for explaining its result (`policy.queues.outcome`)."""

    round_no: int
    queues: QueueSet | None
    jobs: tuple[PolicyJob, ...]
    previous: dict[str, JobAllocation]
    capacity: dict[str, int]


@dataclass(eq=False, slots=True)
class JobBook:
    """The jobs. Added by a create or a restore, dropped only by a delete."""

    # Every job by id, ended ones included until deleted.
    jobs: dict[str, JobRec] = field(default_factory=dict)
    # Jobs not yet ended, per tenant: the per-tenant active-job limit reads it
    # (`creates`); kept exact with every create, restore, end and delete.
    active_by_tenant: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass(eq=False, slots=True)
class NodeBook:
    """The nodes, their drains, the rendezvous ports handed out on them."""

    # Every node by name: registered, restored from the store (`NodeRec.restored`), or
    # lost (until forgotten). A node's GPUs and who holds them: `NodeRec.holder`.
    nodes: dict[str, NodeRec] = field(default_factory=dict)
    # Drained nodes (admin) -> reason. Kept apart from node records: a drain
    # outlives the agent's stream, and is restored before the agent returns.
    drained: dict[str, str] = field(default_factory=dict)
    # Master node -> rendezvous port -> the job last given it (`Moves._master_port`).
    ports: dict[str, dict[int, str]] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class RoundBook:
    """Scheduling rounds: how many ran, the one being solved, why none ran."""

    # The last round started (a solve asked for); continues the stored rounds' count.
    round_no: int = 0
    # The round whose solve is in flight, or None: one solve at a time.
    solving: int | None = None
    # When the round in flight began, and what began it ("timer", "arrival", ...).
    started: float = 0.0
    trigger: str = "timer"
    # The solve in flight's inputs, for explaining its result (`Rounds._queue_outcome`).
    solve_inputs: SolveInputs | None = None
    # Why the last round did not run ("" once one ran): each reason is said once.
    last_skip: str = ""
    # The trigger of an early round that came while a solve ran: run once it is done.
    early_after_solve: str = ""


@dataclass(eq=False, slots=True)
class DirectiveBook:
    """Directives (RUN, STOP) sent to agents and not yet acknowledged."""

    # The last directive id given. Ids are unique across controller restarts: a
    # random base.
    next_id: int = field(default_factory=lambda: secrets.randbits(40) << 20)
    # Directive id -> (job, node, action, message) until acknowledged: sent again,
    # unchanged, when their agent reconnects.
    pending: dict[int, Pending] = field(default_factory=dict)
    # Round -> its directives not yet acknowledged (an index of `pending`): a round is
    # acknowledged (`RoundAcked`) once its solve is done and this is empty. A
    # directive to an agent that disconnected leaves it (it stays pending, to be sent
    # again): a round does not wait for an agent that is gone.
    round_acks: dict[int, set[int]] = field(default_factory=dict)
    # Round -> why it finished without every acknowledgement (its record's note).
    interrupted: dict[int, str] = field(default_factory=dict)
    # STOPs pending per (job, node): an index of `pending`, kept exact with it.
    stops_due: collections.Counter[tuple[str, str]] = field(
        default_factory=collections.Counter)
    # RUN directives an agent refused (should stay 0: the books gave it busy GPUs).
    refused: int = 0


@dataclass(eq=False, slots=True)
class MoveBook:
    """Jobs whose allocation changed, waiting for stops or GPUs to start again."""

    # Job -> its place in line (first come, first dispatched); a job moved again
    # keeps its place. Exactly the jobs whose record says `moving`.
    moving: dict[str, int] = field(default_factory=dict)
    # The last place in line given.
    seq: int = 0
    # Moves that could not start, by the nodes their targets need (`GpuLedger._wait_on`):
    # node -> the jobs waiting on it, and job -> the nodes it waits on (the reverse).
    waiting_on: dict[str, set[str]] = field(default_factory=dict)
    waits: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class ProfileBook:
    """Profiling passes wanted and shared, and the profiles kept for reuse."""

    # Jobs that may still need a profiling pass, oldest first (a dict as an ordered
    # set: the first to come is the first profiled).
    to_profile: dict[str, None] = field(default_factory=dict)
    # 1-GPU profiles by what they depend on (`profiling.profile_key`), for identical
    # jobs to reuse; least recently profiled or reused first out.
    cache: collections.OrderedDict[ProfileKey, CachedProfile] = field(
        default_factory=collections.OrderedDict)
    # A pass in flight by its `profile_key` -> the job running it, and the identical
    # jobs waiting for its result rather than taking GPUs of their own.
    pass_owner: dict[ProfileKey, str] = field(default_factory=dict)
    pass_waiters: dict[ProfileKey, set[str]] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class ChangeBook:
    """What changed since the scans last looked. Scans that look for work to start
    (moves whose GPUs are free, profiling passes) run only when something they depend
    on changed: GPUs freed or nodes back (`GpuLedger._capacity_changed`), moves wanted
    or given up, passes wanted (`Profiling._want_profiles`). Else thousands of moving
    or waiting jobs would be scanned at every event (a telemetry report, a heartbeat).
    Marks only: dropping them all would cost scans, never a decision."""

    # Bumped whenever GPUs may have become idle or a move was wanted or given up.
    epoch: int = 0
    # The epoch the last dispatch scan (`Moves._dispatch_pending`) looked at.
    dispatch_scanned: int = -1
    # (epoch, idle GPU types then): `GpuLedger._idle_types_cached`.
    idle_cache: tuple[int, set[str]] = field(default_factory=lambda: (-1, set()))
    # Types with GPUs freed since the last look for passes to start ...
    freed_types: set[str] = field(default_factory=set)
    # ... or: any type may have (moves dropped, new passes wanted).
    freed_all: bool = True
    # Which moves the next dispatch looks at (`GpuLedger._woken_moves`): jobs whose
    # record changed, and nodes whose GPUs or state changed, since the last look.
    wake_jobs: set[str] = field(default_factory=set)
    wake_nodes: set[str] = field(default_factory=set)
    # Jobs whose passes changed (this event): `Profiling._profiles_done` looks at them.
    profile_changed: set[str] = field(default_factory=set)
    # Jobs that released GPUs (this event): persisted, else a restart would book their
    # GPUs to them again.
    released: set[str] = field(default_factory=set)


class StateBase:
    """What `ControllerState` is made of: its inputs and one of each book. Every part
    (`Agents`, `Rounds`, `Profiling`, `Moves`, `GpuLedger`, `Views`) inherits it, so
    the state is declared here once and the type checker sees it in every part."""

    def __init__(self, settings: ControllerSettings | None = None, *,
                 started_at: float = 0.0) -> None:
        # The controller's knobs (`ControllerSettings.of` its config).
        self.settings: ControllerSettings = settings or ControllerSettings()
        # When this controller (this term, after a failover) started.
        self.started_at: float = started_at
        # The queues in force (QueuesLoaded; the shell sets them before any event);
        # the default: one queue, no guarantees. Replaced whole, never changed.
        self.queues: QueueSet = QueueSet()
        self.job_book = JobBook()
        self.node_book = NodeBook()
        self.round_book = RoundBook()
        self.directive_book = DirectiveBook()
        self.move_book = MoveBook()
        self.profile_book = ProfileBook()
        self.change_book = ChangeBook()

    if TYPE_CHECKING:
        # What one part calls of another, for the type checker (each is defined in
        # the module named; mypy checks that the definitions match these).

        # state.py
        def _finish(self, rec: JobRec, state: pb.JobState, at: float, reason: str,
                    out: list[Action], *, except_node: str = "") -> None: ...
        def _type_arriving(self, gpu_type: str) -> None: ...
        def _up_state(self, node_id: str) -> int: ...
        def _drain_message(self, node_id: str) -> Send: ...

        # rounds.py
        def _type_gap(self, rec: JobRec) -> str: ...

        # moves.py
        def _interrupt(self, rec: JobRec, at: float, reason: str,
                       out: list[Action]) -> None: ...
        def _send_stop(self, job_id: str, generation: int, node: str,
                       out: list[Action]) -> None: ...
        def _stop_everywhere(self, rec: JobRec, out: list[Action],
                             except_node: str = "") -> None: ...
        def _rebatch(self, rec: JobRec, alloc: JobAllocation, out: list[Action]) -> None: ...
        def _unplaceable(self, rec: JobRec, ready: set[str], at: float,
                         out: list[Action]) -> None: ...
        def _check_liveness(self, at: float, out: list[Action]) -> None: ...
        @staticmethod
        def _attained(rec: JobRec, at: float) -> dict[str, float]: ...

        # profiling.py
        def _want_profiles(self, job_ids: Iterable[str]) -> None: ...
        def _profiled(self, rec: JobRec, node: NodeRec, t: pb.Telemetry, at: float,
                      out: list[Action]) -> None: ...
        def _profile_request(self, rec: JobRec, gpu_type: str, node: str,
                             gpu: int) -> Send: ...
        def _reported_passes(self, node: NodeRec, ev: AgentRegistered,
                             out: list[Action]) -> None: ...
        def _profile_slots(self, cluster: Cluster, at: float, *,
                           early: bool) -> list[PolicyJob]: ...

        # views.py
        def queue_usage(self) -> tuple[dict[str, collections.Counter[str]],
                                       collections.Counter[str], collections.Counter[str]]: ...

        # ledger.py
        def _release(self, rec: JobRec, node_name: str) -> None: ...
        def _stopped(self, rec: JobRec | None, node: NodeRec, job_id: str,
                     generation: int, stop_id: int) -> None: ...
        def _stop_pending(self, job_id: str, node: str) -> bool: ...
        @staticmethod
        def _explained(rec: JobRec | None, node: str, gpu: int) -> bool: ...
        def _reserved_gpus(self) -> set[tuple[str, int]]: ...
        def _idle_types(self, reserved: set[tuple[str, int]] | None = None) -> set[str]: ...
        def _idle_types_cached(self) -> set[str]: ...
        def _set_moving(self, rec: JobRec, moving: bool, *, started: bool = False) -> None: ...
        def _forget_move(self, job_id: str) -> None: ...
        def _wait_on(self, job_id: str, nodes: Iterable[str]) -> None: ...
        def _woken_moves(self) -> list[str]: ...
        def _capacity_changed(self, node: NodeRec | None = None) -> None: ...
        def _idle_gpu(self, gpu_type: str,
                      busy: set[tuple[str, int]]) -> tuple[str, int] | None: ...
        def _present_types(self) -> set[str]: ...
