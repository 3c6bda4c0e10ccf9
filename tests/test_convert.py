"""Wire <-> core conversions: lossless round trips, every malformed value reported
on its own indexed field, and goodput models identical to the simulator's."""

from __future__ import annotations

import dataclasses
import math
import pickle

import grpc
import numpy as np
import pytest

from sia_grpc.api import pb
from sia_grpc.api.convert import (
    DEFAULT_RESTART_COST_S,
    NEUTRAL_GRAD,
    allocation_from_pb,
    allocation_to_pb,
    cluster_from_pb,
    goodput_model,
    policy_job_from_pb,
    round_to_pb,
)
from sia_grpc.api.errors import ApiError
from sia_grpc.controller.service.policy_service import _in_worker
from sia_grpc.emulation import load_app
from sia_grpc.models.bootstrap import JobGoodputModel
from sia_grpc.models.efficiency import gain
from sia_grpc.policy import Adaptivity, Config, GpuId, JobAllocation, RoundResult
from sia_grpc.policy.cluster import Cluster
from sia_grpc.sim.engine import _bootstrap

CLUSTER = Cluster.uniform({"aws": (2, 4), "rtx": (1, 8)})


def nodes_pb(cluster: Cluster) -> list[pb.NodeSpec]:
    return [pb.NodeSpec(name=n.name, gpu_type=n.gpu_type, num_gpus=n.num_gpus)
            for n in cluster.nodes]


def profile_samples(app) -> list[pb.ThroughputSample]:
    """The simulator's profiling pass (`sim.engine._bootstrap`) as wire samples."""
    out = []
    for t in app.gpu_types:
        seed = app.seed_profile(t)
        lo, hi = app.local_bsz_limits(t)
        sizes = (np.unique(seed.local_bsz) if seed is not None
                 else np.unique(np.geomspace(lo, hi, 10).round()))
        for bsz in sizes[(sizes >= lo) & (sizes <= hi)]:
            step, sync = app.step_time(t, 1, 1, int(bsz))
            out.append(pb.ThroughputSample(gpu_type=t, num_nodes=1, num_replicas=1,
                                           atomic_batch_size=int(bsz), step_time_s=step,
                                           sync_time_s=sync, count=1))
    return out


def sample(**kw) -> pb.ThroughputSample:
    base = dict(gpu_type="aws", num_nodes=1, num_replicas=1, atomic_batch_size=32,
                step_time_s=0.2, sync_time_s=0.0, count=1)
    return pb.ThroughputSample(**{**base, **kw})


def job_pb(**kw) -> pb.PolicyJob:
    base = dict(job_id="j", adaptivity=pb.ADAPTIVITY_ADAPTIVE, init_batch_size=64,
                max_batch_size=1024, samples=[sample(atomic_batch_size=b, step_time_s=0.01 * b)
                                              for b in (16, 64, 256)])
    return pb.PolicyJob(**{**base, **kw})


def field_of(excinfo) -> str:
    err = excinfo.value
    assert isinstance(err, ApiError)
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.message.startswith(err.field + ": ")
    return err.field


# -- allocations --------------------------------------------------------------------------


def test_allocation_round_trip_is_lossless_but_for_goodput():
    a = JobAllocation(Config("aws", 2, 8), tuple(GpuId(f"aws-{i}", k) for i in (0, 1)
                                                 for k in range(4)),
                      num_replicas=8, batch_size=1024, atomic_bsz=64, accum_steps=1, goodput=9.5)
    wire = allocation_to_pb(a)
    assert (wire.gpu_type, wire.num_gpus, wire.num_nodes) == ("aws", 8, 2)
    assert (wire.batch_size, wire.num_replicas, wire.atomic_batch_size, wire.accum_steps) == \
        (1024, 8, 64, 1)
    back = allocation_from_pb(pb.Allocation.FromString(wire.SerializeToString()), CLUSTER, "a")
    assert back == dataclasses.replace(a, goodput=0.0)
    assert allocation_to_pb(back) == wire


def test_allocation_gpu_order_is_normalised_and_num_nodes_defaults_to_nodes_used():
    wire = pb.Allocation(gpu_type="aws", num_gpus=2,
                         gpus=[pb.GpuRef(node="aws-1", index=3), pb.GpuRef(node="aws-0", index=0)])
    a = allocation_from_pb(wire, CLUSTER, "a")
    assert a.gpus == (GpuId("aws-0", 0), GpuId("aws-1", 3))  # sorted: the placer's order
    assert a.config == Config("aws", 2, 2)


