"""The controller's records of jobs and nodes, and their persisted form.

A job is stored as its `pb.Job` (what clients read) plus a controller-private
`extra` blob (JSON: samples, gradient statistics, profiles, the GPUs it holds and
for which generation, checkpoint, attained time, measured restart cost, the restart
being measured), written with a format version (`EXTRA_VERSION`) so a later
controller can read an older blob or refuse one from the future.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import timestamp_pb2

from sia_grpc.api import pb
from sia_grpc.api.validation import Resolved
from sia_grpc.controller.machine.transitions import TERMINAL
from sia_grpc.models.bootstrap import ThroughputEstimator
from sia_grpc.models.efficiency import GradParams
from sia_grpc.policy.cluster import Config, GpuId
from sia_grpc.policy.types import JobAllocation

# A measured step time's key: (GPU type, nodes, replicas, atomic batch size,
# accumulation steps).
SampleKey = tuple[str, int, int, int, int]


@dataclass
class NodeRec:
    name: str
    gpu_type: str
    num_gpus: int
    version: str = ""
    isolation: str = ""  # its agent's (Register.isolation)
    state: int = pb.NODE_STATE_READY
    last_seen: float = 0.0
    holder: dict[int, str] = field(default_factory=dict)  # GPU index -> job physically on it
    # Books restored from the store, not yet confirmed by the agent's registration
    # (two restored jobs may both name a GPU: the agent's report settles it).
    restored: bool = False

    @property
    def bookable(self) -> bool:
        """Whether its free GPUs may be given out (a pass, a RUN): it is READY and its
        agent has registered with this controller.

        The rule: no GPU of a node is booked before its agent has said what runs on
        it. A node restored from the store (a new leader, a restart) has only what
        its jobs held as of the last write: a profiling pass the old leader started
        there is not stored, so its GPU looks free. Booked to another job then, it
        clashed with the pass the agent reported on registering; the agent refused
        that job, the refusal freed the GPU in the books while the pass ran on, and
        round after round sent a job there again."""
        return self.state == pb.NODE_STATE_READY and not self.restored


@dataclass
class JobRec:
    job: pb.Job
    res: Resolved
    estimator: ThroughputEstimator = field(default_factory=ThroughputEstimator)
    samples: dict[SampleKey, tuple[float, float]] = field(default_factory=dict)
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
    failures: int = 0  # times its workers failed and it was requeued (`job_retries`)
    # (master node, generation, port) of the generation's rendezvous (`_master_port`).
    rendezvous: tuple[str, int, int] | None = None
    checkpoint: float = 0.0  # progress fraction of its last checkpoint
    attained: dict[str, float] = field(default_factory=dict)
    run_since: float | None = None  # attained time is accounted up to here
    started_at: float = 0.0  # when its current generation was started
    last_persist: float = 0.0
    restart_cost: float | None = None  # measured checkpoint + restore seconds, once known
    # (when, generation) of the restart under way: its cost (`status.restart_seconds`)
    # is measured up to the first step a later generation reports.
    restart_began: tuple[float, int] | None = None
    # The round's reason for a move, shown once the move lands (RUNNING, or QUEUED if
    # preempted); until then the job says it is checkpointing or starting.
    next_reason: str = ""
    # The samples' JSON as last persisted, with the estimator's (uid, version) it was
    # encoded at: most writes of a record change its status, not its samples.
    samples_json: tuple[tuple[int, int] | None, str] = field(
        default=(None, ""), repr=False, compare=False)
    # Each sample's JSON with the value tuple it encodes: a new observation re-encodes
    # its own entry, not the job's whole list (`encode_extra`).
    sample_parts: dict[SampleKey, tuple[tuple[float, float], str]] = field(
        default_factory=dict, repr=False, compare=False)

    def restart_s(self) -> float:
        """S_i of Sia's restart factor: measured when known, else the spec's hint."""
        return self.restart_cost if self.restart_cost is not None else self.res.restart_cost

    def begin_restart(self, at: float) -> None:
        """One checkpoint-restart cycle begins (a move, resize, preemption or requeue):
        counted, its cost measured from now, and no throughput until it runs again."""
        self.job.status.restarts += 1
        self.job.status.throughput = 0.0
        self.restart_began = (at, self.generation)

    def reported(self, samples: list[pb.ThroughputSample], at: float) -> bool:
        """Steps its current generation reported (valid samples, the newest shape
        last): its throughput, and the end of a restart under way; whether that ended."""
        if not samples or self.state != pb.JOB_STATE_RUNNING:
            return False  # (a checkpointing job's last steps are no throughput of a next)
        self.job.status.throughput = samples_per_second(samples[-1])
        if self.restart_began is None or self.generation <= self.restart_began[1]:
            return False
        self.job.status.restart_seconds = max(at - self.restart_began[0], 0.0)
        self.restart_began = None
        return True

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def state(self) -> int:
        return self.job.status.state


def stored_allocation(a: pb.Allocation, goodput: float = 0.0) -> JobAllocation:
    """An allocation as this controller stored it (trusted: it was placed here, so
    unlike `convert.allocation_from_pb` it needs no cluster to check against)."""
    return JobAllocation(
        config=Config(a.gpu_type, num_nodes=a.num_nodes, num_gpus=a.num_gpus),
        gpus=tuple(GpuId(g.node, g.index) for g in a.gpus), num_replicas=a.num_replicas,
        batch_size=a.batch_size, atomic_bsz=a.atomic_batch_size, accum_steps=a.accum_steps,
        goodput=goodput)


def by_node(a: JobAllocation) -> list[tuple[str, tuple[int, ...]]]:
    """(node, its GPU indices) in node order."""
    out: dict[str, list[int]] = {}
    for g in a.gpus:
        out.setdefault(g.node, []).append(g.index)
    return [(n, tuple(sorted(out[n]))) for n in sorted(out)]


def batch_key(a: JobAllocation | None) -> tuple[int, int, int] | None:
    return None if a is None else (a.batch_size, a.atomic_bsz, a.accum_steps)


def same_gpus(a: JobAllocation | None, b: JobAllocation | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.config == b.config and tuple(sorted(a.gpus)) == tuple(sorted(b.gpus))


def timestamp(at: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(at * 1e9))
    return ts


def valid_sample(s: pb.ThroughputSample) -> bool:
    """What the throughput model can take; anything else is an agent's bug, dropped."""
    return (math.isfinite(s.step_time_s) and 0 < s.step_time_s < 86400 and s.num_nodes >= 1
            and s.num_replicas >= s.num_nodes and s.atomic_batch_size >= 1
            and math.isfinite(s.sync_time_s))


