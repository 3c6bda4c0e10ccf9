"""Is what a job reports about itself plausible? A check of each worker report.

A job's workers run the tenant's code, so their `pb.Telemetry` is the tenant's
word: a job could claim progress it never made, throughput no GPU gives, or
NaNs that poison the scheduler's model of it. `check_report` is run by the
agent on every report before it is accumulated, and says why one is refused
(a short line, for the log and a counter) or None when it is plausible.

Pure and synchronous: no I/O per report. The profile lookup behind `bounds_for`
reads the shipped artifact once per application (cached); a job generation
builds its `Bounds` once.

The rules:

* progress (a fraction of the job's target) is finite, in [0, 1], and never
  below the generation's last reported progress (equal is fine). 0 means "not
  said" (profiling passes and OOM reports carry none; the accumulator ignores
  it), so it is not a step back. Across generations progress may go back (a
  restore from an older checkpoint): pass the last progress of this generation.
* each throughput sample: step_time_s finite and > 0; sync_time_s finite and
  >= 0 (above step_time_s it is clamped, as the controller and the runtime do:
  the artifact itself has such rows); atomic_batch_size >= 1;
  1 <= num_replicas <= 4096; num_nodes <= num_replicas (0 means unset);
  gpu_type empty or this node's; a sample of a job wholly on this node
  (num_nodes <= 1) has no more replicas than the node's GPUs. count and
  accum_steps are unsigned, and count 0 counts as 1 (as the accumulator does),
  so any value is well formed.
* throughput, as the scheduler will read the sample (sia_grpc.models.throughput,
  the controller's `samples_per_second`): step_time_s is the micro-batch that
  ends in the all-reduce, each of the accum_steps others takes step_time_s -
  sync_time_s (sync clamped below 0.999 x step), and every micro-batch trains
  atomic_batch_size samples per replica, so an iteration trains
  R x b x (accum + 1) samples in step + accum x (step - sync). Per replica that
  may be at most `PROFILE_HEADROOM` times the fastest any micro-batch of the
  application went in the shipped profiles (any GPU type, placement, batch
  size; b / step, or b / (step - sync) for a non-syncing one): all-reduce only
  ever lowers the per-replica rate. An application without shipped profiles
  gets the same headroom over the fastest of any shipped application (ncf,
  about 3.8e6 samples/s per GPU): a sanity ceiling only.
* gradient statistics (when present): finite, sqr >= 0, var >= 0.
* checkpoint event (when present): progress finite in [0, 1]; save_s and
  restore_s finite and >= 0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from sia_grpc.api import pb

__all__ = ["MAX_REPLICAS", "PROFILE_HEADROOM", "Bounds", "bounds_for", "check_report",
           "samples_per_second"]

# Generous on purpose: newer GPUs than the artifact's (an H100 is ~3x an A100),
# larger micro-batches than were profiled and timing noise must never trip it.
PROFILE_HEADROOM = 10.0
MAX_REPLICAS = 4096


@dataclass(frozen=True)
class Bounds:
    """What one job generation's reports are checked against (see `bounds_for`)."""

    gpu_type: str           # this node's type; samples must name it or nothing
    application: str
    num_gpus: int           # GPUs on this node (0: unknown, not checked)
    max_per_replica: float  # samples/s per replica, headroom included
    profiled: bool          # max_per_replica comes from the application's own profiles

    def ceiling_source(self) -> str:
        if self.profiled:
            return f"the fastest the profiles give for {self.application} on any type"
        return "the fastest the profiles give for any application"


@functools.lru_cache(maxsize=64)
def _best_per_replica(application: str) -> float:
    """The highest samples/s per replica of any micro-batch the shipped profiles
    measured for `application` (every GPU type, placement and batch size: a syncing
    one takes step_time, another step_time - sync_time); 0 without any."""
    import numpy as np

    # Lazily: the profile loaders bring in the models package (numpy, scipy).
    from sia_grpc.models import profiles

    if application not in profiles.available_models():
        return 0.0
    tables = list(profiles.load_seed_profiles(application).values())
    for t in profiles.available_types(application):
        for load in (profiles.load_placements, profiles.load_scalability):
            try:
                tables.append(load(application, t))
            except FileNotFoundError:  # not every type has both files
                continue
    best = 0.0
    for st in tables:
        step, sync = st.step_time, st.sync_time
        ok = np.isfinite(step) & (step > 0)
        if ok.any():
            best = max(best, float(np.max(st.local_bsz[ok] / step[ok])))
        ok &= np.isfinite(sync) & (sync >= 0) & (sync < step)  # gpt_pmp has sync > step
        if ok.any():
            best = max(best, float(np.max(st.local_bsz[ok] / (step[ok] - sync[ok]))))
    return best


