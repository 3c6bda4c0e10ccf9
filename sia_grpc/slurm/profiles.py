"""What the bridge gives Sia to bootstrap a job's throughput from: its application's
shipped 1-GPU profiles, calibrated by the job's own reports (`translate.policy_job`).

The controller profiles each job on one GPU of each type before it schedules it (the
paper's bootstrap: the job's own step times on every type). The bridge cannot
without a Slurm job per type, so a job starts from its application's shipped
profiles (`models.profiles.load_seed_profiles`). But a job is not the one that was
profiled: its model's size, its data pipeline, its software make each of its steps
some factor slower or faster than the profile's, on every type alike. Uncorrected,
the type a job has run on is known at its real speed and every other type at the
profile's: a job 1.8x slower than its profile (cifar10 in the bench's ground truth)
looks 1.8x better off on the types it has not tried, so Sia moves it there, finds the
same, and moves it back (`sia bench slurm`: a third of all moves). So each type's
profile is scaled by what the job's reports on that type measured against it, and a
type it has not run on by the same over the types it has (each a geometric mean,
weighted by the steps measured).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from sia_grpc.api import pb
from sia_grpc.models.profiles import StepTimes, load_seed_profiles
from sia_grpc.slurm.ticket import Observation

__all__ = ["calibration", "seed_samples"]


def _profile_compute(t: StepTimes, atomic_bsz: float) -> float:
    """The profile's compute time (step less sync) of one micro-batch of `atomic_bsz`:
    interpolated; held below its batch sizes, in proportion to the batch above them
    (a GPU at full use takes twice as long for twice the samples)."""
    order = np.argsort(t.local_bsz)
    bsz = np.asarray(t.local_bsz, dtype=float)[order]
    compute = (np.asarray(t.step_time, dtype=float) - np.asarray(t.sync_time, dtype=float))[order]
    if atomic_bsz > bsz[-1]:
        return float(compute[-1] * atomic_bsz / bsz[-1])
    return float(np.interp(atomic_bsz, bsz, compute))


def calibration(profiles: Mapping[str, StepTimes], obs: Iterable[Observation],
                ) -> tuple[dict[str, float], float]:
    """(per GPU type the job has reported on, its measured / profiled compute time;
    the same over all its reports, for the other types): 1.0 with no reports."""
    logs: dict[str, list[tuple[float, float]]] = {}  # type -> [(log ratio, steps)]
    for gpu_type, _, _, atomic, _, count, step, sync in obs:
        t = profiles.get(gpu_type)
        if t is None or not len(t) or step <= sync:
            continue
        expected = _profile_compute(t, atomic)
        if expected > 0:
            logs.setdefault(gpu_type, []).append((math.log((step - sync) / expected),
                                                  max(count, 1)))

    def mean(pairs: list[tuple[float, float]]) -> float:
        return math.exp(sum(x * w for x, w in pairs) / sum(w for _, w in pairs))

    per_type = {t: mean(pairs) for t, pairs in logs.items()}
    return per_type, mean([p for pairs in logs.values() for p in pairs]) if logs else 1.0


def seed_samples(application: str, obs: Iterable[Observation] = ()) -> list[pb.ThroughputSample]:
    """The application's shipped 1-GPU profiles as the policy's samples, each type's
    step and sync times scaled by the job's `calibration` from its reports `obs`."""
    profiles = load_seed_profiles(application)
    per_type, rest = calibration(profiles, obs)
    out: list[pb.ThroughputSample] = []
    for gpu_type, t in sorted(profiles.items()):
        k = per_type.get(gpu_type, rest)
        out.extend(pb.ThroughputSample(
            gpu_type=gpu_type, num_nodes=1, num_replicas=1, atomic_batch_size=int(b),
            accum_steps=0, step_time_s=float(s) * k, sync_time_s=float(y) * k, count=1)
            for b, s, y in zip(t.local_bsz, t.step_time, t.sync_time, strict=True))
    return out
