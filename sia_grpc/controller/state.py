"""The controller's decisions: a synchronous state machine with no I/O.

`ControllerState.handle(event) -> list[Action]` is the whole controller logic;
the async shell (`controller.server`) feeds it events from RPCs, agent streams
and the round timer, one at a time, and carries out the actions it returns
(send a message to an agent, persist jobs, start a solve, publish a round).
Every time it needs is in the events (`Event.at`), so tests drive it with no
sockets and no clock.

A job's life: QUEUED → PROFILING (one GPU of each type for a short pass, the
paper's bootstrap; it is schedulable once one type has a profile) → RUNNING →
(RESTARTING: STOP to its old nodes, wait for their checkpoints, then RUN at the
new allocation) → ... → SUCCEEDED / FAILED / CANCELLED. A RUN goes out only when
every GPU it needs has been released by whoever held it, so no GPU is ever used
by two jobs, even while jobs move.
"""

from __future__ import annotations

import collections
import json
import math
import secrets
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf import timestamp_pb2

from sia_grpc.api import TERMINAL_STATES, node_state_name, pb, state_name
from sia_grpc.api.convert import MAX_GPUS_PER_NODE, allocation_to_pb
from sia_grpc.controller.validation import Resolved, profile_batch_sizes, resolve
from sia_grpc.models.bootstrap import JobGoodputModel, ThroughputEstimator
from sia_grpc.models.efficiency import GradParams
from sia_grpc.policy.cluster import Cluster, Config, GpuId, Node
from sia_grpc.policy.types import Adaptivity, JobAllocation, PolicyJob, RoundResult

TERMINAL = TERMINAL_STATES
# What a job's reason may begin with in each state: a reason always matches the
# state it is shown with (checked by `check_invariants`).
REASONS: dict[int, tuple[str, ...]] = {
    pb.JOB_STATE_QUEUED: ("accepted", "waiting: ", "requeued: ", "preempted", "starting: "),
    pb.JOB_STATE_PROFILING: ("waiting: ",),
    pb.JOB_STATE_RESTARTING: ("checkpointing: ",),
    pb.JOB_STATE_RUNNING: ("started on ", "kept ", "scaled ", "moved ", "repacked ", "running"),
    pb.JOB_STATE_SUCCEEDED: ("completed",),
    pb.JOB_STATE_FAILED: ("failed: ",),
    pb.JOB_STATE_CANCELLED: ("cancelled",),
}
_WAITING = frozenset({pb.JOB_STATE_PROFILING, pb.JOB_STATE_QUEUED})  # for a first start
# Until a job reports gradient statistics: no statistical gain from a larger
# batch (gain = 1), so the policy keeps it near its initial batch size.
NEUTRAL_GRAD = GradParams(sqr=1.0, var=0.0)


class InvariantError(AssertionError):
    """The controller's books broke a rule (`ControllerState.check_invariants`)."""


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    at: float  # wall-clock seconds (injected clock)


@dataclass(frozen=True)
class JobCreated(Event):
    job: pb.Job  # durable already
    resolved: Resolved | None = None  # its validated spec, if the caller has it


@dataclass(frozen=True)
class JobCancelRequested(Event):
    job_id: str


@dataclass(frozen=True)
class JobDeleted(Event):
    job_id: str


@dataclass(frozen=True)
class AgentRegistered(Event):
    node_id: str
    gpu_type: str
    num_gpus: int
    version: str = ""
    running: tuple[tuple[str, int, tuple[int, ...]], ...] = ()  # (job, generation, gpus)
    profiling: tuple[tuple[str, int, int], ...] = ()  # passes in flight: (job, generation, gpu)
    draining: bool = False  # what the agent believes


@dataclass(frozen=True)
class AgentMessage(Event):
    node_id: str
    message: pb.AgentMessage  # heartbeat, telemetry, ack or exit


@dataclass(frozen=True)
class AgentDisconnected(Event):
    node_id: str


@dataclass(frozen=True)
class NodeDrainChanged(Event):
    """An admin drained a node (`reason` set) or ended its drain (`reason` None)."""

    node_id: str
    reason: str | None


@dataclass(frozen=True)
class NodeForgotten(Event):
    """An admin removed a LOST node (ClusterService.ForgetNode)."""

    node_id: str


@dataclass(frozen=True)
class Liveness(Event):
    """Periodic check: agents silent past the heartbeat timeout are lost."""


@dataclass(frozen=True)
class Tick(Event):
    trigger: str = "timer"  # or "arrival", "requeue", ...
    # An early round (WantRound): it only places waiting jobs on idle GPUs.
    early: bool = False


@dataclass(frozen=True)
class SolveFinished(Event):
    round_no: int
    result: RoundResult | None
    error: str = ""  # set when the solve failed or timed out: nothing changes


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Send:
    node_id: str
    message: pb.ControllerMessage


@dataclass(frozen=True)
class Persist:
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class Solve:
    round_no: int
    trigger: str
    cluster: Cluster
    jobs: tuple[PolicyJob, ...]
    previous: Mapping[str, JobAllocation]


@dataclass(frozen=True)
class RoundAcked:
    """Every directive a round sent (including RUNs that waited for stops) is
    acknowledged: the round's effects are in place."""

    round_no: int


@dataclass(frozen=True)
class Reconnect:
    """End the agent's stream: it was judged lost while still talking, so it must
    register again (and be reconciled) before it gets work."""

    node_id: str


@dataclass(frozen=True)
class RoundDone:
    round: pb.Round


@dataclass(frozen=True)
class RoundSkipped:
    """A round that did not run, and why (`round.note`): for the log and history."""

    round: pb.Round


@dataclass(frozen=True)
class WantRound:
    """Ask the shell for an early (debounced) round: a job became schedulable."""

    trigger: str = "arrival"


Action = Send | Persist | Solve | RoundDone | RoundSkipped | WantRound | Reconnect | RoundAcked


@dataclass(frozen=True)
class ControllerSettings:
    heartbeat_timeout: float = 15.0  # seconds without a message: the agent is lost
    profile_batch_sizes: int = 10  # micro-batch sizes per profiling pass
    persist_progress_every: float = 10.0  # seconds between progress-only writes
    checkpoint_root: str = "/var/lib/sia/checkpoints"
    master_port_base: int = 29500
    # A job that has waited this long for a GPU to profile on gets one from the next
    # timer round (a profiling slot); until then, passes use GPUs that free up.
    profile_wait: float = 60.0


# ---------------------------------------------------------------- records


@dataclass
class _NodeRec:
    name: str
    gpu_type: str
    num_gpus: int
    version: str = ""
    state: int = pb.NODE_STATE_READY
    last_seen: float = 0.0
    holder: dict[int, str] = field(default_factory=dict)  # GPU index -> job physically on it
    # Books restored from the store, not yet confirmed by the agent's registration
    # (two restored jobs may both name a GPU: the agent's report settles it).
    restored: bool = False


@dataclass
class _JobRec:
    job: pb.Job
    res: Resolved
    estimator: ThroughputEstimator = field(default_factory=ThroughputEstimator)
    samples: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    grad: GradParams | None = None
    profiled: set[str] = field(default_factory=set)  # types with a finished profiling pass
    usable: set[str] = field(default_factory=set)  # types whose profile had samples
    # type -> why its pass failed, as the agent said (kept for the job's message if no
    # type can run it; not persisted: a restart profiles again).
    profile_errors: dict[str, str] = field(default_factory=dict)
    profiling: dict[str, tuple[str, int]] = field(default_factory=dict)  # type -> (node, gpu)
    # type -> the last directive id issued before its request was sent: the agent
    # applies requests and directives in order, so a STOP with a higher id ends it.
    pass_sent: dict[str, int] = field(default_factory=dict)
    alloc: JobAllocation | None = None  # what it runs on (RUN sent)
    target: JobAllocation | None = None  # what it moves to once GPUs are released
    moving: bool = False  # target set by a round (None target = preempted)
    held: dict[str, tuple[int, ...]] = field(default_factory=dict)  # node -> its GPUs there
    # node -> the generation its GPUs there were taken for: a late ack of an older
    # STOP must not free what a newer generation holds.
    held_gen: dict[str, int] = field(default_factory=dict)
    stopping: set[str] = field(default_factory=set)  # nodes sent STOP, not acknowledged yet
    generation: int = 0
    checkpoint: float = 0.0  # progress fraction of its last checkpoint
    attained: dict[str, float] = field(default_factory=dict)
    run_since: float | None = None  # attained time is accounted up to here
    started_at: float = 0.0  # when its current generation was started
    last_persist: float = 0.0
    restart_cost: float | None = None  # measured checkpoint + restore seconds, once known
    # The round's reason for a move, shown once the move lands (RUNNING, or QUEUED if
    # preempted); until then the job says it is checkpointing or starting.
    next_reason: str = ""

    def restart_s(self) -> float:
        """S_i of Sia's restart factor: measured when known, else the spec's hint."""
        return self.restart_cost if self.restart_cost is not None else self.res.restart_cost

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def state(self) -> int:
        return self.job.status.state


