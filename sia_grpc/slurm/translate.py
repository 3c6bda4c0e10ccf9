"""Pure translation between Slurm's JSON and Sia's policy call (no processes here).

`read_nodes(sinfo --json)` and `read_jobs(squeue --json)` turn Slurm 22.05's
OpenAPI output into `SlurmNode`s and `SlurmJob`s; `build_round` makes the
`OptimizeRequest` the policy service takes (in-process or over gRPC: the same
message either way) from them; `plan` turns its reply into `Action`s for
`sia_grpc.slurm.commands` to carry out.

What the bridge knows of an opted-in job lives in the job's Slurm comment
(`sia_grpc.slurm.ticket.Ticket`: `sia1:` and compact JSON), never only in the
bridge's memory, so a restarted bridge reads the same state and makes the same
decisions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sia_grpc.api import pb
from sia_grpc.api.convert import queues_to_pb
from sia_grpc.api.errors import ApiError
from sia_grpc.api.validation import resolve
from sia_grpc.client.spec import SpecError, spec_from_mapping, spec_to_mapping
from sia_grpc.models.catalogue import SUPPORTED_APPLICATIONS, application
from sia_grpc.models.efficiency import grad_params_at_progress
from sia_grpc.models.profiles import load_validation
from sia_grpc.nodeagent.gpus import gpu_type_for
from sia_grpc.policy.queues import QueueSet, scheduled_in
from sia_grpc.slurm.prices import measured_share
from sia_grpc.slurm.profiles import seed_samples
from sia_grpc.slurm.ticket import COMMENT_TAG, Shape, Ticket, job_environment

__all__ = [
    "COMMENT_TAG", "QUEUE_FROM", "Action", "Round", "Shape", "SlurmJob", "SlurmNode", "Ticket",
    "build_round", "job_environment", "plan", "read_jobs", "read_nodes",
]

# What a job's Slurm field names its queue when its spec names none ("": none).
QUEUE_FROM = ("", "account", "partition")

# Node states and flags (sinfo --json) under which a node takes no new work: left
# out of the round, so Sia plans nothing there.
_USABLE_STATES = frozenset({"idle", "mixed", "allocated"})
_UNUSABLE_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING",
                             "NOT_RESPONDING", "MAINTENANCE", "POWERED_DOWN", "POWERING_DOWN",
                             "REBOOT_REQUESTED", "REBOOT_ISSUED"})
# Job states in which a job holds (or is about to hold) its GPUs.
_HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED",
                             "STOPPED", "SIGNALING", "RESIZING"})
_ACTIVE_STATES = _HOLDING_STATES | {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}

# gres strings: "gpu:rtx:4", "gpu:rtx:4(S:0)", "gpu:a100:2(IDX:0-1)", "gpu:2(IDX:0,3)".
_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+?))?(?::(?P<count>\d+))?(?:\((?P<extra>[^)]*)\))?$")


# -- what Slurm says ---------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmNode:
    """A usable node with one GPU type: Slurm's gres type name and Sia's profile type."""

    name: str
    gres_type: str  # as Slurm names it ("a100")
    gpu_type: str  # as the profiles name it ("dgx-ext"), `gpu_type_for(gres_type)`
    num_gpus: int


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    state: str  # RUNNING, PENDING, ...
    held: bool  # pending, held by its user (the hold `sia slurm submit` puts on it)
    admin_held: bool  # pending, held by an operator (`scontrol hold` as root): left alone
    ticket: Ticket | None  # None: Slurm's own job
    gpus: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs it holds
    submit_time: float = 0.0
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def holding(self) -> bool:
        return self.state in _HOLDING_STATES


def _gres_entries(text: str) -> list[tuple[str | None, int]]:
    """[(type or None, count)] of the GPU entries in a gres string."""
    out = []
    for part in re.split(r",(?=[a-z])", text or ""):
        m = _GRES.match(part.strip())
        if m is None:
            continue
        count = m.group("count")
        extra = m.group("extra") or ""
        if count is None and extra.startswith("IDX:"):
            count = str(len(_indices(extra[4:])))
        out.append((m.group("type"), int(count or 0)))
    return out


def _indices(text: str) -> list[int]:
    """"0-1,3" -> [0, 1, 3]; "N/A" -> []."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out.extend(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    return out