BAD_ALLOCATIONS = {
    "unknown type": (dict(gpu_type="v100"), "gpu_type"),
    "no gpus": (dict(num_gpus=0, gpus=[]), "num_gpus"),
    "count mismatch": (dict(num_gpus=3), "gpus"),
    "unknown node": (dict(gpus=[pb.GpuRef(node="aws-9", index=0),
                                pb.GpuRef(node="aws-0", index=1)]), "gpus"),
    "wrong type": (dict(gpus=[pb.GpuRef(node="rtx-0", index=0),
                              pb.GpuRef(node="aws-0", index=1)]), "gpus"),
    "index out of range": (dict(gpus=[pb.GpuRef(node="aws-0", index=4),
                                      pb.GpuRef(node="aws-0", index=1)]), "gpus"),
    "duplicate gpu": (dict(gpus=[pb.GpuRef(node="aws-0", index=1),
                                 pb.GpuRef(node="aws-0", index=1)]), "gpus"),
    "more nodes than gpus": (dict(num_nodes=3), "num_nodes"),
}


@pytest.mark.parametrize("case", BAD_ALLOCATIONS)
def test_bad_allocation_names_its_field(case):
    change, field = BAD_ALLOCATIONS[case]
    base = dict(gpu_type="aws", num_gpus=2,
                gpus=[pb.GpuRef(node="aws-0", index=0), pb.GpuRef(node="aws-0", index=1)])
    with pytest.raises(ApiError) as exc:
        allocation_from_pb(pb.Allocation(**{**base, **change}), CLUSTER, "previous[3].allocation")
    assert field_of(exc) == f"previous[3].allocation.{field}"


# -- cluster -----------------------------------------------------------------------------


def test_cluster_from_pb_matches_the_core_cluster():
    assert cluster_from_pb(nodes_pb(CLUSTER)) == CLUSTER
    assert cluster_from_pb(list(reversed(nodes_pb(CLUSTER)))).configs == CLUSTER.configs


@pytest.mark.parametrize(("nodes", "field"), [
    ([], "nodes"),
    ([("a", "aws", 4), ("a", "aws", 4)], "nodes[1].name"),
    ([("a", "aws", 4), ("b", "aws", 0)], "nodes[1].num_gpus"),
    ([("a b", "aws", 4)], "nodes[0].name"),
    ([("a", "", 4)], "nodes[0].gpu_type"),
    ([("a", "aws", 4), ("b", "aws", 1 << 20)], "nodes[1].num_gpus"),
])
def test_bad_cluster_names_its_field(nodes, field):
    with pytest.raises(ApiError) as exc:
        cluster_from_pb([pb.NodeSpec(name=n, gpu_type=t, num_gpus=g) for n, t, g in nodes])
    assert field_of(exc) == field


# -- goodput models ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "bert"])
def test_goodput_model_equals_the_simulators(name):
    """Same profiles and observations, same model: the wire loses nothing."""
    app = load_app(name)
    grad = app.grad_params(0.0)
    limits = {g: app.local_bsz_limits(g) for g in app.gpu_types}
    direct = JobGoodputModel(estimator=_bootstrap(app), grad=grad,
                             init_batch_size=app.init_batch_size,
                             max_batch_size=app.max_batch_size, local_bsz_limits=limits)
    samples = profile_samples(app)
    # Two of the job's own multi-GPU runs, reported as the simulator's `_advance` does.
    lo = limits["aws"][0]
    for nodes, reps in ((1, 4), (2, 8)):
        step, sync = app.step_time("aws", nodes, reps, lo)
        direct.estimator.add_observation("aws", nodes, reps, lo, 0, step, sync)
        samples.append(pb.ThroughputSample(gpu_type="aws", num_nodes=nodes, num_replicas=reps,
                                           atomic_batch_size=lo, step_time_s=step,
                                           sync_time_s=sync, count=7))
    wire = [pb.ThroughputSample.FromString(s.SerializeToString()) for s in samples]
    model = goodput_model(wire, pb.GradientStats(sqr=grad.sqr, var=grad.var),
                          init_batch_size=app.init_batch_size,
                          max_batch_size=app.max_batch_size, local_bsz_limits=limits)
    assert model.gpu_types == direct.gpu_types == app.gpu_types
    nodes = np.array([1, 1, 1, 2, 3])
    reps = np.array([1, 2, 4, 8, 12])
    for t in app.gpu_types:
        for fixed in (None, app.init_batch_size * 4):
            got = model.evaluate(t, nodes, reps, fixed_batch_size=fixed)
            want = direct.evaluate(t, nodes, reps, fixed_batch_size=fixed)
            for f in ("goodput", "throughput", "batch_size", "atomic_bsz", "accum_steps"):
                np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
            assert np.all(got.goodput > 0)


