"""The controller's decisions: a synchronous state machine with no I/O.

`ControllerState.handle(event) -> list[Action]` is the whole controller logic;
the async shell (`controller.server`) feeds it events from RPCs, agent streams
and the round timer, one at a time, and carries out the actions it returns
(send a message to an agent, persist jobs, start a solve, publish a round).
Every time it needs is in the events (`Event.at`), so tests drive it with no
sockets and no clock.

Read it as events → transitions → actions:

    events.py       what comes in (events) and goes out (actions)
    state.py        `handle`: each event to its handler; jobs created, cancelled,
                    ended; drains; restoring from the store
    agents.py       what agents say: registration and reconciliation, telemetry,
                    acknowledgements, exits
    rounds.py       ticks to solves, solves to moves, rounds that cannot run
    queueing.py     queues: a job's queue and class, reclaims and queue reasons
    moves.py        two-phase moves, batch changes, requeues, lost agents
    profiling.py    profiling passes and profiling slots
    ledger.py       the GPU ledger: who holds which GPU, what frees it
    transitions.py  the job states and the table of changes between them
    invariants.py   the rules the books keep after every event
    records.py      job and node records and their persisted form
    views.py        what the API and the metrics read

A job's life (`transitions.TRANSITIONS`): PROFILING (one GPU of each type for a
short pass, the paper's bootstrap) → QUEUED (schedulable once one type has a
profile) → RUNNING → (RESTARTING: STOP to its old nodes, wait for their
checkpoints, then RUN at the new allocation) → ... → SUCCEEDED / FAILED /
CANCELLED. A RUN goes out only when every GPU it needs has been released by
whoever held it, so no GPU is ever used by two jobs, even while jobs move.
"""

from __future__ import annotations

import collections
import json
import secrets
from collections.abc import Sequence

from sia_grpc.api import pb
from sia_grpc.api.validation import resolve
from sia_grpc.controller.agents import Agents
from sia_grpc.controller.events import (
    Action,
    AgentDisconnected,
    AgentMessage,
    AgentRegistered,
    ControllerSettings,
    Event,
    JobCancelRequested,
    JobCreated,
    JobDeleted,
    Liveness,
    NodeDrainChanged,
    NodeForgotten,
    Persist,
    QueuesLoaded,
    Reconnect,
    RoundAcked,
    RoundDone,
    RoundSkipped,
    Send,
    Solve,
    SolveFinished,
    Tick,
    WantRound,
)
from sia_grpc.controller.invariants import InvariantError, check_invariants
from sia_grpc.controller.ledger import GpuLedger
from sia_grpc.controller.moves import Moves
from sia_grpc.controller.profiling import PROFILE_SLOT, CachedProfile, Profiling
from sia_grpc.controller.records import (
    JobRec,
    NodeRec,
    encode_extra,
    load_extra,
    timestamp,
)
from sia_grpc.controller.rounds import Rounds
from sia_grpc.controller.transitions import REASONS, TERMINAL, set_state
from sia_grpc.controller.views import Views
from sia_grpc.policy.queues import QueueSet

__all__ = [  # the state machine, and what it takes in and gives out
    "PROFILE_SLOT", "REASONS", "TERMINAL", "Action", "AgentDisconnected", "AgentMessage",
    "AgentRegistered", "ControllerSettings", "ControllerState", "Event", "InvariantError",
    "JobCancelRequested", "JobCreated", "JobDeleted", "Liveness", "NodeDrainChanged",
    "NodeForgotten", "Persist", "QueuesLoaded", "Reconnect", "RoundAcked", "RoundDone",
    "RoundSkipped", "Send", "Solve", "SolveFinished", "Tick", "WantRound",
]