def read_nodes(sinfo: Mapping[str, Any]) -> tuple[list[SlurmNode], dict[str, str]]:
    """The usable GPU nodes of `sinfo --json`, and why each other node was left out."""
    nodes, left_out = [], {}
    for n in sinfo.get("nodes", []):
        name = n.get("name", "")
        flags = {str(f).upper() for f in n.get("state_flags") or ()}
        state = str(n.get("state", "")).lower()
        if state not in _USABLE_STATES or flags & _UNUSABLE_FLAGS:
            left_out[name] = " ".join([state, *sorted(flags & _UNUSABLE_FLAGS)])
            continue
        entries = [(t, c) for t, c in _gres_entries(n.get("gres", "")) if c > 0]
        types = {t for t, _ in entries}
        if len(types) != 1 or None in types:
            left_out[name] = (f"gres {n.get('gres', '')!r}: Sia needs one typed GPU gres "
                              f"per node (gpu:TYPE:COUNT)")
            continue
        gres_type = entries[0][0]
        assert gres_type is not None  # (a typed gres: checked above)
        nodes.append(SlurmNode(name, gres_type, gpu_type_for(gres_type),
                               sum(c for _, c in entries)))
    return nodes, left_out


def _job_gpus(j: Mapping[str, Any]) -> dict[str, int]:
    """Node -> GPUs a running job holds: `gres_detail` lists one gres string per
    allocated node, in `job_resources.allocated_nodes` order."""
    alloc = (j.get("job_resources") or {}).get("allocated_nodes") or []
    out: dict[str, int] = {}
    for node, detail in zip(alloc, j.get("gres_detail") or [], strict=False):
        count = sum(c for _, c in _gres_entries(detail))
        if count:
            out[node["nodename"]] = out.get(node["nodename"], 0) + count
    return out


def read_jobs(squeue: Mapping[str, Any]) -> list[SlurmJob]:
    """The active (pending or running) jobs of `squeue --json`, opted-in or not."""
    out = []
    for j in squeue.get("jobs", []):
        state = str(j.get("job_state", "")).upper()
        if state not in _ACTIVE_STATES:
            continue
        job_id = int(j["job_id"])
        pending, reason = state == "PENDING", j.get("state_reason")
        out.append(SlurmJob(
            job_id=job_id, state=state,
            held=pending and not j.get("priority") and reason == "JobHeldUser",
            admin_held=pending and reason == "JobHeldAdmin",
            ticket=Ticket.parse(j.get("comment") or "", job_id),
            gpus=_job_gpus(j) if state in _HOLDING_STATES else {},
            submit_time=float(j.get("submit_time") or 0), raw=j))
    return out


# -- one round ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """A round's inputs: the request, and what `plan` needs to read its reply."""

    request: pb.OptimizeRequest
    jobs: Mapping[str, SlurmJob]  # sia id -> the Slurm job that carries it now
    stale: tuple[int, ...]  # older Slurm copies of a moved job (a move cut short)
    gres_types: Mapping[str, str]  # profile type -> Slurm's gres type name
    invalid: Mapping[str, str]  # sia id -> why its spec cannot be scheduled
    left_out: Mapping[str, str]  # node -> why it is not in the round
    now: float = 0.0  # the round's time (the bridge's clock)


def _observed_samples(ticket: Ticket) -> list[pb.ThroughputSample]:
    return [pb.ThroughputSample(gpu_type=t, num_nodes=n, num_replicas=r, atomic_batch_size=b,
                                accum_steps=a, step_time_s=step, sync_time_s=sync, count=c)
            for t, n, r, b, a, c, step, sync in ticket.obs
            if step > 0 and 0 <= sync < step]  # (the policy refuses others)