class ControllerState:
    """All the controller knows. Mutated only by `handle`."""

    def __init__(self, settings: ControllerSettings = ControllerSettings(), *,
                 started_at: float = 0.0) -> None:
        self.settings = settings
        self.jobs: dict[str, _JobRec] = {}
        # Jobs not yet ended, per tenant: the per-tenant active-job limit reads it.
        self.active_by_tenant: collections.Counter[str] = collections.Counter()
        self.nodes: dict[str, _NodeRec] = {}
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
        # Jobs waiting for stops or GPUs to start again (an ordered set: no sort per scan).
        self._moving: dict[str, None] = {}
        # Jobs that may still need a profiling pass, oldest first (a dict as an
        # ordered set: the first to come is the first profiled).
        self._to_profile: dict[str, None] = {}
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
        self._last_skip = ""  # why the last round did not run ("" once one ran)
        self._early_after_solve = ""  # an early round that came while a solve ran

    # ------------------------------------------------------------ loading

    def restore(self, job: pb.Job, extra: bytes, at: float) -> None:
        """Reload a job from the store after a controller restart. Nodes it held
        come back as not yet seen: unless their agent reconnects within the
        heartbeat timeout, the job is requeued from its last checkpoint."""
        rec = _JobRec(job=job, res=resolve(job.spec))
        if extra:
            _load_extra(rec, json.loads(extra))
        self.jobs[job.job_id] = rec
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
                n = self.nodes[node] = _NodeRec(node, gpu_type, max(gpus, default=-1) + 1,
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
            self._set_state(rec, pb.JOB_STATE_RUNNING if rec.alloc else pb.JOB_STATE_QUEUED,
                            at, "running (its move was called off by a controller restart)"
                            if rec.alloc else "requeued: a controller restart")

    def extra(self, job_id: str) -> bytes:
        """The controller-private part of a job, persisted beside it."""
        return json.dumps(_dump_extra(self.jobs[job_id]), separators=(",", ":")).encode()

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
            case SolveFinished():
                self._solved(event, out)
            case _:
                raise TypeError(f"unknown event {event!r}")
        self._start_profiles(event.at, out)
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
        rec = _JobRec(job=job, res=ev.resolved or resolve(job.spec))
        self.jobs[job.job_id] = rec
        self._want_profiles((job.job_id,))
        self.active_by_tenant[job.spec.tenant] += 1
        # The store has it as PROFILING already (the shell writes it so); a reload
        # profiles it again.
        self._set_state(rec, pb.JOB_STATE_PROFILING, ev.at, "waiting: profiling on each GPU type")
        self._say_if_unprofilable(rec, out)

    def _cancel(self, ev: JobCancelRequested, out: list[Action]) -> None:
        rec = self.jobs.get(ev.job_id)
        if rec is None or rec.state in TERMINAL:
            return
        self._finish(rec, pb.JOB_STATE_CANCELLED, ev.at, "cancelled by request", out)

    def _finish(self, rec: _JobRec, state: int, at: float, reason: str,
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
        rec.job.status.ClearField("allocation")
        rec.job.status.finish_time.CopyFrom(_ts(at))
        self._set_state(rec, state, at, reason)
        out.append(Persist((rec.job_id,)))

    # ------------------------------------------------------------ agents

    def _registered(self, ev: AgentRegistered, out: list[Action]) -> None:
        try:  # what the policy's cluster will hold: else every round fails on this node
            Node(ev.node_id, ev.gpu_type, ev.num_gpus)
            if ev.num_gpus > MAX_GPUS_PER_NODE:
                raise ValueError(f"num_gpus: at most {MAX_GPUS_PER_NODE}, got {ev.num_gpus}")
        except ValueError:
            out.append(Reconnect(ev.node_id))  # not taken: its stream is ended
            return
        node = self.nodes.get(ev.node_id)
        self._type_arriving(ev.gpu_type)
        if node is None:
            node = self.nodes[ev.node_id] = _NodeRec(ev.node_id, ev.gpu_type, ev.num_gpus)
        node.gpu_type, node.num_gpus, node.version = ev.gpu_type, ev.num_gpus, ev.version
        node.restored = False  # (its report below settles the restored books)
        # Back with fewer GPUs (one failed, the agent was reconfigured): whatever was
        # booked on the missing ones is gone; a pass there is run again, a job requeued.
        for g in sorted(g for g in node.holder if g >= node.num_gpus):
            rec = self.jobs.get(node.holder.pop(g, ""))  # (a release may have taken it)
            self._capacity_changed(node.gpu_type)
            if rec is None:
                continue
            for t, (name, gpu) in list(rec.profiling.items()):
                if (name, gpu) == (node.name, g):
                    del rec.profiling[t]
                    self._want_profiles((rec.job_id,))
            if node.name in rec.held:
                stopping = node.name in rec.stopping
                self._release(rec, node.name)
                if not stopping:
                    self._interrupt(rec, ev.at, f"requeued: {node.name} lost GPU {g}", out)
        node.state, node.last_seen = self._up_state(node.name), ev.at
        self._capacity_changed(node.gpu_type)
        # Its drain state, where the agent's differs: one that restarted forgot a
        # drain, one whose stream broke may have missed its end.
        if ev.draining != (node.name in self.drained):
            out.append(self._drain_message(node.name))
        reported = {job: (gen, gpus) for job, gen, gpus in ev.running}
        # Re-deliver what it may have missed; the agent ignores ids it already applied.
        unacked = set()
        for did, (job_id, name, action, msg) in list(self._pending_acks.items()):
            if name != ev.node_id:
                continue
            rec = self.jobs.get(job_id)
            d = msg.directive
            if action == pb.Directive.ACTION_RUN and (
                    rec is None or rec.state in TERMINAL or d.generation != rec.generation
                    or ev.node_id not in rec.held):
                # Obsolete: the job moved on while the agent was away. Sent now, it
                # would start a fenced generation on GPUs the books give to others.
                del self._pending_acks[did]
                self._round_acked(d.round, did, out)
                continue
            unacked.add(job_id)
            out.append(Send(name, msg))
        # Profiling passes in flight here: the request may have been lost with the old
        # stream (or the agent restarted), and nothing else would ever end the pass.
        # Sent again; an agent still running that pass ignores the copy.
        # (An ended job's passes are being stopped: its STOP is re-sent above.)
        for job_id in sorted(set(node.holder.values())):
            rec = self.jobs.get(job_id)
            if rec is None or rec.state in TERMINAL:
                continue
            for t, (name, gpu) in sorted(rec.profiling.items()):
                if name == ev.node_id:
                    out.append(self._profile_request(rec, t, name, gpu))
        # Jobs we believe run here but the agent does not have: their workers are gone.
        # (Also jobs whose restored books name this node while another job's booking
        # of the same GPU won: the agent's report settles it.)
        for job_id in sorted({*node.holder.values(),
                              *(j for j, r in self.jobs.items() if ev.node_id in r.held)}):
            rec = self.jobs.get(job_id)
            if rec is None or job_id in reported or job_id in unacked:
                continue
            if ev.node_id in rec.held and ev.node_id not in rec.stopping:
                self._release(rec, ev.node_id)
                self._interrupt(rec, ev.at, f"requeued: its workers on {ev.node_id} are gone", out)
            elif ev.node_id in rec.stopping:  # it stopped while we were apart
                self._release(rec, ev.node_id)
        # Workers the agent runs that we did not place there (or of an older generation): fence.
        for job_id, (gen, gpus) in reported.items():
            if job_id in unacked:
                continue
            rec = self.jobs.get(job_id)
            ours = (rec is not None and rec.state not in TERMINAL and gen == rec.generation
                    and rec.held.get(ev.node_id) == tuple(sorted(gpus)))
            if not ours:
                # Only GPUs the node has, and not booked for another job: an agent's
                # report must not push its GPU count past what it registered.
                mine = tuple(sorted({g for g in gpus if g < node.num_gpus
                                     and node.holder.get(g, job_id) == job_id}))
                node.holder.update(dict.fromkeys(mine, job_id))
                self._send_stop(job_id, gen, ev.node_id, out)
                if rec is not None:
                    if ev.node_id not in rec.held:
                        rec.held[ev.node_id], rec.held_gen[ev.node_id] = mine, gen
                    rec.stopping.add(ev.node_id)
        self._reported_passes(node, ev, out)

    def _agent_message(self, ev: AgentMessage, out: list[Action]) -> None:
        node = self.nodes.get(ev.node_id)
        if node is None:
            return
        if node.state == pb.NODE_STATE_LOST:
            out.append(Reconnect(node.name))
            return
        node.last_seen = ev.at
        msg = ev.message
        kind = msg.WhichOneof("kind")
        if kind == "telemetry":
            self._telemetry(node, msg.telemetry, ev.at, out)
        elif kind == "ack":
            self._ack(node, msg.ack, ev.at, out)
        elif kind == "exit":
            self._exit(node, msg.exit, ev.at, out)

    def _telemetry(self, node: _NodeRec, t: pb.Telemetry, at: float, out: list[Action]) -> None:
        rec = self.jobs.get(t.job_id)
        if rec is None:  # a deleted job's pass that ran to its end: its GPU is free
            g = t.profile_gpu if t.profile and t.HasField("profile_gpu") else -1
            if g in node.holder and node.holder[g] == t.job_id:
                del node.holder[g]
                self._capacity_changed(node.gpu_type)
            return
        if t.profile:
            self._profiled(rec, node, t, at, out)
            return
        if t.generation != rec.generation or rec.state in TERMINAL:
            return  # a fenced generation's late report
        new_shape = False
        for s in t.samples:
            if not _valid_sample(s):
                continue
            key = (s.gpu_type, s.num_nodes, s.num_replicas, s.atomic_batch_size, s.accum_steps)
            old = rec.samples.get(key)
            # A new shape, or one whose step time moved by more than 5% (a real
            # worker warms up; modeled ones repeat themselves): fit it again.
            if old is None or abs(s.step_time_s - old[0]) > 0.05 * old[0]:
                sync = _sync(s)
                rec.samples[key] = (s.step_time_s, sync)
                rec.estimator.add_observation(s.gpu_type, s.num_nodes, s.num_replicas,
                                              s.atomic_batch_size, s.accum_steps,
                                              s.step_time_s, sync)
                new_shape = True
        if t.HasField("grad") and _valid_grad(t.grad):
            rec.grad = GradParams(sqr=t.grad.sqr, var=t.grad.var)
        rec.job.status.progress = max(rec.job.status.progress, min(t.progress, 1.0))
        if t.HasField("checkpoint"):
            c = t.checkpoint
            rec.checkpoint = max(rec.checkpoint, c.progress)
            if c.restore_s > 0 and math.isfinite(c.restore_s + c.save_s):
                # The restart cost the policy weighs is measured, not guessed.
                rec.restart_cost = min(max(c.save_s, 0.0) + c.restore_s, 86400.0)
                new_shape = True
        if new_shape or at - rec.last_persist >= self.settings.persist_progress_every:
            rec.last_persist = at
            out.append(Persist((rec.job_id,)))

    def _profiled(self, rec: _JobRec, node: _NodeRec, t: pb.Telemetry, at: float,
                  out: list[Action]) -> None:
        where = rec.profiling.get(node.gpu_type)
        if t.HasField("profile_gpu") and (where is None or where != (node.name, t.profile_gpu)):
            # Another pass of the job's (one the books stopped, or took back from
            # an agent's report): it is over, so its GPU is free.
            g = t.profile_gpu
            if node.holder.get(g) == rec.job_id and not self._explained(rec, node.name, g):
                del node.holder[g]
                self._capacity_changed(node.gpu_type)
            return
        if where is None or where[0] != node.name:
            return
        del rec.profiling[node.gpu_type]
        self._profile_changed.add(rec.job_id)
        if t.profile_refused:
            # It never ran (the agent's GPU was busy after all): it says nothing of the
            # job, which profiles again when GPUs next free up. Not signalled as
            # capacity: the same GPU would be offered, and refused, at once.
            if node.holder.get(where[1]) == rec.job_id:
                del node.holder[where[1]]
            if rec.state == pb.JOB_STATE_PROFILING:
                rec.job.status.reason = f"waiting: profiling on {node.gpu_type} ({t.profile_error})"
            self._to_profile[rec.job_id] = None
            return
        if node.holder.get(where[1]) == rec.job_id:
            del node.holder[where[1]]
            self._capacity_changed(node.gpu_type)
        rec.profiled.add(node.gpu_type)
        if t.profile_error:
            rec.profile_errors[node.gpu_type] = t.profile_error[:1000]  # what an agent sends
        if rec.grad is None and t.HasField("grad") and _valid_grad(t.grad):
            rec.grad = GradParams(sqr=t.grad.sqr, var=t.grad.var)
        for s in t.samples:
            if _valid_sample(s) and s.num_replicas == 1 and s.num_nodes == 1:
                sync = _sync(s)
                rec.samples[(s.gpu_type, 1, 1, s.atomic_batch_size, 0)] = (s.step_time_s, sync)
                rec.estimator.add_profile(s.gpu_type, s.atomic_batch_size, s.step_time_s, sync)
                rec.usable.add(s.gpu_type)
        out.append(Persist((rec.job_id,)))

    def _ack(self, node: _NodeRec, ack: pb.DirectiveAck, at: float, out: list[Action]) -> None:
        pending = self._pending_acks.get(ack.directive_id)
        if pending is None or pending[1] != node.name:
            return  # a re-delivered directive's second ack (or another node's: ignored)
        del self._pending_acks[ack.directive_id]
        if pending[2] == pb.Directive.ACTION_STOP:
            key = pending[0], pending[1]
            self._stops_due[key] -= 1
            if self._stops_due[key] <= 0:
                del self._stops_due[key]
        self._round_acked(pending[3].directive.round, ack.directive_id, out)
        job_id, node_id, action, msg = pending
        rec = self.jobs.get(job_id)
        if action == pb.Directive.ACTION_STOP:
            self._stopped(rec, node, job_id, msg.directive.generation, ack.directive_id)
        elif rec is None:
            return
        elif not ack.ok and ack.generation == rec.generation and node_id in rec.held:
            # The agent refused to start it (bad GPUs, draining): run it elsewhere, and
            # tell it again whether it is drained (it may have missed the news).
            self.refused += 1
            out.append(self._drain_message(node_id))
            self._release(rec, node_id)
            self._interrupt(rec, at, f"requeued: {node_id} refused it: {ack.error}", out)

    def _stopped(self, rec: _JobRec | None, node: _NodeRec, job_id: str, generation: int,
                 stop_id: int) -> None:
        """An acknowledged STOP: the agent has stopped the job's workers of that
        generation or older on the node, and its passes there. What they held is
        free, and so is anything else booked to the job on that node (a fenced
        stale worker, a pass of a deleted job) — unless a newer generation of the
        job has been started there since (a late ack of an older STOP)."""
        if rec is not None:
            self._passes_ended(rec, node.name, stop_id)
            if generation >= rec.held_gen.get(node.name, -1):
                self._release(rec, node.name)
            if self._stop_pending(job_id, node.name):  # a later STOP there is still due
                rec.stopping.add(node.name)
        for g in [g for g, j in node.holder.items() if j == job_id and not self._explained(
                rec, node.name, g)]:
            del node.holder[g]
            self._capacity_changed(node.gpu_type)

    def _stop_pending(self, job_id: str, node: str) -> bool:
        return self._stops_due[job_id, node] > 0

    @staticmethod
    def _explained(rec: _JobRec | None, node: str, gpu: int) -> bool:
        """Whether `rec` runs or profiles on node/gpu (a booking it may keep)."""
        return rec is not None and (gpu in rec.held.get(node, ())
                                    or (node, gpu) in rec.profiling.values())

    def _reported_passes(self, node: _NodeRec, ev: AgentRegistered, out: list[Action]) -> None:
        """Passes the agent says it runs: a pass the books lost track of (a partition,
        a controller restart) is taken back if the job still wants that type's
        profile and the GPU is free; any other is stopped, its GPU booked until then."""
        for job_id, gen, gpu in ev.profiling:
            rec = self.jobs.get(job_id)
            if gpu >= node.num_gpus or (rec is not None and (node.name, gpu) in
                                        rec.profiling.values()):
                continue
            if node.holder.get(gpu, job_id) != job_id:
                continue  # booked to another job: the agent refuses its RUN till then
            node.holder[gpu] = job_id
            if self._stop_pending(job_id, node.name):
                continue  # the STOP re-sent above ends it; its ack frees the GPU
            if (rec is not None and rec.state not in TERMINAL and node.gpu_type not in
                    rec.profiling and node.gpu_type in self._profile_types(rec)):
                rec.profiling[node.gpu_type] = (node.name, gpu)
                rec.pass_sent[node.gpu_type] = self._next_directive
            else:
                self._send_stop(job_id, gen, node.name, out)

    def _passes_ended(self, rec: _JobRec, node_id: str, stop_id: int) -> None:
        """A STOP acknowledged ends the job's passes on that node requested before it
        (the agent stops them first): their GPUs are free; a live job profiles again."""
        node = self.nodes.get(node_id)
        for t, (name, gpu) in list(rec.profiling.items()):
            if name != node_id or rec.pass_sent.get(t, 0) >= stop_id:
                continue
            del rec.profiling[t]
            self._profile_changed.add(rec.job_id)
            if rec.state not in TERMINAL:
                self._want_profiles((rec.job_id,))
            if node is not None and node.holder.get(gpu) == rec.job_id:
                del node.holder[gpu]
                self._capacity_changed(node.gpu_type)

    def _round_acked(self, round_no: int, directive_id: int, out: list[Action]) -> None:
        self._round_acks.get(round_no, set()).discard(directive_id)

    def _exit(self, node: _NodeRec, ex: pb.JobExit, at: float, out: list[Action]) -> None:
        rec = self.jobs.get(ex.job_id)
        if rec is None or node.name not in rec.held:
            return  # only a node the job runs on may end it (or report its checkpoint)
        if ex.kind == pb.JobExit.KIND_CHECKPOINTED:
            rec.checkpoint = max(rec.checkpoint, ex.progress)
            rec.job.status.progress = max(rec.job.status.progress, ex.progress)
            return
        if ex.generation != rec.generation or rec.state in TERMINAL:
            return
        # A RUN still on its way there (a batch change) would start the finished job
        # again: then its GPUs stay booked until a STOP behind that RUN is acknowledged.
        rerun = any(j == rec.job_id and n == node.name and act == pb.Directive.ACTION_RUN
                    for j, n, act, _ in self._pending_acks.values())
        done_here = "" if rerun else node.name
        if not rerun:
            self._release(rec, node.name)
        if ex.kind == pb.JobExit.KIND_COMPLETED:
            rec.job.status.progress = 1.0
            self._finish(rec, pb.JOB_STATE_SUCCEEDED, at, "completed", out, except_node=done_here)
        else:
            msg = ex.message or "worker failed"
            rec.job.status.message = msg
            self._finish(rec, pb.JOB_STATE_FAILED, at, f"failed: {msg}", out,
                         except_node=done_here)

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
        self._capacity_changed(node.gpu_type)
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
        self._capacity_changed(node.gpu_type)  # moves headed there are looked at again

    def restore_drain(self, node_id: str, reason: str, at: float) -> None:
        """Reload a drain from the store after a controller restart."""
        self.drained[node_id] = reason
        node = self.nodes.setdefault(node_id, _NodeRec(node_id, "", 0, last_seen=at))
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

    # ------------------------------------------------------------ rounds

    def _tick(self, ev: Tick, out: list[Action]) -> None:
        self._check_liveness(ev.at, out)
        if self.solving is not None:
            if ev.early:  # run it once the solve in flight is done, not a round later
                self._early_after_solve = ev.trigger
            else:  # a solve longer than a round: worth saying
                self._skip(ev, f"round {self.solving} is still being solved", out)
            return
        # (a node restored from the store without its type waits for its agent)
        ready = [n for n in self.nodes.values() if n.state == pb.NODE_STATE_READY and n.gpu_type]
        jobs = [r for r in self.jobs.values() if self._schedulable(r)]
        cluster = Cluster.of(Node(n.name, n.gpu_type, n.num_gpus) for n in ready) \
            if ready else None
        names = {n.name for n in ready}
        policy_jobs, previous, unplaceable = [], {}, []
        # An early round only fills idle GPUs: every job that has GPUs keeps them
        # (reshuffling is the timer round's job, at most once per round length).
        for rec in jobs:
            pj = None if cluster is None else self._policy_job(rec, cluster, ev.at,
                                                                pinned=ev.early)
            if pj is None:
                unplaceable.append(rec)
                continue
            policy_jobs.append(pj)
            cur = rec.target if rec.moving else rec.alloc
            if cur is not None and all(g.node in names for g in cur.gpus):
                previous[rec.job_id] = cur
        for rec in unplaceable:
            self._unplaceable(rec, names, ev.at, out)
        if not policy_jobs:
            self._skip(ev, self._why_no_round(ready, jobs), out)
            return
        if not ev.early:
            policy_jobs.extend(self._profile_slots(cluster, ev.at))
        self._last_skip = ""
        self.round_no += 1
        self.solving = self.round_no
        self._round_started, self._round_trigger = ev.at, ev.trigger
        out.append(Solve(self.round_no, ev.trigger, cluster, tuple(policy_jobs), previous))

    def _skip(self, ev: Tick, why: str, out: list[Action]) -> None:
        """A round that did not run says why, once per reason (an idle cluster with
        nothing to schedule says nothing)."""
        if not why or why == self._last_skip:
            return
        self._last_skip = why
        rnd = pb.Round(trigger=ev.trigger, note=f"skipped: {why}")
        rnd.start_time.CopyFrom(_ts(ev.at))
        out.append(RoundSkipped(rnd))

    def _why_no_round(self, ready: list[_NodeRec], jobs: list[_JobRec]) -> str:
        waiting = collections.Counter(state_name(r.state) for r in self.jobs.values()
                                      if r.state not in TERMINAL)
        if not waiting:
            return ""
        if not ready:
            states = collections.Counter(node_state_name(n.state).lower()
                                         for n in self.nodes.values())
            return "no ready node" + (f" ({_counts(states)})" if states else "")
        if not jobs:
            return f"no job has a profile yet ({_counts(waiting)})"
        return (f"none of the {len(jobs)} schedulable jobs can run on the ready nodes' GPU "
                f"types ({', '.join(sorted({n.gpu_type for n in ready}))})")

    def _unplaceable(self, rec: _JobRec, ready: set[str], at: float, out: list[Action]) -> None:
        """A job no ready node can run (none of its types is there). It waits, saying
        why; if it still holds GPUs on a node that left the pool (drained), it is
        checkpointed and requeued, so the drain completes."""
        why = self._type_gap(rec)
        if rec.moving or not rec.held or set(rec.held) <= ready:
            if rec.state == pb.JOB_STATE_QUEUED and not rec.moving:
                rec.job.status.reason = f"waiting: {why}"
            return
        left = sorted(set(rec.held) - ready)
        rec.target = None
        self._set_moving(rec, True)
        rec.job.status.restarts += 1
        self._stop_everywhere(rec, out)
        rec.next_reason = f"requeued: {', '.join(left)} left the pool and {why}"
        self._set_state(rec, pb.JOB_STATE_RESTARTING, at, f"checkpointing: {rec.next_reason}")
        out.append(Persist((rec.job_id,)))

    def _type_gap(self, rec: _JobRec) -> str:
        """Why no ready node can run the job, in the words of `kubectl describe`'s
        "0/N nodes are available": the types it needs, and what the cluster has."""
        have = sorted(self._present_types())
        allowed = rec.res.allowed_types
        runnable = set(rec.res.local_bsz_limits) & (allowed if allowed is not None else
                                                    set(rec.res.local_bsz_limits))
        want = sorted(rec.usable & runnable) or sorted(runnable) or sorted(allowed or ())
        has = f"the cluster has {', '.join(have)}" if have else "no node is ready"
        if not want:
            return f"no node it can run on ({has})"
        return f"no ready node of type {' or '.join(want)} ({has})"

    def _solved(self, ev: SolveFinished, out: list[Action]) -> None:
        if ev.round_no != self.solving:
            return
        self.solving = None
        if self._early_after_solve:
            out.append(WantRound(self._early_after_solve))
            self._early_after_solve = ""
        self._round_acks.setdefault(ev.round_no, set())
        rnd = pb.Round(round=ev.round_no, trigger=self._round_trigger, note=ev.error)
        rnd.start_time.CopyFrom(_ts(self._round_started))
        if ev.result is None:
            rnd.note = ev.error or "solve failed: previous allocation kept"
            out.append(RoundDone(rnd))
            return
        res = ev.result
        moved = 0
        for job_id, reason in res.reasons.items():
            rec = self.jobs.get(job_id)
            if rec is None or rec.state in TERMINAL:
                continue
            new = res.allocations.get(job_id)
            if _same_gpus(rec.target if rec.moving else rec.alloc, new):
                if not rec.moving and (new is not None or rec.state == pb.JOB_STATE_QUEUED):
                    rec.job.status.reason = reason
                    if _batch(new) != _batch(rec.alloc) and rec.held:
                        self._rebatch(rec, new, out)
                continue
            # Any GPU of the new allocation on a node that is no longer ready: skip.
            if new is not None and any(self.nodes.get(g.node) is None or
                                       self.nodes[g.node].state != pb.NODE_STATE_READY
                                       for g in new.gpus):
                continue
            moved += 1
            rec.target = new
            self._set_moving(rec, True)
            rec.next_reason = reason
            if rec.held:  # one checkpoint-restart cycle: a move, resize or preemption
                rec.job.status.restarts += 1
                self._stop_everywhere(rec, out)
                self._set_state(rec, pb.JOB_STATE_RESTARTING, ev.at, f"checkpointing: {reason}")
            elif new is not None:  # (a restored PROFILING job with a profile, too)
                self._set_state(rec, pb.JOB_STATE_QUEUED, ev.at,
                                f"starting: on {new.config.num_gpus} {new.config.gpu_type} "
                                "once other jobs release them")
            out.append(Persist((job_id,)))
        t = res.timings
        rnd.jobs = len(res.reasons)
        rnd.gpus_allocated = sum(a.config.num_gpus for a in res.allocations.values())
        rnd.jobs_moved = moved
        rnd.objective = float(res.objective)
        rnd.estimate_ms = 1e3 * t.get("estimate", 0.0)
        rnd.solve_ms = 1e3 * (t.get("build", 0.0) + t.get("solve", 0.0))
        rnd.place_ms = 1e3 * t.get("place", 0.0)
        out.append(RoundDone(rnd))

    def _schedulable(self, rec: _JobRec) -> bool:
        return rec.state not in TERMINAL and bool(rec.usable) and rec.state != pb.JOB_STATE_FAILED

    def _policy_job(self, rec: _JobRec, cluster: Cluster, at: float, *,
                    pinned: bool = False) -> PolicyJob | None:
        res = rec.res
        types = rec.usable & set(cluster.gpu_types)
        if res.allowed_types is not None:
            types &= res.allowed_types
        if not types:
            return None
        model = JobGoodputModel(
            estimator=rec.estimator, grad=rec.grad or NEUTRAL_GRAD,
            init_batch_size=res.init_batch_size, max_batch_size=res.max_batch_size,
            local_bsz_limits={t: res.local_bsz_limits[t] for t in types
                              if t in res.local_bsz_limits})
        created = _seconds(rec.job.status.create_time)
        return PolicyJob(
            job_id=rec.job_id, model=model, adaptivity=res.adaptivity, min_gpus=res.min_gpus,
            max_gpus=res.max_gpus, allowed_types=frozenset(types),
            pipeline_gpus=res.pipeline_gpus, batch_size=res.batch_size, num_gpus=res.num_gpus,
            age=max(at - created, 0.0), num_restarts=rec.job.status.restarts,
            restart_cost=rec.restart_s(), submit_time=created, attained=self._attained(rec, at),
            progress=rec.job.status.progress,
            # Still paying its restore (as far as the controller knows): Sia keeps it in
            # place rather than make it start the restore over (the artifact's rule).
            restoring=rec.alloc is not None and not rec.moving
            and at - rec.started_at < rec.restart_s(), pinned=pinned)

    # ------------------------------------------------------------ moving GPUs

    def _dispatch_pending(self, at: float, out: list[Action]) -> None:
        """Start every job whose target's GPUs are all released."""
        if self._dispatch_scanned == self._capacity_epoch:
            return  # nothing freed, no move wanted or dropped: none can start now
        self._dispatch_scanned = self._capacity_epoch
        for job_id in list(self._moving):
            rec = self.jobs.get(job_id)
            if rec is None or not rec.moving or rec.state in TERMINAL:
                self._moving.pop(job_id, None)
                continue
            if rec.held:
                continue
            target = rec.target
            gone = target and sorted({g.node for g in target.gpus if g.node not in self.nodes
                                      or self.nodes[g.node].state != pb.NODE_STATE_READY})
            if gone:  # lost or drained since the round chose it: the move is void
                target = rec.target = None
                rec.next_reason = (f"requeued: {', '.join(gone)} left the pool before the "
                                   "move could start")
                out.append(WantRound("requeue"))
            if target is None:  # preempted, and now fully stopped
                self._set_moving(rec, False)
                self._account(rec, at)
                rec.alloc = None
                rec.job.status.ClearField("allocation")
                self._set_state(rec, pb.JOB_STATE_QUEUED, at, rec.next_reason or "preempted")
                out.append(Persist((rec.job_id,)))
                continue
            if any(self.nodes[g.node].holder.get(g.index) is not None for g in target.gpus):
                continue
            self._run(rec, target, at, out)

    def _run(self, rec: _JobRec, alloc: JobAllocation, at: float, out: list[Action]) -> None:
        self._account(rec, at)
        rec.generation += 1
        rec.alloc, rec.target = alloc, None
        self._set_moving(rec, False, started=True)
        rec.run_since = rec.started_at = at
        status = rec.job.status
        status.generation = rec.generation
        status.allocation.CopyFrom(allocation_to_pb(alloc))
        status.goodput = alloc.goodput
        if not status.HasField("start_time"):
            status.start_time.CopyFrom(_ts(at))
        for name, gpus in _by_node(alloc):
            self.nodes[name].holder.update(dict.fromkeys(gpus, rec.job_id))
            rec.held[name], rec.held_gen[name] = gpus, rec.generation
        out.extend(self._run_directives(rec))
        self._set_state(rec, pb.JOB_STATE_RUNNING, at, rec.next_reason or "running")
        rec.next_reason = ""
        out.append(Persist((rec.job_id,)))

    def _rebatch(self, rec: _JobRec, alloc: JobAllocation, out: list[Action]) -> None:
        """Same GPUs, new batch size: the workers change it between steps, no restart
        (a RUN of the same generation with the new allocation)."""
        rec.alloc = alloc
        rec.job.status.allocation.CopyFrom(allocation_to_pb(alloc))
        rec.job.status.goodput = alloc.goodput
        out.extend(self._run_directives(rec))
        out.append(Persist((rec.job_id,)))

    def _run_directives(self, rec: _JobRec) -> list[Send]:
        """A RUN of the job's current generation and allocation for each of its nodes."""
        layout = _by_node(rec.alloc)
        nodes = [name for name, _ in layout]
        world = sum(len(g) for _, g in layout)
        port = self.settings.master_port_base + zlib.crc32(
            f"{rec.job_id}/{rec.generation}".encode()) % 1000
        sends, offset = [], 0
        for name, gpus in layout:
            sends.append(self._directive(name, pb.Directive(
                round=self.round_no, job_id=rec.job_id, generation=rec.generation,
                action=pb.Directive.ACTION_RUN, spec=rec.job.spec, local_gpus=gpus,
                world=pb.WorldLayout(world_size=world, rank_offset=offset, master_addr=nodes[0],
                                     master_port=port, nodes=nodes),
                allocation=rec.job.status.allocation,
                checkpoint_path=f"{self.settings.checkpoint_root}/{rec.job_id}",
                restore_progress=rec.checkpoint)))
            offset += len(gpus)
        return sends

    def _stop_everywhere(self, rec: _JobRec, out: list[Action], except_node: str = "") -> None:
        for name in rec.held:
            if name != except_node and name not in rec.stopping:
                rec.stopping.add(name)
                self._send_stop(rec.job_id, rec.generation, name, out)

    def _stop_passes(self, rec: _JobRec, out: list[Action]) -> None:
        """An ended job's profiling passes are stopped, not left to finish: the
        record may be deleted before a pass reports, and a pending STOP is what
        frees the GPU then (its ack, `_ack`)."""
        for name in sorted({n for n, _ in rec.profiling.values()} - rec.stopping):
            rec.stopping.add(name)
            self._send_stop(rec.job_id, rec.generation, name, out)

    def _send_stop(self, job_id: str, generation: int, node: str, out: list[Action]) -> None:
        out.append(self._directive(node, pb.Directive(
            round=self.round_no, job_id=job_id, generation=generation,
            action=pb.Directive.ACTION_STOP)))

    def _release(self, rec: _JobRec, node_name: str) -> None:
        gpus = rec.held.pop(node_name, ())
        rec.held_gen.pop(node_name, None)
        rec.stopping.discard(node_name)
        self._released.add(rec.job_id)
        node = self.nodes.get(node_name)
        if node is not None:
            for g in gpus:
                if node.holder.get(g) == rec.job_id:
                    del node.holder[g]
                    self._capacity_changed(node.gpu_type)

    def _interrupt(self, rec: _JobRec, at: float, reason: str, out: list[Action]) -> None:
        """Its allocation broke (node lost, workers gone): requeue from its checkpoint."""
        if rec.state in TERMINAL:
            return
        self._account(rec, at)
        rec.alloc, rec.target = None, None
        self._set_moving(rec, bool(rec.held))
        if rec.held:
            self._stop_everywhere(rec, out)
        rec.job.status.ClearField("allocation")
        rec.job.status.restarts += 1
        rec.generation += 1  # fence whatever still runs of the old generation
        rec.job.status.generation = rec.generation
        self._set_state(rec, pb.JOB_STATE_QUEUED, at, reason)
        out.append(Persist((rec.job_id,)))
        out.append(WantRound("requeue"))

    def _check_liveness(self, at: float, out: list[Action]) -> None:
        for node in self.nodes.values():
            if node.state == pb.NODE_STATE_LOST:
                continue
            if at - node.last_seen > self.settings.heartbeat_timeout:
                node.state = pb.NODE_STATE_LOST
                for job_id in set(node.holder.values()):
                    rec = self.jobs.get(job_id)
                    if rec is None:
                        continue
                    for t, (n, _) in list(rec.profiling.items()):
                        if n == node.name:
                            del rec.profiling[t]
                            self._want_profiles((job_id,))
                    if node.name not in rec.held:  # (a pass being stopped: gone with it)
                        rec.stopping.discard(node.name)
                    if node.name in rec.held:
                        self._release(rec, node.name)
                        if rec.alloc is not None and not rec.moving:
                            self._interrupt(rec, at, f"requeued: node {node.name} lost", out)
                node.holder.clear()
                self._capacity_changed(node.gpu_type)

    # ------------------------------------------------------------ profiling

    def _present_types(self) -> set[str]:
        return {n.gpu_type for n in self.nodes.values() if n.state == pb.NODE_STATE_READY}

    def _profile_types(self, rec: _JobRec, present: set[str] | None = None) -> set[str]:
        """Types present in the cluster the job may use and has not profiled yet."""
        present = self._present_types() if present is None else present
        allowed = rec.res.allowed_types if rec.res.allowed_types is not None else present
        return {t for t in present & allowed
                if t not in rec.profiled and t in rec.res.local_bsz_limits}

    def _profiles_done(self, at: float, out: list[Action]) -> None:
        """A profiling job is schedulable once no pass is in flight and one type
        gave samples (waiting for every pass keeps a fast type's profile from
        placing it before the others are known); it fails if no type can run it.
        Only jobs whose passes changed since the last event are looked at."""
        changed, self._profile_changed = self._profile_changed, set()
        idle: set[str] | None = None  # computed when a job becomes schedulable
        for job_id in sorted(changed):
            rec = self.jobs.get(job_id)
            if rec is None or rec.state != pb.JOB_STATE_PROFILING or rec.profiling:
                continue
            if rec.usable:
                self._set_state(rec, pb.JOB_STATE_QUEUED, at, "waiting: next scheduling round")
                idle = self._idle_types_cached() if idle is None else idle
                if idle & rec.usable:  # else the next timer round does
                    out.append(WantRound())
                out.append(Persist((rec.job_id,)))
            elif rec.profiled and not self._profile_types(rec):
                # The agents' reasons (a command that is not found, a script that
                # crashed) are what the user must fix: `sia get` shows them.
                rec.job.status.message = "\n".join(
                    f"{t}: {e}" for t, e in sorted(rec.profile_errors.items()))
                self._finish(rec, pb.JOB_STATE_FAILED, at, "failed: no GPU type in the "
                             "cluster can run it (profiling found none)", out)

    def _want_profiles(self, job_ids: Iterable[str]) -> None:
        self._to_profile.update(dict.fromkeys(job_ids))
        self._freed_all = True  # they may want a type whose idle GPUs nobody wanted

    def _start_profiles(self, at: float, out: list[Action]) -> None:
        """Give every job still missing a profile one idle GPU of that type.

        Only jobs in `_to_profile` are looked at, and only for the types whose GPUs
        were freed since the last look (all types when new passes are wanted): a GPU
        freed by one pass goes to the next job waiting for that type, without a scan
        of the whole cluster or of thousands of jobs waiting for other types."""
        if not self._to_profile or not (self._freed_all or self._freed_types):
            return
        present = self._present_types()
        types = set(present) if self._freed_all else self._freed_types & present
        self._freed_all, self._freed_types = False, set()
        busy: set[tuple[str, int]] | None = None  # computed when first needed
        for job_id in list(self._to_profile):
            if not types:
                return
            rec = self.jobs.get(job_id)
            if rec is None or rec.state in TERMINAL:
                del self._to_profile[job_id]
                continue
            missing = self._profile_types(rec, present) - set(rec.profiling)
            if not missing:  # (a pass lost, or a new type, puts it back)
                del self._to_profile[job_id]
                self._say_if_unprofilable(rec, out)
            for t in sorted(missing & types):
                busy = self._reserved_gpus() if busy is None else busy
                slot = self._idle_gpu(t, busy)
                if slot is None:
                    types.discard(t)
                    continue
                node, gpu = slot
                busy.add(slot)
                self.nodes[node].holder[gpu] = rec.job_id
                rec.profiling[t] = (node, gpu)
                out.append(self._profile_request(rec, t, node, gpu))

    def _say_if_unprofilable(self, rec: _JobRec, out: list[Action]) -> None:
        """A job with nothing to profile on (no ready node of a type it may use) waits
        saying so, rather than "profiling on each GPU type" for ever; a node of such a
        type joining puts it back in line (`_type_arriving`)."""
        if (rec.state == pb.JOB_STATE_PROFILING and not rec.profiling and not rec.usable
                and not self._profile_types(rec)):
            why = f"waiting: {self._type_gap(rec)}"
            if why != rec.job.status.reason:
                rec.job.status.reason = why
                out.append(Persist((rec.job_id,)))

    def _profile_request(self, rec: _JobRec, gpu_type: str, node: str, gpu: int) -> Send:
        rec.pass_sent[gpu_type] = self._next_directive
        lo, hi = rec.res.local_bsz_limits[gpu_type]
        req = pb.ProfileRequest(
            job_id=rec.job_id, generation=rec.generation, spec=rec.job.spec,
            local_gpu=gpu, local_batch_sizes=profile_batch_sizes(
                lo, hi, self.settings.profile_batch_sizes))
        return Send(node, pb.ControllerMessage(profile=req))

    def _profile_slots(self, cluster: Cluster, at: float) -> list[PolicyJob]:
        """One GPU per type that jobs have waited `profile_wait` to profile on and
        none is idle: a 1-GPU
        rigid job in the round, so the ILP decides whom to shrink for it. The GPU it
        gets is left to no one; released, it goes to the next waiting pass at once.
        Without this, a new job in a full cluster waits for some job to end."""
        if not self._to_profile:
            return []
        idle = self._idle_types()
        wanted = set()
        for job_id in self._to_profile:
            rec = self.jobs.get(job_id)
            if rec is not None and rec.state == pb.JOB_STATE_PROFILING and \
                    at - _seconds(rec.job.status.create_time) >= self.settings.profile_wait:
                wanted |= self._profile_types(rec) - set(rec.profiling)
        return [_profile_slot(t) for t in sorted(wanted - idle) if t in cluster.gpu_types]

    def _reserved_gpus(self) -> set[tuple[str, int]]:
        """GPUs a pending RUN will take (those held already are in node.holder)."""
        return {(g.node, g.index) for j in self._moving if (r := self.jobs.get(j))
                and r.target is not None for g in r.target.gpus}

    def _idle_types(self, reserved: set[tuple[str, int]] | None = None) -> set[str]:
        """GPU types with a GPU nobody holds or is about to take."""
        per_node = collections.Counter(
            node for node, _ in (self._reserved_gpus() if reserved is None else reserved))
        return {n.gpu_type for n in self.nodes.values() if n.state == pb.NODE_STATE_READY
                and len(n.holder) + per_node.get(n.name, 0) < n.num_gpus}

    def _idle_types_cached(self) -> set[str]:
        """`_idle_types()` as of the last time GPUs were freed: GPUs taken since may
        make it too generous, never too strict (for asking for an early round,
        where a round too many costs one solve that places nothing)."""
        if self._idle_cache[0] != self._capacity_epoch:
            self._idle_cache = (self._capacity_epoch, self._idle_types())
        return self._idle_cache[1]

    def _set_moving(self, rec: _JobRec, moving: bool, *, started: bool = False) -> None:
        rec.moving = moving
        if moving:
            self._moving[rec.job_id] = None
        else:
            self._moving.pop(rec.job_id, None)
        if not started:  # a move wanted, or its reserved GPUs given up
            self._capacity_changed()

    def _capacity_changed(self, gpu_type: str = "") -> None:
        """GPUs of `gpu_type` (or "": of any type) may have become idle."""
        self._capacity_epoch += 1
        if gpu_type:
            self._freed_types.add(gpu_type)
        else:
            self._freed_all = True

    def _idle_gpu(self, gpu_type: str, busy: set) -> tuple[str, int] | None:
        for node in self.nodes.values():
            if node.gpu_type != gpu_type or node.state != pb.NODE_STATE_READY:
                continue
            for g in range(node.num_gpus):
                if g not in node.holder and (node.name, g) not in busy:
                    return node.name, g
        return None

    # ------------------------------------------------------------ helpers

    def _directive(self, node: str, d: pb.Directive) -> Send:
        """Number the directive, remember it until acknowledged, and send it."""
        self._next_directive += 1
        d.directive_id = self._next_directive
        self._round_acks.setdefault(d.round, set()).add(d.directive_id)
        msg = pb.ControllerMessage(directive=d)
        self._pending_acks[d.directive_id] = (d.job_id, node, d.action, msg)
        if d.action == pb.Directive.ACTION_STOP:
            self._stops_due[d.job_id, node] += 1
        return Send(node, msg)

    @staticmethod
    def _attained(rec: _JobRec, at: float) -> dict[str, float]:
        """Time held per GPU type up to `at`, the current stint included."""
        out = dict(rec.attained)
        if rec.alloc is not None and rec.run_since is not None:
            t = rec.alloc.config.gpu_type
            out[t] = out.get(t, 0.0) + max(at - rec.run_since, 0.0)
        return out

    def _account(self, rec: _JobRec, at: float) -> None:
        """Credit the time it held its allocation (Gavel's time shares)."""
        if rec.alloc is not None and rec.run_since is not None:
            t = rec.alloc.config.gpu_type
            rec.attained[t] = rec.attained.get(t, 0.0) + max(at - rec.run_since, 0.0)
        rec.run_since = at if rec.alloc is not None else None

    def _set_state(self, rec: _JobRec, state: int, at: float, reason: str) -> None:
        st = rec.job.status
        st.state = state
        st.reason = reason
        st.update_time.CopyFrom(_ts(at))

    # ------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first rule the books break.

        The rules hold after every event, whatever order events arrive in; the
        state-machine tests and the chaos runs call this after each one. The
        central one: every GPU held belongs to a live job that runs or profiles on
        it, or to a STOP in flight whose acknowledgement will free it. A GPU held by
        a job that no longer exists, with nothing to free it, is a leak for ever."""
        due = collections.Counter((j, n) for j, n, act, _ in self._pending_acks.values()
                                  if act == pb.Directive.ACTION_STOP)
        if due != self._stops_due:
            raise InvariantError(f"STOPs due {dict(self._stops_due)}, pending {dict(due)}")
        stops = set(due)
        for node in self.nodes.values():
            if node.state == pb.NODE_STATE_LOST and node.holder:
                raise InvariantError(f"lost node {node.name} holds GPUs {node.holder}")
            for g, job_id in node.holder.items():
                if not 0 <= g < node.num_gpus:
                    raise InvariantError(f"{node.name}/{g}: booked past its {node.num_gpus} GPUs")
                rec = self.jobs.get(job_id)
                explained = (job_id, node.name) in stops or rec is not None and (
                    g in rec.held.get(node.name, ()) or (node.name, g) in rec.profiling.values())
                if not explained and not node.restored:
                    what = "deleted" if rec is None else state_name(rec.state)
                    raise InvariantError(
                        f"{node.name}/{g} held by {job_id!r} ({what}), which neither runs nor "
                        "profiles there and has no STOP in flight")
        active: collections.Counter[str] = collections.Counter()
        for job_id, rec in self.jobs.items():
            ended = rec.state in TERMINAL
            if not ended:
                active[rec.job.spec.tenant] += 1
            passes = {n for n, _ in rec.profiling.values()}
            for name, gpu in rec.profiling.values():
                node = self.nodes.get(name)
                if node is None or (node.holder.get(gpu) != job_id and not node.restored):
                    raise InvariantError(f"{job_id}: profiling on {name}/{gpu}, not booked to it")
            for name, gpus in rec.held.items():
                node = self.nodes.get(name)
                if node is None:
                    raise InvariantError(f"{job_id}: holds GPUs on unknown node {name}")
                if not node.restored and any(node.holder.get(g) != job_id for g in gpus):
                    raise InvariantError(f"{job_id}: holds {name}/{gpus}, booked to "
                                         f"{[node.holder.get(g) for g in gpus]}")
            for name in rec.stopping:
                if (job_id, name) not in stops:
                    raise InvariantError(f"{job_id}: stopping on {name} with no STOP in flight")
            if ended and not (rec.held.keys() | passes) <= rec.stopping:
                loose = sorted((rec.held.keys() | passes) - rec.stopping)
                raise InvariantError(f"{job_id} is {state_name(rec.state)} but holds GPUs on "
                                     f"{loose} not being stopped")
            if rec.moving and job_id not in self._moving:
                raise InvariantError(f"{job_id}: moving, but not in the moves to dispatch")
            if rec.state == pb.JOB_STATE_RUNNING and (rec.alloc is None or rec.moving):
                raise InvariantError(f"{job_id}: RUNNING without a settled allocation")
            if not rec.job.status.reason.startswith(REASONS.get(rec.state, ("",))):
                raise InvariantError(f"{job_id}: {state_name(rec.state)} with reason "
                                     f"{rec.job.status.reason!r}")
        if +self.active_by_tenant != active:
            raise InvariantError(f"active jobs per tenant {dict(self.active_by_tenant)}, "
                                 f"counted {dict(active)}")

    # ------------------------------------------------------------ views

    def job(self, job_id: str) -> pb.Job | None:
        rec = self.jobs.get(job_id)
        return rec.job if rec is not None else None

    def jobs_by_state(self) -> dict[str, int]:
        # Counted by number, then named once per state: naming each job's state made a
        # scrape of 10,000 jobs 2-4x slower.
        counts = collections.Counter(  # also read from the metrics thread
            rec.job.status.state for rec in list(self.jobs.values()))
        return {state_name(state): n for state, n in counts.items()}

    def gpus_allocated(self) -> dict[str, int]:
        nodes = list(self.nodes.values())  # also read from the metrics thread
        out = {n.gpu_type: 0 for n in nodes}
        for n in nodes:
            out[n.gpu_type] += len(n.holder)
        return out

    def gpus_capacity(self) -> dict[str, int]:
        """GPUs on READY nodes (the pool rounds place on, as `sia cluster` counts them),
        by type; a type whose nodes are all lost or draining stays, at 0."""
        out: dict[str, int] = {}
        for n in list(self.nodes.values()):  # also read from the metrics thread
            if n.gpu_type:  # (restored, its agent not back yet)
                ready = n.state == pb.NODE_STATE_READY
                out[n.gpu_type] = out.get(n.gpu_type, 0) + (n.num_gpus if ready else 0)
        return out

    def nodes_by_state(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in list(self.nodes.values()):  # also read from the metrics thread
            name = node_state_name(n.state)
            out[name] = out.get(name, 0) + 1
        return out

    def queue_max_wait(self, now: float) -> float:
        """Seconds since submission of the longest-waiting job that has never run
        (PROFILING or QUEUED, no start_time); 0 when there is none."""
        oldest = now
        for rec in list(self.jobs.values()):  # also read from the metrics thread
            status = rec.job.status
            if status.state in _WAITING and not status.HasField("start_time"):
                created = status.create_time  # (its fields: ToNanoseconds is slower)
                oldest = min(oldest, created.seconds + created.nanos / 1e9)
        return max(now - oldest, 0.0)

    def node_pb(self, name: str, tenant: str | None = None) -> pb.Node:
        """A node as `GetCluster` shows it; for `tenant` (a caller who is not an
        admin) another tenant's job ids are hidden (docs/security.md)."""
        n = self.nodes[name]
        node = pb.Node(name=n.name, gpu_type=n.gpu_type, num_gpus=n.num_gpus, state=n.state,
                       agent_version=n.version, drain_reason=self.drained.get(n.name, ""))
        node.last_heartbeat.CopyFrom(_ts(n.last_seen))
        for g in range(n.num_gpus):
            job_id = n.holder.get(g, "")
            if job_id and tenant is not None:
                rec = self.jobs.get(job_id)
                if rec is None or rec.job.spec.tenant != tenant:
                    job_id = OTHER_TENANT
            node.gpus.add(index=g, job_id=job_id)
        return node

    def cluster_pb(self, tenant: str | None = None) -> pb.Cluster:
        c = pb.Cluster()
        types: dict[str, pb.GpuTypeSummary] = {}
        for n in sorted(self.nodes.values(), key=lambda n: (n.gpu_type, n.name)):
            c.nodes.append(self.node_pb(n.name, tenant))
            if not n.gpu_type:  # (restored, its agent not back yet)
                continue
            s = types.setdefault(n.gpu_type, pb.GpuTypeSummary(gpu_type=n.gpu_type))
            if n.state == pb.NODE_STATE_READY:
                s.nodes += 1
                s.gpus += n.num_gpus
                s.allocated += len(n.holder)
        c.types.extend(types.values())
        return c


# ---------------------------------------------------------------- conversions


def _counts(c: collections.Counter[str]) -> str:
    """"2 draining, 1 lost"."""
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items()))