def valid_grad(g: pb.GradientStats) -> bool:
    """Gradient statistics the goodput model can use: finite, non-negative, not both 0
    (an fp16 overflow reports inf; taken, it would starve the job of GPUs for good)."""
    return (math.isfinite(g.sqr) and math.isfinite(g.var) and g.sqr >= 0 and g.var >= 0
            and (g.sqr > 0 or g.var > 0))


def sync_part(s: pb.ThroughputSample) -> float:
    """The sync part of a step, strictly less than the step (the model needs compute)."""
    return min(max(s.sync_time_s, 0.0), 0.999 * s.step_time_s)


def samples_per_second(s: pb.ThroughputSample) -> float:
    """A valid sample's training throughput: an iteration is `accum_steps` micro-batches
    without the sync and one with it (`models.throughput`), each of `atomic_batch_size`
    samples on each replica."""
    iteration = s.step_time_s + s.accum_steps * (s.step_time_s - sync_part(s))
    return s.num_replicas * s.atomic_batch_size * (s.accum_steps + 1) / iteration


# The extra blob's format: 1 (no "v": before versions were written), 2 (+ held_gen).
EXTRA_VERSION = 2


def encode_extra(rec: JobRec) -> bytes:
    """The extra blob (compact JSON). Its bulk, the samples, is encoded again only
    when they changed: every change to them is new data for the job's estimator,
    which bumps its version (`_telemetry`, `_profiled`, `load_extra`)."""
    key = (rec.estimator.uid, rec.estimator.version)
    if rec.samples_json[0] != key:
        rec.samples_json = (key, _samples_json(rec))
    rest = _ENCODER.encode({
        "grad": [rec.grad.sqr, rec.grad.var] if rec.grad else None,
        "profiled": sorted(rec.profiled), "usable": sorted(rec.usable),
        "held": {n: list(g) for n, g in rec.held.items()}, "held_gen": rec.held_gen,
        "generation": rec.generation, "checkpoint": rec.checkpoint,
        "attained": rec.attained, "restart_cost": rec.restart_cost,
        "restart_began": rec.restart_began, "failures": rec.failures,
    })
    # (spliced: the same bytes as one json.dumps of the whole, samples second)
    return f'{{"v":{EXTRA_VERSION},"samples":{rec.samples_json[1]},{rest[1:]}'.encode()


_COMPACT = (",", ":")
_ENCODER = json.JSONEncoder(separators=_COMPACT)  # (json.dumps builds one a call)


def _samples_json(rec: JobRec) -> str:
    """`json.dumps` of the samples as rows `[*key, step, sync]`, to the byte, from each
    row's JSON as last encoded (a job has tens of samples; a report changes one)."""
    parts = rec.sample_parts
    out = []
    for k, v in rec.samples.items():
        part = parts.get(k)
        if part is None or part[0] is not v:  # (a new value is a new tuple: 0.0 ≠ -0.0)
            part = parts[k] = (v, _ENCODER.encode([*k, *v]))
        out.append(part[1])
    if len(parts) > len(out):  # (a sample dropped: its entry goes too)
        for k in [k for k in parts if k not in rec.samples]:
            del parts[k]
    return "[" + ",".join(out) + "]"


def load_extra(rec: JobRec, d: Mapping[str, Any]) -> None:
    version = int(d.get("v", 1))
    if version > EXTRA_VERSION:  # written by a newer controller: not guessed at
        raise ValueError(f"job {rec.job_id!r}: its stored state has format {version}, newer "
                         f"than this controller's {EXTRA_VERSION}; run the newer controller")
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
    rec.failures = int(d.get("failures", 0))
    rec.attained = dict(d.get("attained", {}))
    if d.get("restart_cost") is not None:
        rec.restart_cost = float(d["restart_cost"])
    if d.get("restart_began") is not None:
        at, generation = d["restart_began"]
        rec.restart_began = (float(at), int(generation))
    st = rec.job.status
    if st.HasField("allocation") and rec.held:
        rec.alloc = stored_allocation(st.allocation, st.goodput)
    if st.state == pb.JOB_STATE_PROFILING:  # the pass was cut short: profile again
        rec.profiling.clear()


def live_rendezvous(rec: JobRec) -> tuple[str, int] | None:
    """(master node, port) where the job's current generation may still listen
    (`Moves._master_port`): while workers are not yet stopped, whatever the job's
    state, or while it has an allocation to run on; else None."""
    if rec.rendezvous is None or not (rec.held or (rec.state not in TERMINAL
                                                   and rec.alloc is not None)):
        return None
    return rec.rendezvous[0], rec.rendezvous[2]
