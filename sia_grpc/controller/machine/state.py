"""The controller's decisions: a synchronous state machine with no I/O.

`ControllerState.handle(event) -> list[Action]` is the whole controller logic;
the async shell (`controller.shell`) feeds it events from RPCs, agent streams
and the round timer, one at a time, and carries out the actions it returns
(send a message to an agent, persist jobs, start a solve, publish a round).
Every time it needs is in the events (`Event.at`), so tests drive it with no
sockets and no clock.

Read it as events → transitions → actions:

    events.py       what comes in (events) and goes out (actions)
    books.py        the state: its books (jobs, nodes, rounds, directives, moves,
                    profiles, changes), each field declared once with its meaning
    state.py        `handle`: each event to its handler; jobs created, cancelled,
                    ended; drains; restoring from the store
    agents.py       what agents say: registration and reconciliation, telemetry,
                    acknowledgements, exits
    rounds.py       ticks to solves, solves to moves, rounds that cannot run
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

The state is the books of `books.py` (`StateBase`: one of each, and the inputs), read
and changed by the parts above through the book: `self.move_book.moving`. Each part's
docstring says which books it changes; this one's:

Changes: job_book, node_book, round_book, directive_book, change_book.
Jobs created, restored, ended and deleted with the active count per tenant; drains;
nodes restored; the rounds' count restored; a round acknowledged once its solve is
done and its directives are; the jobs that released GPUs persisted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sia_grpc.api import pb
from sia_grpc.api.validation import resolve
from sia_grpc.controller.machine.agents import Agents
from sia_grpc.controller.machine.events import (
    Action,
    AgentDisconnected,
    AgentMessage,
    AgentRegistered,
    ControllerSettings,
    Event,
    Happened,
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
from sia_grpc.controller.machine.invariants import InvariantError, check_invariants
from sia_grpc.controller.machine.ledger import GpuLedger
from sia_grpc.controller.machine.moves import Moves
from sia_grpc.controller.machine.profiling import PROFILE_SLOT, Profiling
from sia_grpc.controller.machine.records import (
    JobRec,
    NodeRec,
    encode_extra,
    load_extra,
    timestamp,
)
from sia_grpc.controller.machine.rounds import Rounds
from sia_grpc.controller.machine.transitions import REASONS, SUBMITTED, TERMINAL, set_state
from sia_grpc.controller.machine.views import Views

__all__ = [  # the state machine, and what it takes in and gives out
    "PROFILE_SLOT", "REASONS", "SUBMITTED", "TERMINAL", "Action", "AgentDisconnected",
    "AgentMessage", "AgentRegistered", "ControllerSettings", "ControllerState", "Event",
    "Happened", "InvariantError", "JobCancelRequested", "JobCreated", "JobDeleted", "Liveness",
    "NodeDrainChanged", "NodeForgotten", "Persist", "QueuesLoaded", "Reconnect", "RoundAcked",
    "RoundDone", "RoundSkipped", "Send", "Solve", "SolveFinished", "Tick", "WantRound",
]


class ControllerState(Agents, Rounds, Profiling, Moves, GpuLedger, Views):
    """All the controller knows. Mutated only by `handle`."""

    # ------------------------------------------------------------ loading

    def restore(self, job: pb.Job, extra: bytes, at: float) -> None:
        """Reload a job from the store after a controller restart. Nodes it held
        come back as not yet seen: unless their agent reconnects within the
        heartbeat timeout, the job is requeued from its last checkpoint."""
        rec = JobRec(job=job, res=resolve(job.spec))
        if extra:
            load_extra(rec, json.loads(extra))
        self.job_book.jobs[job.job_id] = rec
        for gpu_type in sorted(rec.usable):
            self._remember_profile(rec, gpu_type)
        if job.status.state not in TERMINAL:
            self._want_profiles((job.job_id,))
            self.job_book.active_by_tenant[job.spec.tenant] += 1
        if job.status.state in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_UNSPECIFIED) \
                and not rec.usable:  # accepted, never profiled
            job.status.state, job.status.reason = SUBMITTED
        for node, gpus in rec.held.items():
            n = self.node_book.nodes.get(node)
            if n is None:
                a = rec.alloc
                gpu_type = a.config.gpu_type if a else ""
                n = self.node_book.nodes[node] = NodeRec(
                    node, gpu_type, max(gpus, default=-1) + 1, last_seen=at)
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

    def restore_rounds(self, last: int) -> None:
        """Reload the last stored round's number after a controller restart: round
        numbers go on from it."""
        self.round_book.round_no = max(self.round_book.round_no, last)

    def extra(self, job_id: str) -> bytes:
        """The controller-private part of a job, persisted beside it."""
        return encode_extra(self.job_book.jobs[job_id])

    # ------------------------------------------------------------ dispatch

    def handle(self, event: Event) -> list[Action]:
        out: list[Action] = []
        match event:
            case JobCreated():
                self._created(event, out)
            case JobCancelRequested():
                self._cancel(event, out)
            case JobDeleted():
                rec = self.job_book.jobs.pop(event.job_id, None)
                self._forget_move(event.job_id)
                if rec is not None and rec.state not in TERMINAL:
                    self.job_book.active_by_tenant[rec.job.spec.tenant] -= 1
            case AgentRegistered():
                self._registered(event, out)
            case AgentMessage():
                self._agent_message(event, out)
            case AgentDisconnected():
                self._disconnected(event)
            case Tick():
                self._tick(event, out)
            case NodeDrainChanged():
                self._drain_changed(event, out)
            case NodeForgotten():
                self._forget(event, out)
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
        if self.change_book.released:  # else a restart would book their GPUs to them again
            jobs = self.job_book.jobs
            out.append(Persist(tuple(sorted(j for j in self.change_book.released if j in jobs))))
            self.change_book.released.clear()
        for round_no in [r for r, ids in self.directive_book.round_acks.items()
                         if not ids and r != self.round_book.solving]:
            del self.directive_book.round_acks[round_no]
            out.append(RoundAcked(round_no, self.directive_book.interrupted.pop(round_no, "")))
        return _merge_persists(out)

    # ------------------------------------------------------------ jobs

    def _created(self, ev: JobCreated, out: list[Action]) -> None:
        job = pb.Job()
        job.CopyFrom(ev.job)
        rec = JobRec(job=job, res=ev.resolved or resolve(job.spec))
        self.job_book.jobs[job.job_id] = rec
        self._want_profiles((job.job_id,))
        self.job_book.active_by_tenant[job.spec.tenant] += 1
        # A new record starts from no state, whatever the caller stamped on it (the
        # shell stores it as PROFILING already; a reload profiles it again).
        job.status.state = pb.JOB_STATE_UNSPECIFIED
        state, reason = SUBMITTED
        set_state(rec, state, ev.at, reason)
        self._reuse_profiles(rec, ev.at, out)
        self._say_if_unprofilable(rec, out)

    def _cancel(self, ev: JobCancelRequested, out: list[Action]) -> None:
        rec = self.job_book.jobs.get(ev.job_id)
        if rec is None or rec.state in TERMINAL:
            return
        self._finish(rec, pb.JOB_STATE_CANCELLED, ev.at, "cancelled by request", out)

    def _finish(self, rec: JobRec, state: pb.JobState, at: float, reason: str,
                out: list[Action], *, except_node: str = "") -> None:
        """End a job: stop it wherever it still runs (GPUs are released on the acks)."""
        if rec.state not in TERMINAL:
            self.job_book.active_by_tenant[rec.job.spec.tenant] -= 1
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
            self.node_book.drained.pop(ev.node_id, None)
            out.append(Happened(ev.at, pb.EVENT_KIND_NODE_UNDRAINED,
                                f"node {ev.node_id} undrained: it takes work again",
                                node=ev.node_id))
        else:
            self.node_book.drained[ev.node_id] = ev.reason
            out.append(Happened(ev.at, pb.EVENT_KIND_NODE_DRAINED,
                                f"node {ev.node_id} drained ({ev.reason or 'no reason given'}):"
                                " no new work; its jobs move off", node=ev.node_id))
        node = self.node_book.nodes.get(ev.node_id)
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

    def _forget(self, ev: NodeForgotten, out: list[Action]) -> None:
        """Drop a LOST node's record and its drain. A LOST node holds no GPUs; a move
        still headed there is called off when it is next looked at (`_dispatch_pending`)."""
        node = self.node_book.nodes.get(ev.node_id)
        if node is None or node.state != pb.NODE_STATE_LOST:
            return  # back (or gone) since the shell looked: nothing to forget
        assert not node.holder, f"LOST node {node.name} holds GPUs"
        del self.node_book.nodes[node.name]
        self.node_book.drained.pop(node.name, None)
        self._capacity_changed(node)  # moves headed there are looked at again
        out.append(Happened(ev.at, pb.EVENT_KIND_NODE_FORGOTTEN,
                            f"node {node.name} forgotten (it was LOST)", node=node.name))

    def restore_drain(self, node_id: str, reason: str, at: float) -> None:
        """Reload a drain from the store after a controller restart."""
        self.node_book.drained[node_id] = reason
        node = self.node_book.nodes.setdefault(node_id, NodeRec(node_id, "", 0, last_seen=at))
        node.state = pb.NODE_STATE_DRAINING

    def _type_arriving(self, gpu_type: str) -> None:
        """Before a node of `gpu_type` joins the pool: if the cluster had no such
        type, every job may want a profile of it."""
        if gpu_type and gpu_type not in self._present_types():
            self._want_profiles(j for j, r in self.job_book.jobs.items() if r.state not in TERMINAL)

    def _up_state(self, node_id: str) -> int:
        return pb.NODE_STATE_DRAINING if node_id in self.node_book.drained else pb.NODE_STATE_READY

    def _drain_message(self, node_id: str) -> Send:
        reason = self.node_book.drained.get(node_id)
        return Send(node_id, pb.ControllerMessage(drain=pb.Drain(
            reason=reason or "", cancel=reason is None)))

    # ------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first rule the books break
        (`sia_grpc.controller.machine.invariants`)."""
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
