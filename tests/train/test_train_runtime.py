"""The runtime's parts on their own: the process-wide accessor, the checkpointed
job state, the profiling pass's stages and the agreement at world size 1."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as s

from sia_grpc.train import runtime
from sia_grpc.train.agreement import Agreement
from sia_grpc.train.jobstate import JobState
from sia_grpc.train.noise import GradientNoise
from sia_grpc.train.profiling import PROFILE_MEASURED_STEPS, PROFILE_WARMUP_STEPS, ProfilePass
from sia_grpc.train.sampler import Position, StepShape
from sia_grpc.train.telemetry import Overheads, SampleKey


def test_init_is_idempotent_and_reset_forgets_the_runtime(fresh_runtime):
    first = runtime.init(environ={})
    assert runtime.init(environ={}) is first
    assert runtime.current() is first
    assert (first.rank, first.world_size, first.profiling) == (0, 1, False)
    runtime.reset()
    second = runtime.current()  # set up afresh, with defaults
    assert second is not first
    assert runtime.current() is second


@settings(max_examples=60, deadline=None)
@given(epoch=s.integers(0, 50), pos=s.integers(0, 10**6), carry=s.integers(0, 7),
       samples=s.integers(0, 10**9), steps=s.integers(0, 10**6),
       si_steps=s.floats(0, 1e6), b0=s.integers(1, 4096), n=s.integers(1, 10**6),
       seed=s.integers(0, 2**31), noisy=s.booleans(),
       timings=s.lists(s.tuples(s.integers(1, 8), s.floats(1e-3, 10.0)), max_size=4))
def test_job_state_survives_its_checkpoint_entry(epoch, pos, carry, samples, steps, si_steps,
                                                  b0, n, seed, noisy, timings):
    job = JobState(Position(epoch, pos, carry), samples_done=samples, steps=steps,
                   si_steps=si_steps, init_batch_size=b0, dataset_len=n, seed=seed)
    if noisy:
        job.noise = GradientNoise(b0)
        job.noise.update(3.0, 1.0, 4, 1.0)
    for atomic, step_s in timings:
        job.table.add(SampleKey("t4", 1, 2, atomic, 0), step_s, step_s / 4)
    back = JobState.from_state_dict(job.state_dict())
    assert back.state_dict() == job.state_dict()
    assert (back.position, back.noise) == (job.position, job.noise)
    assert back.table.totals() == job.table.totals()


def test_profile_pass_times_each_size_after_its_warm_up():
    p = ProfilePass.of((8, 2, 8, 4))
    assert p.sizes == [2, 4, 8] and p.first_shape() == StepShape(1, 2, 0)
    per_stage = PROFILE_WARMUP_STEPS + PROFILE_MEASURED_STEPS
    seen = [p.end_step() for _ in range(3 * per_stage)]
    timed = [t for t, _ in seen]
    assert timed == ([False] * PROFILE_WARMUP_STEPS + [True] * PROFILE_MEASURED_STEPS) * 3
    assert [shape for _, shape in seen if shape] == [StepShape(1, 4, 0), StepShape(1, 8, 0)]
    assert p.done


def test_agreement_alone_takes_effect_at_once():
    a = Agreement(0, 1, torch.device("cpu"), Overheads())
    sums: list[float] = []
    a.want_shape = StepShape(1, 16, 1)
    a.agree(2.5, sums.append, StepShape(1, 8, 0), steps=3)
    assert sums == [2.5] and not a.stop
    assert a.take_shape() == StepShape(1, 16, 1) and a.take_shape() is None
    a.want_shape = StepShape(1, 8, 0)  # the shape in use: nothing to change
    a.sigterm = True
    a.agree(0.0, None, StepShape(1, 8, 0), steps=4)
    assert a.stop and a.take_shape() is None