class ControllerState(Agents, Rounds, Profiling, Moves, GpuLedger, Views):
    """All the controller knows. Mutated only by `handle`."""

    def __init__(self, settings: ControllerSettings | None = None, *,
                 started_at: float = 0.0) -> None:
        self.settings = settings or ControllerSettings()
        self.jobs: dict[str, JobRec] = {}
        # Jobs not yet ended, per tenant: the per-tenant active-job limit reads it.
        self.active_by_tenant: collections.Counter[str] = collections.Counter()
        self.nodes: dict[str, NodeRec] = {}
        self.round_no = 0
        self.solving: int | None = None
        self.started_at = started_at
        # Directive ids are unique across controller restarts: a random base.
        self._next_directive = secrets.randbits(40) << 20
        # Directives sent and not yet acknowledged: id -> (job, node, action, message).
        # They are sent again, unchanged, when their agent reconnects.
        self._pending_acks: dict[int, tuple[str, str, int, pb.ControllerMessage]] = {}
        self._round_started, self._round_trigger = 0.0, "timer"
        self.refused = 0  # RUN directives an agent refused (should stay 0)
        self._round_acks: dict[int, set[int]] = {}  # round -> its unacknowledged directives
        # STOPs sent and not yet acknowledged, per (job, node): an index of _pending_acks.
        self._stops_due: collections.Counter[tuple[str, str]] = collections.Counter()
        # Jobs waiting for stops or GPUs to start again -> their place in line.
        self._moving: dict[str, int] = {}
        self._moving_seq = 0
        # Which of them a dispatch looks at (`GpuLedger._woken_moves`): jobs whose
        # record changed, nodes whose GPUs or state changed since the last look, and
        # the moves that could not start, by the nodes their targets need.
        self._wake_jobs: set[str] = set()
        self._wake_nodes: set[str] = set()
        self._waiting_on: dict[str, set[str]] = {}
        self._waits: dict[str, tuple[str, ...]] = {}
        # Jobs that may still need a profiling pass, oldest first (a dict as an
        # ordered set: the first to come is the first profiled).
        self._to_profile: dict[str, None] = {}
        # Master node -> rendezvous port -> the job last given it (`_master_port`).
        self._ports_by_node: dict[str, dict[int, str]] = {}
        # 1-GPU profiles by what they depend on (`profile_key`), for identical jobs
        # to reuse; least recently profiled or reused first out.
        self._profile_cache: collections.OrderedDict[tuple, CachedProfile] = \
            collections.OrderedDict()
        # A pass in flight by its `profile_key` -> the job running it, and the identical
        # jobs waiting for its result rather than taking GPUs of their own.
        self._pass_owner: dict[tuple, str] = {}
        self._pass_waiters: dict[tuple, set[str]] = {}
        # Scans that look for work to start (moves whose GPUs are free, profiling
        # passes) run only when something they depend on changed: GPUs freed or
        # nodes back (`_capacity_changed`), moves wanted or given up, passes wanted
        # (`_want_profiles`). Else thousands of moving or waiting jobs would be
        # scanned at every event (a telemetry report, a heartbeat).
        self._capacity_epoch = 0
        self._dispatch_scanned = -1
        self._idle_cache: tuple[int, set[str]] = (-1, set())
        self._freed_types: set[str] = set()  # types with GPUs freed since the last look
        self._freed_all = True  # ... or: any type may have (moves dropped, new wants)
        self._profile_changed: set[str] = set()  # jobs whose passes changed (this event)
        self._released: set[str] = set()  # jobs that released GPUs (this event): persisted
        # Drained nodes (admin) -> reason. Kept apart from node records: a drain
        # outlives the agent's stream, and is restored before the agent returns.
        self.drained: dict[str, str] = {}
        # The queues in force (QueuesLoaded); the default: one queue, no guarantees.
        self.queues = QueueSet()
        self._solve_inputs = None  # the solve in flight's inputs (`Rounds._queue_outcome`)
        self._last_skip = ""  # why the last round did not run ("" once one ran)
        self._early_after_solve = ""  # an early round that came while a solve ran

    # ------------------------------------------------------------ loading

    def restore(self, job: pb.Job, extra: bytes, at: float) -> None:
        """Reload a job from the store after a controller restart. Nodes it held
        come back as not yet seen: unless their agent reconnects within the
        heartbeat timeout, the job is requeued from its last checkpoint."""
        rec = JobRec(job=job, res=resolve(job.spec))
        if extra:
            load_extra(rec, json.loads(extra))
        self.jobs[job.job_id] = rec
        for gpu_type in sorted(rec.usable):
            self._remember_profile(rec, gpu_type)
        if job.status.state not in TERMINAL:
            self._want_profiles((job.job_id,))
            self.active_by_tenant[job.spec.tenant] += 1
        if job.status.state in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_UNSPECIFIED) \
                and not rec.usable:  # accepted, never profiled
            job.status.state = pb.JOB_STATE_PROFILING
            job.status.reason = "waiting: profiling on each GPU type"
        for node, gpus in rec.held.items():
            n = self.nodes.get(node)
            if n is None:
                a = rec.alloc
                gpu_type = a.config.gpu_type if a else ""
                n = self.nodes[node] = NodeRec(node, gpu_type, max(gpus, default=-1) + 1,
                                                last_seen=at)
            # Until its agent registers, a node has at least the GPUs its jobs hold.
            n.num_gpus = max(n.num_gpus, max(gpus, default=-1) + 1)
            n.holder.update(dict.fromkeys(gpus, job.job_id))
            n.restored = True
        # What was in flight is not stored: the moves and stops of the old controller.
        if job.status.state in TERMINAL:  # its STOPs again, sent when each agent registers
            for node in sorted(rec.held):
                rec.stopping.add(node)
                self._send_stop(job.job_id, rec.generation, node, [])
        elif job.status.state == pb.JOB_STATE_RESTARTING:
            # Its move is forgotten; the agent's report settles whether it still runs
            # (kept: RUNNING) or had stopped (requeued when its agent registers).
            set_state(rec, pb.JOB_STATE_RUNNING if rec.alloc else pb.JOB_STATE_QUEUED,
                            at, "running (its move was called off by a controller restart)"
                            if rec.alloc else "requeued: a controller restart")

    def extra(self, job_id: str) -> bytes:
        """The controller-private part of a job, persisted beside it."""
        return encode_extra(self.jobs[job_id])

    # ------------------------------------------------------------ dispatch

    def handle(self, event: Event) -> list[Action]:
        out: list[Action] = []
        match event:
            case JobCreated():
                self._created(event, out)
            case JobCancelRequested():
                self._cancel(event, out)
            case JobDeleted():
                rec = self.jobs.pop(event.job_id, None)
                self._forget_move(event.job_id)
                if rec is not None and rec.state not in TERMINAL:
                    self.active_by_tenant[rec.job.spec.tenant] -= 1
            case AgentRegistered():
                self._registered(event, out)
            case AgentMessage():
                self._agent_message(event, out)
            case AgentDisconnected():
                pass  # liveness is judged by heartbeats (Tick), so a quick reconnect is free
            case Tick():
                self._tick(event, out)
            case NodeDrainChanged():
                self._drain_changed(event, out)
            case NodeForgotten():
                self._forget(event)
            case Liveness():
                self._check_liveness(event.at, out)
            case QueuesLoaded():
                # Jobs keep what they hold; the next round schedules by the new queues
                # (a job whose queue is gone: in the default one, `policy.queues.scheduled_in`).
                self.queues = event.queues
            case SolveFinished():
                self._solved(event, out)
            case _:
                raise TypeError(f"unknown event {event!r}")
        self._start_profiles(out)
        self._profiles_done(event.at, out)
        self._dispatch_pending(event.at, out)
        if self._released:  # else a restart would book their GPUs to them again
            out.append(Persist(tuple(sorted(j for j in self._released if j in self.jobs))))
            self._released.clear()
        for round_no in [r for r, ids in self._round_acks.items()
                         if not ids and r != self.solving]:
            del self._round_acks[round_no]
            out.append(RoundAcked(round_no))
        return _merge_persists(out)

    # ------------------------------------------------------------ jobs

    def _created(self, ev: JobCreated, out: list[Action]) -> None:
        job = pb.Job()
        job.CopyFrom(ev.job)
        rec = JobRec(job=job, res=ev.resolved or resolve(job.spec))
        self.jobs[job.job_id] = rec
        self._want_profiles((job.job_id,))
        self.active_by_tenant[job.spec.tenant] += 1
        # A new record starts from no state, whatever the caller stamped on it (the
        # shell stores it as PROFILING already; a reload profiles it again).
        job.status.state = pb.JOB_STATE_UNSPECIFIED
        set_state(rec, pb.JOB_STATE_PROFILING, ev.at, "waiting: profiling on each GPU type")
        self._reuse_profiles(rec, ev.at, out)
        self._say_if_unprofilable(rec, out)

    def _cancel(self, ev: JobCancelRequested, out: list[Action]) -> None:
        rec = self.jobs.get(ev.job_id)
        if rec is None or rec.state in TERMINAL:
            return
        self._finish(rec, pb.JOB_STATE_CANCELLED, ev.at, "cancelled by request", out)

    def _finish(self, rec: JobRec, state: int, at: float, reason: str,
                out: list[Action], *, except_node: str = "") -> None:
        """End a job: stop it wherever it still runs (GPUs are released on the acks)."""
        if rec.state not in TERMINAL:
            self.active_by_tenant[rec.job.spec.tenant] -= 1
        rec.target = None
        self._set_moving(rec, False)
        self._account(rec, at)
        rec.alloc = None
        self._stop_everywhere(rec, out, except_node=except_node)
        self._stop_passes(rec, out)
        self._passes_abandoned(rec, at, out)
        rec.job.status.ClearField("allocation")
        rec.job.status.finish_time.CopyFrom(timestamp(at))
        set_state(rec, state, at, reason)
        out.append(Persist((rec.job_id,)))

    # ------------------------------------------------------------ draining

    def _drain_changed(self, ev: NodeDrainChanged, out: list[Action]) -> None:
        if ev.reason is None:
            self.drained.pop(ev.node_id, None)
        else:
            self.drained[ev.node_id] = ev.reason
        node = self.nodes.get(ev.node_id)
        if node is None or node.state == pb.NODE_STATE_LOST:
            return  # registering will tell it
        if ev.reason is None:
            self._type_arriving(node.gpu_type)
        node.state = self._up_state(node.name)
        self._capacity_changed(node)
        out.append(self._drain_message(node.name))
        # Draining: an early round moves its jobs to idle GPUs (or queues them) and
        # leaves every other job where it is. Undrained: its GPUs are idle ones.
        out.append(WantRound("drain" if ev.reason is not None else "undrain"))

    def _forget(self, ev: NodeForgotten) -> None:
        """Drop a LOST node's record and its drain. A LOST node holds no GPUs; a move
        still headed there is called off when it is next looked at (`_dispatch_pending`)."""
        node = self.nodes.get(ev.node_id)
        if node is None or node.state != pb.NODE_STATE_LOST:
            return  # back (or gone) since the shell looked: nothing to forget
        assert not node.holder, f"LOST node {node.name} holds GPUs"
        del self.nodes[node.name]
        self.drained.pop(node.name, None)
        self._capacity_changed(node)  # moves headed there are looked at again

    def restore_drain(self, node_id: str, reason: str, at: float) -> None:
        """Reload a drain from the store after a controller restart."""
        self.drained[node_id] = reason
        node = self.nodes.setdefault(node_id, NodeRec(node_id, "", 0, last_seen=at))
        node.state = pb.NODE_STATE_DRAINING

    def _type_arriving(self, gpu_type: str) -> None:
        """Before a node of `gpu_type` joins the pool: if the cluster had no such
        type, every job may want a profile of it."""
        if gpu_type and gpu_type not in self._present_types():
            self._want_profiles(j for j, r in self.jobs.items() if r.state not in TERMINAL)

    def _up_state(self, node_id: str) -> int:
        return pb.NODE_STATE_DRAINING if node_id in self.drained else pb.NODE_STATE_READY

    def _drain_message(self, node_id: str) -> Send:
        reason = self.drained.get(node_id)
        return Send(node_id, pb.ControllerMessage(drain=pb.Drain(
            reason=reason or "", cancel=reason is None)))

    # ------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first rule the books break
        (`sia_grpc.controller.invariants`)."""
        check_invariants(self)


def _merge_persists(actions: Sequence[Action]) -> list[Action]:
    """One Persist per handle() call, listing each job once, after the sends."""
    ids: dict[str, None] = {}
    rest = []
    for a in actions:
        if isinstance(a, Persist):
            ids.update(dict.fromkeys(a.job_ids))
        else:
            rest.append(a)
    want = [a for a in rest if isinstance(a, WantRound)][:1]
    rest = [a for a in rest if not isinstance(a, WantRound)]
    return ([Persist(tuple(ids))] if ids else []) + rest + want