def policy_job(ticket: Ticket, now: float, queues: QueueSet | None = None,
               slurm_queue: str = "", *, launched: bool = True,
               slurm_share: float = 0.0) -> pb.PolicyJob:
    """The policy's view of an opted-in job. Its goodput information: its application's
    shipped 1-GPU profiles, what Sia bootstraps from, calibrated by its reports
    (`profiles.seed_samples`), and the step times and gradient statistics its workers
    reported to the bridge (in the ticket), else the application's initial statistics;
    its restart cost as the bridge measured it (`Bridge._measure_restart`), else its
    application's restore (the spec's `restart_cost_s` or the application's
    default) plus `slurm_share` (what a move through Slurm has cost beyond the restore:
    `prices.measured_share`). Its queue: the spec's, else `slurm_queue` (its Slurm
    account or partition, `build_round`), as far as `queues` has it (else `default`).
    Restoring (Sia keeps its GPUs) from when the bridge gives it a shape until its
    copy's first report, while Slurm has not `launched` the copy yet, and at most its
    restart cost after that (a copy that does not report). Its progress as its workers
    last reported it, and the time it has run (`Ticket.run_time`; its current copy's
    while Slurm runs it). SpecError (a ValueError) for a spec that cannot be scheduled,
    naming the field."""
    spec = spec_from_mapping(ticket.spec, source="spec")
    if not spec.queue:
        spec.queue = slurm_queue
    try:
        res = resolve(spec)
    except ApiError as err:  # the contract's checks (the controller's too), as a user's error
        field, _, detail = err.message.partition(": ")
        raise SpecError(err.field or field, detail if err.field else err.message) from None
    if spec.application not in SUPPORTED_APPLICATIONS:
        raise SpecError("spec.application", f"{spec.application!r} has no shipped profiles; "
                        f"the bridge schedules only {', '.join(SUPPORTED_APPLICATIONS)} yet")
    app = application(spec.application)
    if ticket.grad is not None:  # measured by its workers
        sqr, var = ticket.grad
    else:
        g = grad_params_at_progress(load_validation(app.name, app.init_batch_size), 0.0)
        sqr, var = g.sqr, g.var
    queue, priority, _ = scheduled_in(queues or QueueSet(), spec)
    restart_cost = (res.restart_cost + slurm_share if ticket.restart_s is None
                    else ticket.restart_s)
    restoring = ticket.shape is not None and ticket.placed is not None and (
        not launched or now - ticket.placed < restart_cost)
    return pb.PolicyJob(
        job_id=ticket.id, adaptivity=spec.adaptivity, min_gpus=res.min_gpus,
        max_gpus=res.max_gpus or 0, num_gpus=res.num_gpus or 0,
        allowed_gpu_types=sorted(res.allowed_types or ()), pipeline_gpus=res.pipeline_gpus,
        batch_size=res.batch_size or 0, init_batch_size=res.init_batch_size,
        max_batch_size=res.max_batch_size,
        type_batch_limits=[pb.TypeBatchLimits(gpu_type=t, min_local_batch_size=lo,
                                              max_local_batch_size=hi)
                           for t, (lo, hi) in sorted(res.local_bsz_limits.items())],
        samples=[*seed_samples(app.name, ticket.obs), *_observed_samples(ticket)],
        grad=pb.GradientStats(sqr=sqr, var=var),
        age_s=max(now - ticket.submitted, 0.0), restarts=ticket.moves,
        restart_cost_s=restart_cost, queue=queue, priority=priority, restoring=restoring,
        progress=ticket.progress, run_time_s=ticket.run_time(now, launched=launched))


