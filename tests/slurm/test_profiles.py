"""The bootstrap the bridge gives Sia: the application's shipped profiles, calibrated
by the job's own reports (sia_grpc/slurm/profiles.py)."""

from __future__ import annotations

import pytest

from sia_grpc.api import pb
from sia_grpc.api.optimize import optimize_request
from sia_grpc.emulation.truth import load_app
from sia_grpc.models.profiles import load_seed_profiles
from sia_grpc.slurm.profiles import calibration, seed_samples
from sia_grpc.slurm.ticket import Shape, Ticket
from sia_grpc.slurm.translate import SlurmNode, build_round, read_jobs

SPEC = {"application": "cifar10", "adaptivity": "adaptive", "max_gpus": 4}


def _report(app: str, gpu_type: str, atomic: int, factor: float, reps: int = 1,
            count: int = 100) -> tuple:
    """What a job `factor` x slower than its application's profile reports: its step
    and sync times (the ground truth's, which is the profile's times its slowdown)."""
    truth = load_app(app)
    step, sync = truth.step_time(gpu_type, 1, reps, atomic)
    k = factor / truth.slowdown
    return (gpu_type, 1, reps, atomic, 0, count, step * k, sync * k)


def _times(samples, gpu_type):
    return [(s.atomic_batch_size, s.step_time_s, s.sync_time_s) for s in samples
            if s.gpu_type == gpu_type]


def test_without_reports_the_shipped_profiles_are_given_as_they_are():
    seeds = load_seed_profiles("cifar10")
    samples = seed_samples("cifar10")
    assert {s.gpu_type for s in samples} == set(seeds)
    t = seeds["rtx"]
    assert _times(samples, "rtx") == [(int(b), float(s), float(y)) for b, s, y in zip(
        t.local_bsz, t.step_time, t.sync_time, strict=True)]
    assert calibration(seeds, ()) == ({}, 1.0)


def test_a_job_slower_than_its_profile_is_slower_on_every_type_alike():
    seeds = load_seed_profiles("cifar10")
    per_type, rest = calibration(seeds, [_report("cifar10", "dgx-ext", 159, 1.8)])
    assert per_type == {"dgx-ext": pytest.approx(1.8, rel=0.05)}
    assert rest == pytest.approx(1.8, rel=0.05)
    plain, scaled = seed_samples("cifar10"), seed_samples(
        "cifar10", [_report("cifar10", "dgx-ext", 159, 1.8)])
    for a, b in zip(plain, scaled, strict=True):
        assert b.step_time_s == pytest.approx(a.step_time_s * rest)
        assert b.sync_time_s == pytest.approx(a.sync_time_s * rest)


def test_each_type_it_ran_on_by_its_own_measure_the_others_by_their_mean():
    seeds = load_seed_profiles("imagenet")
    obs = [_report("imagenet", "rtx", 64, 2.0, count=300),
           _report("imagenet", "dgx-ext", 128, 1.0, count=100),
           _report("imagenet", "dgx-ext", 96, 1.0, reps=4, count=100)]  # (multi-GPU: compute)
    per_type, rest = calibration(seeds, obs)
    assert per_type["rtx"] == pytest.approx(2.0, rel=0.05)
    assert per_type["dgx-ext"] == pytest.approx(1.0, rel=0.1)
    assert rest == pytest.approx(2.0 ** 0.6, rel=0.1)  # (300 steps at 2x, 200 at 1x)
    # A type without a shipped profile, or a report with nothing to compare, changes nothing.
    assert calibration(seeds, [("nosuch", 1, 1, 64, 0, 9, 1.0, 0.0)]) == ({}, 1.0)


def test_a_job_slower_than_its_profile_is_not_moved_off_the_type_it_runs_on():
    """A cifar10 job 1.8x slower than its profile (as the bench's ground truth) has run
    on one dgx-ext GPU; with one GPU of each type free, Sia keeps it (uncalibrated, the
    rtx GPUs it has not tried looked 1.8x better than they are, and it was moved)."""
    nodes = [SlurmNode("a100-0", "a100", "dgx-ext", 1), SlurmNode("rtx-0", "rtx", "rtx", 4)]
    shape = Shape("dgx-ext", "a100", 1, 1, 159, 159, 0, 1, nodes=(("a100-0", 1),))
    ticket = Ticket("1", SPEC, 0.0, 0, shape, obs=(_report("cifar10", "dgx-ext", 159, 1.8),),
                    progress=0.05, running_since=600.0)
    job = {"job_id": 1, "job_state": "RUNNING", "priority": 5, "comment": ticket.comment(),
           "gres_detail": ["gpu:a100:1(IDX:0)"],
           "job_resources": {"allocated_nodes": [{"nodename": "a100-0"}]}}
    rnd = build_round(nodes, read_jobs({"jobs": [job]}), 1200.0, round_duration_s=360.0)
    (d,) = optimize_request(rnd.request).decisions
    assert d.allocation.gpu_type == "dgx-ext", d.reason
    assert isinstance(d, pb.JobDecision)