def test_missing_grad_keeps_the_initial_batch():
    """No statistics: a bigger batch earns nothing, so the model stays at init."""
    assert float(gain(NEUTRAL_GRAD, 4096, 128)) == 1.0
    samples = [sample(atomic_batch_size=b, step_time_s=0.05 + 0.001 * b) for b in (32, 128, 512)]
    model = goodput_model(samples, None, init_batch_size=128, max_batch_size=4096,
                          local_bsz_limits={"aws": (32, 512)})
    assert model.grad == NEUTRAL_GRAD
    est = model.evaluate("aws", np.array([1, 1]), np.array([1, 2]))
    assert est.batch_size.tolist() == [128, 128]
    noisy = goodput_model(samples, pb.GradientStats(sqr=0.0, var=1.0), init_batch_size=128,
                          max_batch_size=4096, local_bsz_limits={"aws": (32, 512)})
    assert noisy.evaluate("aws", 1, 1).batch_size[0] > 128  # contrast: statistics do matter


@pytest.mark.parametrize(("change", "field"), [
    (dict(step_time_s=0.0), "step_time_s"),
    (dict(step_time_s=math.nan), "step_time_s"),
    (dict(step_time_s=math.inf), "step_time_s"),
    (dict(sync_time_s=-1.0), "sync_time_s"),
    (dict(sync_time_s=0.2), "sync_time_s"),  # == step: no compute time left
    (dict(num_nodes=0), "num_nodes"),
    (dict(num_nodes=2, num_replicas=1), "num_replicas"),
    (dict(atomic_batch_size=0), "atomic_batch_size"),
    (dict(gpu_type=""), "gpu_type"),
])
def test_bad_sample_names_its_field(change, field):
    with pytest.raises(ApiError) as exc:
        goodput_model([sample(), sample(**change)], None, init_batch_size=32, max_batch_size=64,
                      local_bsz_limits={}, path="jobs[2].samples")
    assert field_of(exc) == f"jobs[2].samples[1].{field}"


# -- jobs -----------------------------------------------------------------------------------


def test_policy_job_defaults():
    j = policy_job_from_pb(job_pb(age_s=90.0, restarts=2), "jobs[0]")
    assert j.adaptivity is Adaptivity.ADAPTIVE
    assert (j.min_gpus, j.max_gpus, j.num_gpus, j.batch_size) == (1, None, None, None)
    assert (j.pipeline_gpus, j.allowed_types) == (1, None)
    assert (j.age, j.num_restarts, j.restart_cost) == (90.0, 2, DEFAULT_RESTART_COST_S)
    assert j.submit_time == -90.0  # FIFO: the oldest job first
    # Limits inferred from the samples of the type: the measured micro-batch range.
    assert j.model.local_bsz_limits == {"aws": (16, 256)}
    assert j.model.grad == NEUTRAL_GRAD
    assert (j.model.init_batch_size, j.model.max_batch_size) == (64, 1024)


def test_policy_job_explicit_fields():
    j = policy_job_from_pb(job_pb(
        adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4, batch_size=256, init_batch_size=0,
        max_batch_size=0, min_gpus=2, max_gpus=8, pipeline_gpus=2,
        allowed_gpu_types=["aws", "rtx"], restart_cost_s=12.5,
        type_batch_limits=[pb.TypeBatchLimits(gpu_type="aws", min_local_batch_size=0,
                                              max_local_batch_size=128)],
        samples=[sample(), sample(gpu_type="rtx", atomic_batch_size=8)],
        grad=pb.GradientStats(sqr=0.0, var=0.0)), "jobs[0]")
    assert j.adaptivity is Adaptivity.RIGID
    assert (j.num_gpus, j.batch_size, j.min_gpus, j.max_gpus, j.pipeline_gpus) == \
        (4, 256, 2, 8, 2)
    assert j.allowed_types == frozenset({"aws", "rtx"})
    assert j.restart_cost == 12.5
    # Explicit limits win over the samples; min 0 reads as 1.
    assert j.model.local_bsz_limits == {"aws": (1, 128), "rtx": (8, 8)}
    assert (j.model.init_batch_size, j.model.max_batch_size) == (256, 256)
    assert j.model.grad.sqr == 0.0 and j.model.grad.var == 0.0  # set, even if all zero


def test_policy_job_progress_and_run_time_give_its_remaining_run():
    """What sia-plus gates restarts by reaches the core: R = 3600 · (1 − 0.9) / 0.9."""
    j = policy_job_from_pb(job_pb(progress=0.9, run_time_s=3600.0), "jobs[0]")
    assert (j.progress, j.run_time) == (0.9, 3600.0)
    assert j.remaining_run_time() == pytest.approx(400.0)
    assert not j.attained  # Gavel's per-type time stays unknown: it sees the job as new
    unknown = policy_job_from_pb(job_pb(), "jobs[0]")
    assert (unknown.progress, unknown.run_time, unknown.remaining_run_time()) == (0.0, 0.0, None)