class _Capacity:
    """GPUs free for Sia per node, handed out as dense indices (the policy's GPU
    ids; which physical GPU a job gets is Slurm's business)."""

    def __init__(self, nodes: Sequence[SlurmNode], foreign: Mapping[str, int]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.total = {n.name: max(n.num_gpus - foreign.get(n.name, 0), 0) for n in nodes}
        self.used = dict.fromkeys(self.total, 0)

    def free(self, node: str) -> int:
        return self.total.get(node, 0) - self.used.get(node, 0)

    def take(self, per_node: Mapping[str, int], gpu_type: str) -> list[pb.GpuRef] | None:
        """GPU refs for `per_node` counts, or None (and nothing taken) where they do not fit."""
        if any(self.nodes.get(n) is None or self.nodes[n].gpu_type != gpu_type
               or self.free(n) < c for n, c in per_node.items()):
            return None
        refs = []
        for n, c in per_node.items():
            refs += [pb.GpuRef(node=n, index=self.used[n] + i) for i in range(c)]
            self.used[n] += c
        return refs

    def spread(self, shape: Shape) -> dict[str, int] | None:
        """Where Slurm could put `shape` now: its GPUs over its node count, on the
        nodes of its type with the most free GPUs."""
        nodes = sorted((n for n in self.nodes.values() if n.gpu_type == shape.gpu_type
                        and self.free(n.name) > 0), key=lambda n: (-self.free(n.name), n.name))
        nodes = nodes[:shape.num_nodes]
        if len(nodes) < shape.num_nodes or sum(self.free(n.name) for n in nodes) < shape.num_gpus:
            return None
        counts, left = {n.name: 1 for n in nodes}, shape.num_gpus - len(nodes)
        for n in nodes:
            extra = min(left, self.free(n.name) - 1)
            counts[n.name] += extra
            left -= extra
        return counts if left == 0 else None


def _count_taken(foreign: dict[str, int], gpus: Mapping[str, int]) -> None:
    """Add `gpus` (per node) to the GPUs taken from Sia."""
    for n, c in gpus.items():
        foreign[n] = foreign.get(n, 0) + c


def _carriers(jobs: Iterable[SlurmJob]) -> tuple[dict[str, SlurmJob], dict[str, int], list[int]]:
    """The Slurm job that carries each opted-in job now (sia id -> it); the GPUs taken
    from Sia per node (Slurm's own jobs, and those not Sia's to move); the older copies
    of a move cut short."""
    foreign: dict[str, int] = {}
    carriers: dict[str, SlurmJob] = {}
    stale: list[int] = []
    jobs = list(jobs)
    newest: dict[str, int] = {}  # sia id -> its newest Slurm copy
    for j in jobs:
        if j.ticket is not None:
            newest[j.ticket.id] = max(newest.get(j.ticket.id, 0), j.job_id)
    for j in jobs:
        # The old copy of a job the bridge moved, ending (COMPLETING: cancelled, its
        # worker checkpointing): Sia gave its GPUs away with the move, to the copy or
        # to others, which Slurm starts once they are free. Counted as taken, they
        # would make the copies waiting for them look misplaced, and Sia place those
        # jobs again from nothing (a job started and preempted round after round).
        if j.state == "COMPLETING" and j.ticket is not None and newest[j.ticket.id] > j.job_id:
            continue
        # Slurm's own, or opted in but started by hand (no shape of Sia's, not held):
        # their GPUs are taken, and they are not Sia's to move.
        # A job whose script has ended (COMPLETING: Slurm is cleaning up) is done, not
        # Sia's to move: a copy would run it again. Its GPUs are taken until it is gone.
        if j.ticket is None or (j.ticket.shape is None and not j.held and not j.admin_held) \
                or j.state == "COMPLETING":
            _count_taken(foreign, j.gpus)
            continue
        sia_id = j.ticket.id
        old = carriers.get(sia_id)
        if old is not None:  # a move cut short: the newest copy carries the job
            keep, drop = (j, old) if j.job_id > old.job_id else (old, j)
            stale.append(drop.job_id)
            _count_taken(foreign, drop.gpus)  # taken until it is cancelled
            j = keep
        carriers[sia_id] = j
    return carriers, foreign, stale


def _policy_jobs(carriers: Mapping[str, SlurmJob], now: float, queues: QueueSet | None,
                 queue_from: str, foreign: dict[str, int],
                 ) -> tuple[list[pb.PolicyJob], dict[str, SlurmJob], dict[str, str]]:
    """Each carrier that Sia schedules as a PolicyJob (`policy_job`), oldest Slurm job
    first, and the carriers by sia id; one whose spec cannot be scheduled is left where
    it runs, its GPUs added to `foreign`, and why in the third (sia id -> reason)."""
    invalid: dict[str, str] = {}
    scheduled: dict[str, SlurmJob] = {}
    policy_jobs = []
    slurm_share = measured_share([j.ticket for j in carriers.values() if j.ticket is not None])
    for sia_id, j in sorted(carriers.items(), key=lambda kv: kv[1].job_id):
        if j.admin_held:
            continue  # an operator stopped it: not Sia's to start, and it holds no GPUs
        assert j.ticket is not None  # (a carrier's)
        try:
            slurm_queue = str(j.raw.get(queue_from) or "") if queue_from else ""
            policy_jobs.append(policy_job(j.ticket, now, queues, slurm_queue,
                                          launched=j.holding, slurm_share=slurm_share))
        except ValueError as err:  # SpecError: the reason goes in the log
            invalid[sia_id] = str(err)
            _count_taken(foreign, j.gpus)  # left where it runs, its GPUs taken
            continue
        scheduled[sia_id] = j
    return policy_jobs, scheduled, invalid


def _add_previous(request: pb.OptimizeRequest, scheduled: Mapping[str, SlurmJob],
                  cap: _Capacity) -> None:
    """Each scheduled job that has a shape of Sia's, where Slurm runs it (or could
    start it now), as its previous allocation in `request`."""
    # Running jobs first (their GPUs are where they are), then those about to run.
    for sia_id, j in sorted(scheduled.items(), key=lambda kv: not kv[1].holding):
        assert j.ticket is not None  # (a carrier's)
        shape = j.ticket.shape
        if shape is None:
            continue
        # (one Slurm has not started yet: where the bridge pinned it, else where Slurm
        # could start it, for a ticket from before pinning)
        per_node = j.gpus if j.holding else dict(shape.nodes) or cap.spread(shape)
        refs = cap.take(per_node, shape.gpu_type) if per_node else None
        if refs is None or len(refs) != shape.num_gpus:
            continue  # not where the bridge put it (a node left the round): Sia replans it
        assert per_node is not None  # (refs came from it)
        request.previous.append(pb.PreviousAllocation(job_id=sia_id, allocation=pb.Allocation(
            gpu_type=shape.gpu_type, num_gpus=shape.num_gpus, num_nodes=len(per_node),
            gpus=refs, num_replicas=shape.num_replicas, batch_size=shape.batch_size,
            atomic_batch_size=shape.atomic_batch_size, accum_steps=shape.accum_steps)))


def build_round(nodes: Sequence[SlurmNode], jobs: Iterable[SlurmJob], now: float, *,
                policy: str = "", params: Mapping[str, str] | None = None,
                round_duration_s: float = 0.0, queues: QueueSet | None = None,
                queue_from: str = "", left_out: Mapping[str, str] | None = None) -> Round:
    """The policy request for one round. Slurm's own jobs' GPUs are taken (the
    nodes offer Sia only the rest); each opted-in job is a PolicyJob, and one that
    Slurm runs, or is about to run, on its shape has it as its previous allocation.
    With `queues`, a job whose spec names no queue is in the one its Slurm
    `queue_from` ("account" or "partition") names."""
    if queue_from not in QUEUE_FROM:
        raise ValueError(f"queue_from: expected one of {', '.join(QUEUE_FROM)}, got "
                         f"{queue_from!r}")
    carriers, foreign, stale = _carriers(jobs)
    policy_jobs, scheduled, invalid = _policy_jobs(carriers, now, queues, queue_from, foreign)
    cap = _Capacity(nodes, foreign)
    request = pb.OptimizeRequest(
        nodes=[pb.NodeSpec(name=n.name, gpu_type=n.gpu_type, num_gpus=cap.total[n.name])
               for n in nodes if cap.total[n.name] > 0],
        jobs=policy_jobs, policy=policy, params=dict(params or {}),
        round_duration_s=round_duration_s)
    if queues is not None:
        request.queues.CopyFrom(queues_to_pb(queues))
    _add_previous(request, scheduled, cap)
    return Round(request=request, jobs=scheduled, stale=tuple(sorted(stale)),
                 gres_types={n.gpu_type: n.gres_type for n in reversed(nodes)},
                 invalid=invalid, left_out=dict(left_out or {}), now=now)


# -- decisions -> actions ----------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One thing to do in Slurm.

    kind "start": give held job `job_id` the shape in `ticket` and release it;
    "release": release held `job_id` (it has its shape already); "pin": give pending
    `job_id` the nodes (and batch) in `ticket`'s shape; "rebatch": write
    the new batch of running `job_id`'s same GPUs into its ticket (its workers take
    it from the bridge's reply to their next report); "move": replace
    `job_id` by a copy carrying `ticket` (a new shape, or none: held, waiting);
    "cancel": cancel `job_id`, an older copy of a moved job.
    """

    kind: str
    job_id: int
    ticket: Ticket | None = None
    reason: str = ""


def _shape(a: pb.Allocation, gres_types: Mapping[str, str]) -> Shape:
    per_node: dict[str, int] = {}
    for g in a.gpus:
        per_node[g.node] = per_node.get(g.node, 0) + 1
    return Shape(gpu_type=a.gpu_type, gres_type=gres_types.get(a.gpu_type, a.gpu_type),
                 num_gpus=a.num_gpus, num_nodes=a.num_nodes or len(per_node),
                 batch_size=a.batch_size, atomic_batch_size=a.atomic_batch_size,
                 accum_steps=a.accum_steps, num_replicas=a.num_replicas,
                 nodes=tuple(sorted(per_node.items())))


def plan(rnd: Round, response: pb.OptimizeResponse) -> list[Action]:
    """What to do in Slurm for the policy's `response`: a held job Sia places is
    started; a job whose type, GPU count or node count changes is moved (Slurm
    22.05 cannot change the GPU type of a job once set: docs/slurm.md); a job that
    keeps them is left alone (released if held), its batch changed in place if Sia
    changed it. Starts and copies are pinned to the nodes Sia placed them on (left
    to Slurm, a fifth of the bench's copies started on nodes Sia had planned for
    others, and those waited), and one Slurm has not started yet is pinned again if
    Sia's nodes for it change."""
    actions = [Action("cancel", job_id, reason="an older copy of a moved job")
               for job_id in rnd.stale]
    for d in response.decisions:
        j = rnd.jobs.get(d.job_id)
        if j is None:
            continue
        ticket = j.ticket
        assert ticket is not None  # (the round's jobs are Sia's)
        new = _shape(d.allocation, rnd.gres_types) if d.HasField("allocation") else None
        # (`placed`: from now until the copy's first report, what the move costs it)
        placed = rnd.now if new is not None else None
        if ticket.shape is None:
            if new is not None and j.held:
                actions.append(Action("start", j.job_id, replace(ticket, shape=new,
                                                                 placed=placed), d.reason))
        elif new is not None and new.same_place(ticket.shape):
            # (one Slurm has not started: pinned to Sia's nodes if they changed, with the
            # new batch; Slurm would start it where Sia plans others)
            repin = not j.holding and bool(new.nodes) and new.nodes != ticket.shape.nodes
            if j.held:
                actions.append(Action("start", j.job_id, replace(ticket, shape=new), d.reason)
                               if repin else Action("release", j.job_id, ticket, d.reason))
            elif repin:
                actions.append(Action("pin", j.job_id, replace(ticket, shape=new), d.reason))
            elif new.batch != ticket.shape.batch:  # (the workers are told: no restart)
                actions.append(Action("rebatch", j.job_id, replace(ticket, shape=new),
                                      d.reason))
        else:  # (the old copy's run ends with the move: its time is the job's so far)
            actions.append(Action("move", j.job_id, replace(
                ticket, shape=new, moves=ticket.moves + 1, placed=placed,
                ran=ticket.run_time(rnd.now, launched=j.holding), running_since=None),
                d.reason))
    return actions


def spec_mapping(spec: pb.JobSpec) -> dict[str, Any]:
    """The spec as a ticket carries it: without the command (the batch script runs it)."""
    out = spec_to_mapping(spec)
    out.pop("command", None)
    return out
