"""Conversions between `sia.v1` wire messages and the scheduling core's types.

Pure: no I/O, no clocks, no state. Everything a client can get wrong becomes an
INVALID_ARGUMENT `ApiError` naming the indexed request field
(`jobs[2].samples[0].step_time_s`), so the caller can point at the exact value.
The core's own ValueErrors, whose messages start with the offending field's
name ("max_gpus: ..."), are translated to those paths rather than duplicated.

Proto3 has no "unset" for scalars, so 0 means "not given" wherever the protos
say so: min_gpus 0 = 1, max_gpus 0 = no limit, pipeline_gpus 0 = 1,
restart_cost_s 0 = `DEFAULT_RESTART_COST_S`, and so on (see each function).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError, invalid
from sia_grpc.models.bootstrap import JobGoodputModel, ThroughputEstimator
from sia_grpc.models.efficiency import NEUTRAL_GRAD, GradParams
from sia_grpc.policy.cluster import Cluster, Config, GpuId, Node
from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.queues import DEFAULT_QUEUE, Queue, QueueSet
from sia_grpc.policy.queues.rows import row_binds
from sia_grpc.policy.types import Adaptivity, JobAllocation, PolicyJob, RoundResult

__all__ = [
    "NEUTRAL_GRAD",
    "DEFAULT_RESTART_COST_S",
    "MAX_GPUS_PER_NODE",
    "adaptivity_from_pb",
    "allocation_from_pb",
    "allocation_to_pb",
    "cluster_from_pb",
    "decision_to_pb",
    "goodput_model",
    "grad_from_pb",
    "local_limits_from_pb",
    "policy_job_from_pb",
    "queue_of",
    "queues_from_pb",
    "queues_to_pb",
    "round_to_pb",
    "side_rows_to_pb",
    "usage_to_pb",
]

DEFAULT_RESTART_COST_S = 30.0  # the core's PolicyJob default, until a job has measured one

# Without gradient statistics: no gradient noise (var = 0). Then gain(B) = 1 at every
# batch, i.e. a step at a larger batch makes no more progress than one at
# init_batch_size, so an adaptive job's goodput is its step rate at the smallest batch
# it can run: it keeps the batch it was given and is scaled strongly, never grows its
# batch on a guess. (sqr = 0, var > 0 would be the opposite, "perfectly efficient at
# any batch", and push every unknown job to max_batch_size.) Fixed-batch jobs never
# consult the statistics, so the choice does not change them at all.

# A node bigger than this is a typo, and an odd count that large would make the
# cluster model split it into that many one-GPU virtual nodes.
MAX_GPUS_PER_NODE = 1024

_ADAPTIVITY: dict[int, Adaptivity] = {
    pb.ADAPTIVITY_ADAPTIVE: Adaptivity.ADAPTIVE,
    pb.ADAPTIVITY_STRONG_SCALING: Adaptivity.STRONG_SCALING,
    pb.ADAPTIVITY_RIGID: Adaptivity.RIGID,
}

# PolicyJob's field names (as its ValueErrors start) -> pb.PolicyJob's.
_JOB_FIELDS = {
    "job_id": "job_id", "pipeline_gpus": "pipeline_gpus", "min_gpus": "min_gpus",
    "max_gpus": "max_gpus", "batch_size": "batch_size", "num_gpus": "num_gpus",
    "allowed_types": "allowed_gpu_types", "age": "age_s", "num_restarts": "restarts",
    "restart_cost": "restart_cost_s", "stint": "stint_s", "total_run_time": "run_time_s",
}
_NODE_FIELDS = {"node.name": "name", "node.gpu_type": "gpu_type", "node.num_gpus": "num_gpus"}


def _from_core(path: str, err: ValueError, fields: Mapping[str, str]) -> ApiError:
    """A core error as INVALID_ARGUMENT on `path.<wire field>` (a `FieldError` for a
    field we know), else on `path` itself."""
    if isinstance(err, FieldError) and err.field in fields:
        return invalid(f"{path}.{fields[err.field]}", err.problem)
    return invalid(path, str(err))


def _finite_nonneg(value: float, path: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise invalid(path, f"must be a finite non-negative number, got {value!r}")
    return float(value)


def _fraction(value: float, path: str) -> float:
    if not 0 <= value <= 1:  # (NaN fails too)
        raise invalid(path, f"must be a fraction in [0, 1], got {value!r}")
    return float(value)


# -- cluster --------------------------------------------------------------------------


def cluster_from_pb(nodes: Sequence[pb.NodeSpec], path: str = "nodes") -> Cluster:
    """The cluster of `nodes`; names must be unique and valid, every node have GPUs."""
    if not nodes:
        raise invalid(path, "at least one node is required")
    seen: dict[str, int] = {}
    out: list[Node] = []
    for i, spec in enumerate(nodes):
        here = f"{path}[{i}]"
        if spec.num_gpus > MAX_GPUS_PER_NODE:
            raise invalid(f"{here}.num_gpus",
                          f"at most {MAX_GPUS_PER_NODE} GPUs per node, got {spec.num_gpus}")
        try:
            node = Node(spec.name, spec.gpu_type, int(spec.num_gpus))
        except ValueError as e:
            raise _from_core(here, e, _NODE_FIELDS) from None
        if node.name in seen:
            raise invalid(f"{here}.name",
                          f"duplicate node name {node.name!r} (also {path}[{seen[node.name]}])")
        seen[node.name] = i
        out.append(node)
    return Cluster.of(out)


# -- allocations ----------------------------------------------------------------------


def allocation_to_pb(a: JobAllocation) -> pb.Allocation:
    """The wire form of an allocation. `goodput` (the policy's estimate) has no
    field in `Allocation` and is dropped."""
    return pb.Allocation(
        gpu_type=a.config.gpu_type, num_gpus=a.config.num_gpus, num_nodes=a.config.num_nodes,
        gpus=[pb.GpuRef(node=g.node, index=g.index) for g in a.gpus],
        batch_size=a.batch_size, num_replicas=a.num_replicas, atomic_batch_size=a.atomic_bsz,
        accum_steps=a.accum_steps)


def allocation_from_pb(a: pb.Allocation, cluster: Cluster, path: str) -> JobAllocation:
    """An allocation that holds on `cluster`: `num_gpus` distinct, existing GPUs of
    its type. GPU order carries no meaning, so GPUs come back sorted (the placer's
    order; an unsorted list would otherwise read as a move). num_nodes 0 = the
    number of nodes the GPUs are on. goodput is 0 (not on the wire)."""
    if a.gpu_type not in cluster.gpu_types:
        raise invalid(f"{path}.gpu_type", f"unknown GPU type {a.gpu_type!r}; the cluster "
                                          f"has {', '.join(cluster.gpu_types)}")
    if a.num_gpus < 1:
        raise invalid(f"{path}.num_gpus", "must be >= 1")
    if len(a.gpus) != a.num_gpus:
        raise invalid(f"{path}.gpus", f"lists {len(a.gpus)} GPUs for num_gpus {a.num_gpus}")
    gpus: set[GpuId] = set()
    for k, ref in enumerate(a.gpus):
        try:
            node = cluster.node(ref.node)
        except KeyError:
            raise invalid(f"{path}.gpus", f"gpus[{k}]: no node {ref.node!r} in the cluster") \
                from None
        if node.gpu_type != a.gpu_type:
            raise invalid(f"{path}.gpus", f"gpus[{k}]: node {node.name!r} has {node.gpu_type} "
                                          f"GPUs, not {a.gpu_type}")
        if ref.index >= node.num_gpus:
            raise invalid(f"{path}.gpus", f"gpus[{k}]: node {node.name!r} has GPUs "
                                          f"0..{node.num_gpus - 1}, not {ref.index}")
        gpu = GpuId(ref.node, ref.index)
        if gpu in gpus:
            raise invalid(f"{path}.gpus", f"gpus[{k}]: {gpu} is listed twice")
        gpus.add(gpu)
    num_nodes = a.num_nodes or len({g.node for g in gpus})
    if num_nodes > a.num_gpus:
        raise invalid(f"{path}.num_nodes", f"{num_nodes} nodes for {a.num_gpus} GPUs")
    return JobAllocation(
        config=Config(a.gpu_type, num_nodes, a.num_gpus), gpus=tuple(sorted(gpus)),
        num_replicas=a.num_replicas, batch_size=a.batch_size, atomic_bsz=a.atomic_batch_size,
        accum_steps=a.accum_steps)


# -- goodput ---------------------------------------------------------------------------


def grad_from_pb(grad: pb.GradientStats | None, path: str = "grad") -> GradParams:
    """Gradient statistics; None (not reported yet) gives `NEUTRAL_GRAD`."""
    if grad is None:
        return NEUTRAL_GRAD
    return GradParams(sqr=_finite_nonneg(grad.sqr, f"{path}.sqr"),
                      var=_finite_nonneg(grad.var, f"{path}.var"))


def _check_sample(s: pb.ThroughputSample, path: str) -> None:
    if not s.gpu_type:
        raise invalid(f"{path}.gpu_type", "must be set")
    if s.num_nodes < 1:
        raise invalid(f"{path}.num_nodes", "must be >= 1")
    if s.num_replicas < s.num_nodes:
        raise invalid(f"{path}.num_replicas",
                      f"{s.num_replicas} is below num_nodes {s.num_nodes}")
    if s.atomic_batch_size < 1:
        raise invalid(f"{path}.atomic_batch_size", "must be >= 1")
    if not (math.isfinite(s.step_time_s) and s.step_time_s > 0):
        raise invalid(f"{path}.step_time_s", f"must be a positive number, got {s.step_time_s!r}")
    if not (math.isfinite(s.sync_time_s) and s.sync_time_s >= 0):
        raise invalid(f"{path}.sync_time_s",
                      f"must be a non-negative number, got {s.sync_time_s!r}")
    # The estimator models a non-syncing micro-batch as step - sync: it must be positive.
    if s.sync_time_s >= s.step_time_s:
        raise invalid(f"{path}.sync_time_s",
                      f"{s.sync_time_s} is not below step_time_s {s.step_time_s}")


def goodput_model(samples: Sequence[pb.ThroughputSample], grad: pb.GradientStats | None, *,
                  init_batch_size: int, max_batch_size: int,
                  local_bsz_limits: Mapping[str, tuple[int, int]], path: str = "samples",
                  grad_path: str = "grad") -> JobGoodputModel:
    """A job's goodput model from its samples, as the simulator builds one.

    1-GPU samples (num_nodes == num_replicas == 1, accum_steps 0) are profiles
    (`add_profile`), the rest observations of the job's own runs
    (`add_observation`); repeated shapes are averaged, each sample counting once
    whatever its `count` (the simulator likewise reports each shape once). Missing
    `grad` gives `NEUTRAL_GRAD`. Types without `local_bsz_limits` get no estimate.

    Sample and grad problems are INVALID_ARGUMENT on `path[i].<field>` /
    `grad_path.<field>`; the batch arguments are the caller's to validate (a
    ValueError here).
    """
    gp = grad_from_pb(grad, grad_path)
    est = ThroughputEstimator()
    for i, s in enumerate(samples):
        here = f"{path}[{i}]"
        _check_sample(s, here)
        try:
            if s.num_nodes == 1 and s.num_replicas == 1 and s.accum_steps == 0:
                est.add_profile(s.gpu_type, s.atomic_batch_size, s.step_time_s, s.sync_time_s)
            else:
                est.add_observation(s.gpu_type, s.num_nodes, s.num_replicas,
                                    s.atomic_batch_size, s.accum_steps, s.step_time_s,
                                    s.sync_time_s)
        except ValueError as e:  # unreachable after _check_sample; the core has the last word
            raise invalid(here, str(e)) from None
    return JobGoodputModel(estimator=est, grad=gp, init_batch_size=int(init_batch_size),
                           max_batch_size=int(max_batch_size),
                           local_bsz_limits=dict(local_bsz_limits))


def local_limits_from_pb(j: pb.PolicyJob, path: str) -> dict[str, tuple[int, int]]:
    """Per-type (min, max) micro-batch: `type_batch_limits` where given
    (min_local_batch_size 0 = 1), else the smallest and largest atomic batch among
    the type's samples (a range known to fit in memory). A type with neither has no
    limits and so no estimate: the job is not placed there, and the policy's reason
    says so; that is the state of a job still being profiled, not an error."""
    limits: dict[str, tuple[int, int]] = {}
    for k, tl in enumerate(j.type_batch_limits):
        here = f"{path}.type_batch_limits[{k}]"
        if not tl.gpu_type:
            raise invalid(f"{here}.gpu_type", "must be set")
        if tl.gpu_type in limits:
            raise invalid(f"{here}.gpu_type", f"duplicate limits for {tl.gpu_type!r}")
        lo = tl.min_local_batch_size or 1
        if tl.max_local_batch_size < lo:
            raise invalid(f"{here}.max_local_batch_size",
                          f"{tl.max_local_batch_size} is below the minimum {lo}")
        limits[tl.gpu_type] = (lo, tl.max_local_batch_size)
    inferred: dict[str, tuple[int, int]] = {}
    for s in j.samples:
        if s.gpu_type in limits or s.atomic_batch_size < 1:
            continue  # bad samples are reported by goodput_model, with their index
        lo, hi = inferred.get(s.gpu_type, (s.atomic_batch_size, s.atomic_batch_size))
        inferred[s.gpu_type] = (min(lo, s.atomic_batch_size), max(hi, s.atomic_batch_size))
    return {**limits, **inferred}


def adaptivity_from_pb(value: int, path: str) -> Adaptivity:
    """UNSPECIFIED is an error, never a default (see job.proto)."""
    if value == pb.ADAPTIVITY_UNSPECIFIED:
        raise invalid(path, "must be set")
    try:
        return _ADAPTIVITY[value]
    except KeyError:
        raise invalid(path, f"unknown value {value}") from None


def policy_job_from_pb(j: pb.PolicyJob, path: str) -> PolicyJob:
    """The core's view of one job.

    Defaults for 0: init_batch_size = batch_size (one of them is required);
    max_batch_size = the larger of init_batch_size and batch_size (the batch never
    grows); restart_cost_s = `DEFAULT_RESTART_COST_S`; min_gpus = 1; max_gpus,
    num_gpus, batch_size = none; pipeline_gpus = 1; allowed_gpu_types empty = any.
    The request has no submission time or attained service per type: FIFO orders
    by age (`submit_time = -age_s`) and Gavel sees every job as new. `progress` and
    `run_time_s` (0: unknown) are the core's `progress` and `total_run_time`, what
    its remaining run is estimated from (`PolicyJob.remaining_run_time`). Local
    batch limits: see `local_limits_from_pb`.
    """
    adaptivity = adaptivity_from_pb(j.adaptivity, f"{path}.adaptivity")
    age = _finite_nonneg(j.age_s, f"{path}.age_s")
    restart_cost = _finite_nonneg(j.restart_cost_s, f"{path}.restart_cost_s")
    init = j.init_batch_size or j.batch_size
    if not init:
        raise invalid(f"{path}.init_batch_size", "must be set (or batch_size)")
    max_bs = j.max_batch_size or max(init, j.batch_size)
    if max_bs < init:
        raise invalid(f"{path}.max_batch_size", f"{max_bs} is below init_batch_size {init}")
    if j.batch_size > max_bs:
        raise invalid(f"{path}.batch_size", f"{j.batch_size} is above max_batch_size {max_bs}")
    model = goodput_model(
        j.samples, j.grad if j.HasField("grad") else None, init_batch_size=init,
        max_batch_size=max_bs, local_bsz_limits=local_limits_from_pb(j, path),
        path=f"{path}.samples", grad_path=f"{path}.grad")
    try:
        return PolicyJob(
            job_id=j.job_id, model=model, adaptivity=adaptivity, min_gpus=j.min_gpus or 1,
            max_gpus=j.max_gpus or None,
            allowed_types=frozenset(j.allowed_gpu_types) or None,
            pipeline_gpus=j.pipeline_gpus or 1, batch_size=j.batch_size or None,
            num_gpus=j.num_gpus or None, age=age, num_restarts=j.restarts,
            restart_cost=restart_cost or DEFAULT_RESTART_COST_S, submit_time=-age,
            queue=j.queue or DEFAULT_QUEUE, priority=j.priority,
            stint=_finite_nonneg(j.stint_s, f"{path}.stint_s"), restoring=j.restoring,
            progress=_fraction(j.progress, f"{path}.progress"),
            total_run_time=_finite_nonneg(j.run_time_s, f"{path}.run_time_s"))
    except ValueError as e:
        raise _from_core(path, e, _JOB_FIELDS) from None


# -- decisions -------------------------------------------------------------------------


def decision_to_pb(job_id: str, result: RoundResult) -> pb.JobDecision:
    """One job's outcome of a round: its allocation (unset: no GPUs), whether it
    must checkpoint-restart, and the policy's reason."""
    d = pb.JobDecision(job_id=job_id, restart=job_id in result.restarted,
                       reason=result.reasons.get(job_id, ""))
    alloc = result.allocations.get(job_id)
    if alloc is not None:
        d.allocation.CopyFrom(allocation_to_pb(alloc))
    return d


