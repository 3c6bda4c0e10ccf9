"""What one simulation run leaves behind: per-job and per-round records, from
which every metric and plot is computed (`sim.metrics`, `sim.plots`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobRecord:
    name: str
    application: str
    category: str  # "adaptive", "rigid", "strong-scaling"
    submit_time: float  # seconds from the start of the trace
    start_time: float | None  # first allocation; None if it never ran
    finish_time: float | None  # None if unfinished when the simulation stopped
    gpu_seconds: float  # Σ over rounds of GPUs held × seconds held
    restarts: int  # checkpoint-restarts caused by allocation changes
    # Finish-time fairness (paper eq. 3, heterogeneous): the job's completion time
    # if it ran alone on a 1/contention share of every GPU type; None if unknown.
    isolated_jct: float | None = None
    contention: float = 1.0  # mean number of active jobs while this job was active
    queue: str = ""  # the job's queue in a run with queues ("": a run without)
    priority: str = ""  # its priority class ("": the default)

    @property
    def jct(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.submit_time


@dataclass(frozen=True)
class RoundRecord:
    time: float  # virtual time the round started
    policy_seconds: float  # wall time of the policy call
    active_jobs: int  # submitted and not finished
    gpus_in_use: Mapping[str, int]  # per GPU type
    allocations: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # job → (type, GPUs)
    restarted: tuple[str, ...] = ()  # jobs whose checkpoint-restart cycle began this round
    # With queues (`policy.queues`): what each queue held per GPU type, measured from the
    # allocations the simulator applied (not the policy's report), and what it was
    # owed: −bound of the policy's guarantee rows, per type and "units" (a queue with
    # no row for a key is owed nothing there); None where the policy reports no rows
    # (it does not honour queues). `restore_s`: the longest checkpoint-restore delay
    # of the round's active jobs (what the grace of a guarantee allows for).
    held: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    owed: Mapping[str, Mapping[str, float]] | None = None
    restore_s: float = 0.0


@dataclass(frozen=True)
class QueueSpec:
    """What a run's records keep of one queue's configuration."""

    guarantee: Mapping[str, int] = field(default_factory=dict)  # GPU type -> GPUs
    guarantee_units: float = 0.0


@dataclass(frozen=True)
class SimResult:
    workload: str
    policy: str
    cluster: str
    capacity: Mapping[str, int]  # GPUs per type
    jobs: tuple[JobRecord, ...]
    rounds: tuple[RoundRecord, ...]
    wall_seconds: float = 0.0  # wall time of the whole run
    cpu_seconds: float = 0.0  # CPU time of the process running it
    # The policy's settings as given (`--set`, `--policy-config`; they label the run:
    # `policy` reads "sia(p=-1)"), and all of them as run, round length included.
    params: Mapping[str, object] = field(default_factory=dict)
    settings: Mapping[str, object] = field(default_factory=dict)
    round_seconds: float | None = None  # the rounds' length (None: not recorded)
    # A run with queues: each queue's configuration, the units each GPU of a type
    # counts for, and the longest minimum runtime of any queue (for the grace).
    queues: Mapping[str, QueueSpec] = field(default_factory=dict)
    unit_weights: Mapping[str, float] = field(default_factory=dict)
    min_runtime_s: float = 0.0


def round_length(result: SimResult) -> float | None:
    """The run's round length: as recorded or, for older records, the shortest gap
    between rounds (the engine skips idle stretches, so longer gaps are not rounds);
    None with neither."""
    if result.round_seconds:
        return float(result.round_seconds)
    times = sorted(r.time for r in result.rounds)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    return min(gaps) if gaps else None