BAD_JOBS = {
    "adaptivity unset": (dict(adaptivity=pb.ADAPTIVITY_UNSPECIFIED), "adaptivity"),
    "adaptivity unknown": (dict(adaptivity=9), "adaptivity"),
    "empty id": (dict(job_id=""), "job_id"),
    "max below min": (dict(min_gpus=4, max_gpus=2), "max_gpus"),
    "rigid without count": (dict(adaptivity=pb.ADAPTIVITY_RIGID, batch_size=64), "num_gpus"),
    "strong without batch": (dict(adaptivity=pb.ADAPTIVITY_STRONG_SCALING), "batch_size"),
    "count not whole replicas": (dict(num_gpus=3, pipeline_gpus=2), "num_gpus"),
    "count outside bounds": (dict(num_gpus=8, max_gpus=4), "num_gpus"),
    "age nan": (dict(age_s=math.nan), "age_s"),
    "negative restart cost": (dict(restart_cost_s=-1.0), "restart_cost_s"),
    "progress above one": (dict(progress=1.5), "progress"),
    "progress negative": (dict(progress=-0.1), "progress"),
    "progress nan": (dict(progress=math.nan), "progress"),
    "run time negative": (dict(run_time_s=-1.0), "run_time_s"),
    "run time inf": (dict(run_time_s=math.inf), "run_time_s"),
    "no batch at all": (dict(init_batch_size=0, batch_size=0), "init_batch_size"),
    "max batch below init": (dict(max_batch_size=32), "max_batch_size"),
    "batch above max": (dict(batch_size=2048), "batch_size"),
    "grad negative": (dict(grad=pb.GradientStats(sqr=1.0, var=-0.5)), "grad.var"),
    "grad inf": (dict(grad=pb.GradientStats(sqr=math.inf)), "grad.sqr"),
    "bad sample": (dict(samples=[sample(), sample(step_time_s=-1)]), "samples[1].step_time_s"),
    "limits duplicate": (dict(type_batch_limits=[
        pb.TypeBatchLimits(gpu_type="aws", max_local_batch_size=8),
        pb.TypeBatchLimits(gpu_type="aws", max_local_batch_size=8)]),
        "type_batch_limits[1].gpu_type"),
    "limits inverted": (dict(type_batch_limits=[
        pb.TypeBatchLimits(gpu_type="aws", min_local_batch_size=16, max_local_batch_size=8)]),
        "type_batch_limits[0].max_local_batch_size"),
    "limits without type": (dict(type_batch_limits=[pb.TypeBatchLimits(max_local_batch_size=8)]),
                            "type_batch_limits[0].gpu_type"),
}


@pytest.mark.parametrize("case", BAD_JOBS)
def test_bad_job_names_its_field(case):
    change, field = BAD_JOBS[case]
    with pytest.raises(ApiError) as exc:
        policy_job_from_pb(job_pb(**change), "jobs[3]")
    assert field_of(exc) == f"jobs[3].{field}"


# -- decisions ---------------------------------------------------------------------------------


def test_round_to_pb_carries_allocation_restart_and_reason_for_every_job():
    a = JobAllocation(Config("rtx", 1, 2), (GpuId("rtx-0", 0), GpuId("rtx-0", 1)),
                      num_replicas=2, batch_size=128, atomic_bsz=64, goodput=3.0)
    result = RoundResult(allocations={"a": a}, restarted=frozenset({"a", "c"}), objective=-1.5,
                         timings={}, reasons={"a": "moved", "b": "waiting", "c": "preempted"})
    decisions = round_to_pb(result, [policy_job_from_pb(job_pb(job_id=i), "j") for i in "abc"])
    assert [d.job_id for d in decisions] == ["a", "b", "c"]
    assert decisions[0].allocation == allocation_to_pb(a) and decisions[0].restart
    assert not decisions[1].HasField("allocation") and not decisions[1].restart
    assert not decisions[2].HasField("allocation") and decisions[2].restart
    assert [d.reason for d in decisions] == ["moved", "waiting", "preempted"]
    assert round_to_pb(result, ["a", "b", "c"]) == decisions


def test_worker_results_survive_pickling():
    """A process-pool executor ships the worker's outcome back by pickle; ApiError
    itself would not survive, so its fields travel instead."""
    request = pb.OptimizeRequest(nodes=nodes_pb(CLUSTER), jobs=[job_pb(), job_pb()])
    kind, fields = pickle.loads(pickle.dumps(_in_worker(request, lambda: None)))
    assert kind == "error"
    err = ApiError(*fields)
    assert (err.code, err.field, err.reason) == \
        (grpc.StatusCode.INVALID_ARGUMENT, "jobs[1].job_id", "INVALID_FIELD")