def round_to_pb(result: RoundResult, jobs: Iterable[PolicyJob | str]) -> list[pb.JobDecision]:
    """A decision for every job of the round (PolicyJobs or their ids), in order,
    including those left without GPUs."""
    return [decision_to_pb(j if isinstance(j, str) else j.job_id, result) for j in jobs]


# -- queues ----------------------------------------------------------------------------


def queues_from_pb(cfg: pb.QueueConfig, path: str = "queues") -> QueueSet:
    """The QueueSet of `cfg`, read by the very parser of the queues TOML
    (`QueueSet.from_mapping`), so a mistake is named by the same path as in the file:
    INVALID_ARGUMENT on `queues.queue[1].guarantee.rtx`. Proto3's zeros: a class's
    weight 0 = 1, default_priority "" = "default"; the optional fields unset = not given."""
    data: dict[str, object] = {
        "queue": [_queue_table(q) for q in cfg.queue],
        "priority_class": [{"name": c.name, **({"weight": c.weight} if c.weight else {})}
                           for c in cfg.priority_class],
        "unit_weights": dict(cfg.unit_weights), "min_runtime_s": cfg.min_runtime_s}
    if cfg.default_priority:
        data["default_priority"] = cfg.default_priority
    if cfg.HasField("max_restarts_per_round"):
        data["max_restarts_per_round"] = int(cfg.max_restarts_per_round)
    try:
        return QueueSet.from_mapping(data)
    except FieldError as err:
        raise invalid(f"{path}.{err.field}", err.problem) from None