def _stored_allocation(a: pb.Allocation, goodput: float = 0.0) -> JobAllocation:
    """An allocation as this controller stored it (trusted: it was placed here, so
    unlike `convert.allocation_from_pb` it needs no cluster to check against)."""
    return JobAllocation(
        config=Config(a.gpu_type, num_nodes=a.num_nodes, num_gpus=a.num_gpus),
        gpus=tuple(GpuId(g.node, g.index) for g in a.gpus), num_replicas=a.num_replicas,
        batch_size=a.batch_size, atomic_bsz=a.atomic_batch_size, accum_steps=a.accum_steps,
        goodput=goodput)


def _by_node(a: JobAllocation) -> list[tuple[str, tuple[int, ...]]]:
    """(node, its GPU indices) in node order."""
    out: dict[str, list[int]] = {}
    for g in a.gpus:
        out.setdefault(g.node, []).append(g.index)
    return [(n, tuple(sorted(out[n]))) for n in sorted(out)]


def _batch(a: JobAllocation | None) -> tuple[int, int, int] | None:
    return None if a is None else (a.batch_size, a.atomic_bsz, a.accum_steps)


def _same_gpus(a: JobAllocation | None, b: JobAllocation | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.config == b.config and tuple(sorted(a.gpus)) == tuple(sorted(b.gpus))


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9


def _ts(at: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(at * 1e9))
    return ts


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


PROFILE_SLOT = "~profile:"  # no job id can start with "~"
# What a tenant sees for a GPU another tenant's job holds (not a valid job id).
OTHER_TENANT = "(other tenant)"


def _profile_slot(gpu_type: str) -> PolicyJob:
    """A stand-in for a profiling pass: worth one GPU of `gpu_type`, nothing else."""
    est = ThroughputEstimator()
    est.add_profile(gpu_type, 1, 1.0, 0.0)
    model = JobGoodputModel(estimator=est, grad=NEUTRAL_GRAD, init_batch_size=1,
                            max_batch_size=1, local_bsz_limits={gpu_type: (1, 1)})
    return PolicyJob(job_id=PROFILE_SLOT + gpu_type, model=model, adaptivity=Adaptivity.RIGID,
                     allowed_types=frozenset({gpu_type}), batch_size=1, num_gpus=1,
                     required=True)


def _valid_sample(s: pb.ThroughputSample) -> bool:
    """What the throughput model can take; anything else is an agent's bug, dropped."""
    return (math.isfinite(s.step_time_s) and 0 < s.step_time_s < 86400 and s.num_nodes >= 1
            and s.num_replicas >= s.num_nodes and s.atomic_batch_size >= 1
            and math.isfinite(s.sync_time_s))


def _valid_grad(g: pb.GradientStats) -> bool:
    """Gradient statistics the goodput model can use: finite, non-negative, not both 0
    (an fp16 overflow reports inf; taken, it would starve the job of GPUs for good)."""
    return (math.isfinite(g.sqr) and math.isfinite(g.var) and g.sqr >= 0 and g.var >= 0
            and (g.sqr > 0 or g.var > 0))


def _sync(s: pb.ThroughputSample) -> float:
    """The sync part of a step, strictly less than the step (the model needs compute)."""
    return min(max(s.sync_time_s, 0.0), 0.999 * s.step_time_s)


def _dump_extra(rec: _JobRec) -> dict:
    return {
        "samples": [[*k, *v] for k, v in rec.samples.items()],
        "grad": [rec.grad.sqr, rec.grad.var] if rec.grad else None,
        "profiled": sorted(rec.profiled), "usable": sorted(rec.usable),
        "held": {n: list(g) for n, g in rec.held.items()}, "held_gen": rec.held_gen,
        "generation": rec.generation, "checkpoint": rec.checkpoint,
        "attained": rec.attained, "restart_cost": rec.restart_cost,
    }


def _load_extra(rec: _JobRec, d: Mapping) -> None:
    for t, nodes, reps, atomic, accum, step, sync in d.get("samples", ()):
        rec.samples[(t, nodes, reps, atomic, accum)] = (step, sync)
        if nodes == reps == 1 and accum == 0:
            rec.estimator.add_profile(t, atomic, step, sync)
        else:
            rec.estimator.add_observation(t, nodes, reps, atomic, accum, step, sync)
    if d.get("grad"):
        rec.grad = GradParams(*d["grad"])
    rec.profiled, rec.usable = set(d.get("profiled", ())), set(d.get("usable", ()))
    rec.held = {n: tuple(g) for n, g in d.get("held", {}).items()}
    rec.generation = int(d.get("generation", 0))
    rec.held_gen = {n: int(d.get("held_gen", {}).get(n, rec.generation)) for n in rec.held}
    rec.checkpoint = float(d.get("checkpoint", 0.0))
    rec.attained = dict(d.get("attained", {}))
    if d.get("restart_cost") is not None:
        rec.restart_cost = float(d["restart_cost"])
    st = rec.job.status
    if st.HasField("allocation") and rec.held:
        rec.alloc = _stored_allocation(st.allocation, st.goodput)
    if st.state == pb.JOB_STATE_PROFILING:  # the pass was cut short: profile again
        rec.profiling.clear()
