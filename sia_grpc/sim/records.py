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
