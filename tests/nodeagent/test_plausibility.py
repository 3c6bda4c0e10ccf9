"""The plausibility check of what a job reports about itself (nodeagent.plausibility)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as s

from sia_grpc.api import pb
from sia_grpc.models import profiles
from sia_grpc.nodeagent import plausibility as pl

CIFAR = pl.bounds_for("rtx", "cifar10", 8)


def _sample(**kw) -> pb.ThroughputSample:
    base = dict(gpu_type="rtx", num_nodes=1, num_replicas=2, atomic_batch_size=64,
                accum_steps=1, step_time_s=0.05, sync_time_s=0.01, count=3)
    return pb.ThroughputSample(**{**base, **kw})


def _report(samples=None, *, progress=0.5, grad=(1.0, 2.0), checkpoint=0.5) -> pb.Telemetry:
    t = pb.Telemetry(job_id="j", generation=1, progress=progress,
                     samples=[_sample()] if samples is None else samples)
    if grad is not None:
        t.grad.CopyFrom(pb.GradientStats(sqr=grad[0], var=grad[1]))
    if checkpoint is not None:
        t.checkpoint.CopyFrom(pb.CheckpointEvent(generation=1, path="/c", progress=checkpoint,
                                                 save_s=0.2, restore_s=1.0))
    return t


def test_a_plain_report_passes():
    assert pl.check_report(_report(), last_progress=0.4, bounds=CIFAR) is None
    assert pl.check_report(_report(), last_progress=0.5, bounds=CIFAR) is None  # equal: fine
    # 0 is "not said" (profiling passes, OOM reports): never a step back.
    assert pl.check_report(_report(progress=0.0), last_progress=0.9, bounds=CIFAR) is None
    bare = pb.Telemetry(job_id="j", generation=1)
    assert pl.check_report(bare, last_progress=0.0, bounds=CIFAR) is None
    assert pl.check_report(_report([_sample(count=0, gpu_type="")]), last_progress=0.0,
                           bounds=CIFAR) is None


def _profile_rows():
    for app in profiles.available_models():
        for t in profiles.available_types(app):
            for load in (profiles.load_placements, profiles.load_scalability):
                try:
                    yield app, t, load(app, t)
                except FileNotFoundError:
                    continue


def test_every_measurement_the_shipped_profiles_hold_passes():
    checked = 0
    for app, t, st in _profile_rows():
        bounds = pl.bounds_for(t, app, 0)
        rows = zip(st.num_nodes, st.num_replicas, st.local_bsz, st.step_time, st.sync_time,
                   strict=True)
        samples = [pb.ThroughputSample(
            gpu_type=t, num_nodes=int(n), num_replicas=int(r), atomic_batch_size=int(b),
            accum_steps=0, step_time_s=float(step), sync_time_s=float(sync), count=1)
            for n, r, b, step, sync in rows]
        for i in range(0, len(samples), 50):
            t_ = _report(samples[i:i + 50])
            assert pl.check_report(t_, last_progress=0.0, bounds=bounds) is None, (app, t)
        checked += len(samples)
    assert checked > 1000


@pytest.mark.parametrize(("report", "last", "reason"), [
    (_report(progress=math.nan), 0.0, "progress nan"),
    (_report(progress=math.inf), 0.0, "progress inf"),
    (_report(progress=-0.1), 0.0, "progress -0.1 < 0"),
    (_report(progress=1.7), 0.0, "progress 1.7 > 1"),
    (_report(progress=0.1), 0.97, "progress 0.97 -> 0.1: progress must not go back"),
    (_report([_sample(step_time_s=math.nan)]), 0.0, "step_time_s nan"),
    (_report([_sample(step_time_s=0.0)]), 0.0, "step_time_s 0 <= 0"),
    (_report([_sample(step_time_s=-1.0)]), 0.0, "step_time_s -1 <= 0"),
    (_report([_sample(sync_time_s=-0.5)]), 0.0, "sync_time_s -0.5 < 0"),
    (_report([_sample(sync_time_s=math.inf)]), 0.0, "sync_time_s inf"),
    (_report([_sample(atomic_batch_size=0)]), 0.0, "atomic_batch_size 0"),
    (_report([_sample(num_replicas=0)]), 0.0, "num_replicas 0 not in [1, 4096]"),
    (_report([_sample(num_replicas=5000, num_nodes=700)]), 0.0,
     "num_replicas 5000 not in [1, 4096]"),
    (_report([_sample(num_nodes=3)]), 0.0, "num_nodes 3 > num_replicas 2"),
    (_report([_sample(num_replicas=9)]), 0.0, "num_replicas 9 on one node of 8 GPUs"),
    (_report([_sample(gpu_type="dgx-ext")]), 0.0, "gpu_type 'dgx-ext' on a 'rtx' node"),
    (_report([_sample(), _sample(step_time_s=1e-7, sync_time_s=0.0)]), 0.0,
     "throughput 1.28e+09 samples/s on 2 rtx GPU(s): over 10x the fastest the profiles give "
     "for cifar10 on any type"),
    (_report([_sample(accum_steps=10**6, sync_time_s=0.05)]), 0.0,
     "throughput 2.56e+06 samples/s on 2 rtx GPU(s): over 10x the fastest the profiles give "
     "for cifar10 on any type"),
    (_report(grad=(math.nan, 1.0)), 0.0, "grad.sqr nan"),
    (_report(grad=(1.0, -2.0)), 0.0, "grad.var -2 < 0"),
    (_report(grad=(-1.0, 2.0)), 0.0, "grad.sqr -1 < 0"),
    (_report(checkpoint=1.5), 0.0, "checkpoint.progress 1.5 > 1"),
    (_report(checkpoint=-0.5), 0.0, "checkpoint.progress -0.5 < 0"),
    (_report(checkpoint=math.nan), 0.0, "checkpoint.progress nan"),
])
def test_each_rule_rejects(report, last, reason):
    assert pl.check_report(report, last_progress=last, bounds=CIFAR) == reason


def test_an_application_without_profiles_gets_structure_and_a_ceiling():
    mlp = pl.bounds_for("rtx", "mlp", 4)
    assert not mlp.profiled
    # Far faster than cifar10 on any GPU, but not beyond what any application reaches.
    fast = _report([_sample(atomic_batch_size=4096, step_time_s=0.01)])
    assert pl.check_report(fast, last_progress=0.0, bounds=CIFAR).startswith("throughput")
    assert pl.check_report(fast, last_progress=0.0, bounds=mlp) is None
    absurd = pl.check_report(_report([_sample(step_time_s=1e-9, sync_time_s=0.0)]),
                             last_progress=0.0,
                             bounds=mlp)
    assert absurd.endswith("over 10x the fastest the profiles give for any application")
    nan = pl.check_report(_report([_sample(step_time_s=math.nan)]), last_progress=0.0,
                          bounds=mlp)
    assert nan == "step_time_s nan"


def test_the_profile_lookup_is_cached():
    pl.bounds_for("rtx", "imagenet", 4)
    hits = pl._best_per_replica.cache_info().hits
    assert pl.bounds_for("rtx", "imagenet", 4) == pl.bounds_for("rtx", "imagenet", 4)
    assert pl._best_per_replica.cache_info().hits == hits + 2


# ---- property-based: anything within the ranges passes, anything outside is refused ---

APPS = ("cifar10", "bert", "imagenet", "ncf", "mlp")


@s.composite
def honest(draw):
    """A report within every range: rates up to the best the profiles measured."""
    app = draw(s.sampled_from(APPS))
    gpus = draw(s.integers(1, 16))
    bounds = pl.bounds_for("rtx", app, gpus)
    samples = []
    for _ in range(draw(s.integers(0, 4))):
        nodes = draw(s.integers(0, 8))
        reps = draw(s.integers(max(1, nodes), gpus if nodes <= 1 else 512))
        atomic = draw(s.integers(1, 8192))
        # A micro-batch computes at most as fast as the profiles' best; the syncing
        # one adds its all-reduce on top.
        rate = draw(s.floats(1e-3, 1.0)) * bounds.max_per_replica / pl.PROFILE_HEADROOM
        compute = atomic / rate
        sync = draw(s.floats(0.0, 10.0)) * compute
        samples.append(pb.ThroughputSample(
            gpu_type=draw(s.sampled_from(("", "rtx"))), num_nodes=nodes, num_replicas=reps,
            atomic_batch_size=atomic, accum_steps=draw(s.integers(0, 2**32 - 1)),
            step_time_s=compute + sync, sync_time_s=sync,
            count=draw(s.integers(0, 2**32 - 1))))
    last = draw(s.floats(0.0, 1.0))
    progress = draw(s.one_of(s.just(0.0), s.floats(last, 1.0)))
    grad = draw(s.one_of(s.none(), s.tuples(s.floats(0, 1e12), s.floats(0, 1e12))))
    ckpt = draw(s.one_of(s.none(), s.floats(0.0, 1.0)))
    return _report(samples, progress=progress, grad=grad, checkpoint=ckpt), last, bounds


@settings(max_examples=300, deadline=None)
@given(honest())
def test_any_report_within_the_ranges_passes(case):
    report, last, bounds = case
    assert pl.check_report(report, last_progress=last, bounds=bounds) is None


BAD_FLOATS = s.one_of(s.just(math.nan), s.just(math.inf), s.just(-math.inf),
                      s.floats(-1e12, -1e-9))


@s.composite
def broken(draw):
    """An honest report with one value made NaN, negative or over its ceiling."""
    report, last, bounds = draw(honest())
    if not report.samples:
        report.samples.append(_sample(gpu_type="", num_nodes=1, num_replicas=1,
                                      step_time_s=1.0, sync_time_s=0.0))
    target = draw(s.sampled_from(("progress", "back", "over1", "step", "sync", "rate",
                                  "accum", "sqr", "var", "ckpt", "ckpt_over1", "replicas")))
    smp = report.samples[draw(s.integers(0, len(report.samples) - 1))]
    if target == "progress":
        report.progress = draw(BAD_FLOATS)
    elif target == "back":
        last = draw(s.floats(0.02, 1.0))
        report.progress = draw(s.floats(1e-3, last * 0.99))
    elif target == "over1":
        report.progress = draw(s.floats(1.0 + 1e-9, 1e9))
    elif target == "step":
        smp.step_time_s = draw(s.one_of(BAD_FLOATS, s.just(0.0)))
    elif target == "sync":
        smp.sync_time_s = draw(BAD_FLOATS)
    elif target == "rate":  # just over the ceiling, to astronomically over it
        over = draw(s.floats(1.01, 1e12))
        smp.step_time_s = smp.atomic_batch_size / (over * bounds.max_per_replica)
        smp.sync_time_s = 0.0
    elif target == "accum":  # a sync as long as the step: accumulation nearly free
        # (the sync is read as at most 0.999 of the step, so micro-batches take 1/1000)
        over = draw(s.floats(1.01, 1e12))
        smp.step_time_s = smp.sync_time_s = (
            1000 * smp.atomic_batch_size / (over * bounds.max_per_replica))
        smp.accum_steps = 2**32 - 1
    elif target in ("sqr", "var"):
        report.grad.CopyFrom(pb.GradientStats(sqr=1.0, var=1.0))
        setattr(report.grad, target, draw(BAD_FLOATS))
    elif target == "ckpt":
        report.checkpoint.progress = draw(BAD_FLOATS)
    elif target == "ckpt_over1":
        report.checkpoint.progress = draw(s.floats(1.0 + 1e-9, 1e9))
    else:
        smp.num_replicas = draw(s.one_of(s.just(0), s.integers(pl.MAX_REPLICAS + 1, 2**32 - 1)))
    return report, last, bounds, target


@settings(max_examples=400, deadline=None)
@given(broken())
def test_any_nan_negative_or_over_ceiling_value_is_refused(case):
    report, last, bounds, target = case
    reason = pl.check_report(report, last_progress=last, bounds=bounds)
    assert reason is not None, target
    assert "\n" not in reason and len(reason) < 200