def _queue_table(q: pb.QueueSpec) -> dict[str, object]:
    table: dict[str, object] = {"name": q.name, "tenants": list(q.tenants),
             "guarantee": {t: int(n) for t, n in q.guarantee.items()},
             "guarantee_units": q.guarantee_units,
             "borrow_limit": {t: int(n) for t, n in q.borrow_limit.items()}}
    if q.HasField("min_runtime_s"):
        table["min_runtime_s"] = q.min_runtime_s
    return table


def queue_of(queues: QueueSet, queue: str, priority: str, path: str) -> Queue:
    """The queue a job names ("": `default`), its priority class checked too;
    INVALID_ARGUMENT on `path.queue` or `path.priority` for a name `queues` lacks."""
    try:
        queues.priority(priority)
        return queues.queue(queue)
    except FieldError as err:
        raise invalid(f"{path}.{err.field}", err.problem) from None


def queues_to_pb(queues: QueueSet) -> pb.QueueConfig:
    """The wire form of a QueueSet; `queues_from_pb` gives it back unchanged."""
    cfg = pb.QueueConfig(default_priority=queues.default_priority,
                         unit_weights=dict(queues.unit_weights),
                         min_runtime_s=queues.min_runtime_s)
    for q in queues.queues:
        spec = cfg.queue.add(name=q.name, tenants=sorted(q.tenants), guarantee=dict(q.guarantee),
                             guarantee_units=q.guarantee_units, borrow_limit=dict(q.borrow_limit))
        if q.min_runtime_s is not None:
            spec.min_runtime_s = q.min_runtime_s
    for c in queues.priority_classes:
        cfg.priority_class.add(name=c.name, weight=c.weight)
    if queues.max_restarts_per_round is not None:
        cfg.max_restarts_per_round = queues.max_restarts_per_round
    return cfg


def usage_to_pb(usage: Mapping[str, Mapping[str, int]]) -> list[pb.QueueUsage]:
    """RoundResult.queues on the wire."""
    return [pb.QueueUsage(queue=q, gpus={t: int(n) for t, n in gpus.items()})
            for q, gpus in usage.items()]


def side_rows_to_pb(rows: Mapping[str, tuple[float, float]]) -> list[pb.SideRow]:
    """RoundResult.rows on the wire, each marked binding or not (`row_binds`)."""
    return [pb.SideRow(name=name, activity=a, bound=b, binding=row_binds(a, b))
            for name, (a, b) in rows.items()]