@functools.lru_cache(maxsize=1)
def _best_any_application() -> float:
    from sia_grpc.models import profiles

    return max((_best_per_replica(a) for a in profiles.available_models()), default=0.0)


def bounds_for(gpu_type: str, application: str, num_gpus: int) -> Bounds:
    """The bounds for a job generation of `application` on this node's GPUs."""
    best = _best_per_replica(application)
    profiled = best > 0
    if not profiled:
        best = _best_any_application()
    return Bounds(gpu_type=gpu_type, application=application, num_gpus=max(0, num_gpus),
                  max_per_replica=PROFILE_HEADROOM * best, profiled=profiled)


def _finite_at_least(name: str, value: float, low: float, *, strict: bool = False
                     ) -> str | None:
    if not math.isfinite(value):
        return f"{name} {value}"
    if value < low or (strict and value == low):
        return f"{name} {value:.3g} {'<=' if strict else '<'} {low:g}"
    return None


def _check_progress(t: pb.Telemetry, last_progress: float) -> str | None:
    p = t.progress
    if not math.isfinite(p):
        return f"progress {p}"
    if p < 0:
        return f"progress {p:.3g} < 0"
    if p > 1:
        return f"progress {p:.3g} > 1"
    if 0 < p < last_progress:  # 0: not said, see the module doc
        return f"progress {last_progress:.3g} -> {p:.3g}: progress must not go back"
    return None


def samples_per_second(s: pb.ThroughputSample) -> float:
    """The sample's training throughput as the scheduler reads it (module doc)."""
    step = s.step_time_s
    sync = min(max(s.sync_time_s, 0.0), 0.999 * step)
    iteration = step + s.accum_steps * (step - sync)
    return s.num_replicas * s.atomic_batch_size * (s.accum_steps + 1) / iteration


def _check_sample(s: pb.ThroughputSample, bounds: Bounds) -> str | None:
    reason = (_finite_at_least("step_time_s", s.step_time_s, 0.0, strict=True)
              or _finite_at_least("sync_time_s", s.sync_time_s, 0.0))
    if reason:
        return reason
    if s.atomic_batch_size < 1:
        return "atomic_batch_size 0"
    if not 1 <= s.num_replicas <= MAX_REPLICAS:
        return f"num_replicas {s.num_replicas} not in [1, {MAX_REPLICAS}]"
    if s.num_nodes > s.num_replicas:
        return f"num_nodes {s.num_nodes} > num_replicas {s.num_replicas}"
    if s.gpu_type and s.gpu_type != bounds.gpu_type:
        return f"gpu_type {s.gpu_type!r} on a {bounds.gpu_type!r} node"
    if s.num_nodes <= 1 and 0 < bounds.num_gpus < s.num_replicas:
        return f"num_replicas {s.num_replicas} on one node of {bounds.num_gpus} GPUs"
    rate = samples_per_second(s)
    if rate > bounds.max_per_replica * s.num_replicas:
        return (f"throughput {rate:.3g} samples/s on {s.num_replicas} {bounds.gpu_type} "
                f"GPU(s): over {PROFILE_HEADROOM:g}x {bounds.ceiling_source()}")
    return None


def _check_events(t: pb.Telemetry) -> str | None:
    if t.HasField("grad"):
        reason = (_finite_at_least("grad.sqr", t.grad.sqr, 0.0)
                  or _finite_at_least("grad.var", t.grad.var, 0.0))
        if reason:
            return reason
    if t.HasField("checkpoint"):
        c = t.checkpoint
        reason = (_finite_at_least("checkpoint.progress", c.progress, 0.0)
                  or _finite_at_least("checkpoint.save_s", c.save_s, 0.0)
                  or _finite_at_least("checkpoint.restore_s", c.restore_s, 0.0))
        if reason:
            return reason
        if c.progress > 1:
            return f"checkpoint.progress {c.progress:.3g} > 1"
    return None


def check_report(t: pb.Telemetry, *, last_progress: float, bounds: Bounds) -> str | None:
    """None if `t` is plausible for a job generation whose last reported progress
    was `last_progress`, else a one-line reason (the first rule it breaks)."""
    reason = _check_progress(t, last_progress)
    if reason:
        return reason
    for s in t.samples:
        reason = _check_sample(s, bounds)
        if reason:
            return reason
    return _check_events(t)
