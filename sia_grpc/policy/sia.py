"""Sia's scheduling policy (SOSP '23, §4): one ILP per round over a
row-normalised goodput matrix.

For job i and configuration j (a GPU type and count from the cluster's
configuration set), with G_ij the estimated goodput:

    G_ij ← N_i^min · G_ij / min_j G_ij          (comparable across jobs; clipped)
    r_i   = max(T_i − N_i·S_i, 0) / (T_i + S_i)  (only on entries that need a restart)

and with the fairness exponent p and the no-allocation penalty λ > 0:

    p < 0:  minimise Σ_ij A_ij (r_i G_ij)^p + λ Σ_i (1 − ‖A_i‖₁)
    p > 0:  maximise Σ_ij A_ij (r_i G_ij)^p − λ Σ_i (1 − ‖A_i‖₁)

subject to at most one configuration per job and per-type GPU capacity. For
p < 0, (rG)^p *falls* as goodput rises, so the paper's "max" reads as a
minimisation (as the authors' artifact solves it); λ > 1 ≥ G^p then makes any
allocation better than none. Both cases are cast as one maximisation for
`solvers.solve`: value = sign(p)·(rG)^p, none = −λ. For p < 0 an entry with
(rG)^p ≥ λ can never beat leaving the job unallocated, so it is dropped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sia_grpc.models.estimate_cache import CACHE
from sia_grpc.policy.candidates import CandidateTable, build_candidates
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.gcpause import collection_paused
from sia_grpc.policy.ilp import SOLVERS
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.rounds import ilp_round
from sia_grpc.policy.types import (
    Adaptivity,
    JobAllocation,
    PolicyJob,
    RoundFromConfig,
    RoundResult,
    SettingError,
    WarmStart,
    positive,
    setting,
)


@dataclass(frozen=True)
class SiaConfig:
    """Sia's knobs. Users set them by name (`sia_grpc.policy.params`): `[policy.sia]`
    in the controller's TOML, `sia simulate --set sia.p=-1`, `OptimizeRequest.params`."""

    # The paper found p = −0.5 best for average JCT, makespan and fairness (§5.5).
    p: float = setting(-0.5, "fairness exponent of the objective (non-zero; below 0 favours "
                             "fairness, 1 maximises total goodput)")
    lambda_: float = setting(1.1, "no-allocation penalty λ (> 0; alias: lambda)")
    goodput_clip: float = setting(3000.0, "cap on a job's normalised goodput")
    # Not a setting: the rounds' length, given by whoever runs the rounds (the
    # controller's round_duration, the simulator's --round-duration).
    round_duration: float = 60.0
    max_scale_up: float = setting(2.0, "at most this many times a job's GPUs per round")
    solver_time_limit: float = setting(30.0, "seconds the ILP solver may take per round")
    rel_gap: float = setting(1e-4, "relative MIP gap at which the solver stops")
    solver: str = setting("highs", "ILP solver: " + ", ".join(SOLVERS)
                          + " (the last two are reference paths through CVXPY)")
    # Keep the allocation of a job still restoring from its last restart
    # (`PolicyJob.restoring`), as the authors' simulator does for Sia
    # (`preserve_ckpt_allocs`): moving it again would throw the restore away.
    hold_restoring: bool = setting(True, "keep the GPUs of a job still restoring from its "
                                         "last restart")
    # What the restart factor weighs a restart against: the job's life so far (the
    # paper: "age"), or its expected whole life, the life so far plus the running
    # it still needs at its rate of progress ("lifetime"; the age where unknown).
    # ... or only the running it still needs ("remaining": the restores behind it are
    # sunk), or the more cautious of the age's and the remaining run's ("least").
    restart_horizon: str = setting("age", "the life a restart is weighed against: age "
                                          "(the paper), lifetime (age + expected "
                                          "remaining run time), remaining (the expected "
                                          "remaining run time) or least (the smaller "
                                          "factor of age and remaining)")
    # GPUs the ILP leaves idle go to running jobs that gain by growing onto them
    # (same type, at most max_scale_up×), each restart weighed against the job's
    # expected whole life: a lone young job on an idle cluster grows in a few
    # rounds instead of waiting until it is old enough for Sia's restart factor.
    # A departure from the paper (docs/architecture.md), neutral on its traces
    # (docs/results.md, "Growing into idle GPUs"); false gives the paper's Sia.
    grow_into_idle: bool = setting(True, "let running jobs grow onto GPUs the ILP leaves "
                                         "idle, weighing the restart against the job's "
                                         "expected remaining run time (false: the paper)")

    def __post_init__(self) -> None:
        if self.p == 0 or not np.isfinite(self.p):
            raise SettingError("p", f"must be a non-zero finite number, got {self.p:g}")
        positive(self, "lambda_", "goodput_clip", "round_duration", "solver_time_limit")
        if not self.max_scale_up >= 1:
            raise SettingError("max_scale_up", f"must be at least 1, got {self.max_scale_up:g}")
        if not 0 <= self.rel_gap < 1:
            raise SettingError("rel_gap", f"must be in [0, 1), got {self.rel_gap:g}")
        if self.restart_horizon not in RESTART_HORIZONS:
            raise SettingError("restart_horizon", f"unknown {self.restart_horizon!r}; choose "
                               "one of " + ", ".join(RESTART_HORIZONS))
        if self.solver not in SOLVERS:
            raise SettingError("solver", f"unknown {self.solver!r}; choose one of "
                               + ", ".join(SOLVERS))


RESTART_HORIZONS = ("age", "lifetime", "remaining", "least")


def restart_factor(age: float, num_restarts: int, restart_cost: float) -> float:
    """r_i = max(T_i − N_i·S_i, 0) / (T_i + S_i): the share of the job's life not
    lost to restarts if it restarts once more. 1 for a job that never restarts."""
    if restart_cost <= 0:
        return 1.0
    return max(age - num_restarts * restart_cost, 0.0) / (age + restart_cost)


def restart_life(job: PolicyJob, horizon: str) -> float:
    """T_i of the restart factor: the job's age, or with the "lifetime" horizon its
    age plus the run time it is expected to need still. With T the age only, a young
    job is held back even on an idle cluster (a 1-minute-old job weighs a 50 s
    restart as most of its life), though it may run for hours."""
    if horizon == "lifetime":
        return job.age + (job.remaining_run_time() or 0.0)
    return job.age


def job_restart_factor(job: PolicyJob, horizon: str) -> float:
    """The job's restart factor under `horizon` (SiaConfig.restart_horizon). Over
    the expected remaining run R alone, one more restore of S leaves R / (R + S) of
    it productive (the restores behind it are past: they cost nothing further);
    where the job has reported no progress, R is unknown and the age stands in."""
    aged = restart_factor(restart_life(job, horizon), job.num_restarts, job.restart_cost)
    if horizon not in ("remaining", "least"):
        return aged  # (before asking for the remaining run: 20,000 jobs a round)
    left = job.remaining_run_time()
    if left is None:
        return aged
    ahead = restart_factor(left, 0, job.restart_cost)
    return ahead if horizon == "remaining" else min(aged, ahead)


def normalised_goodput(table: CandidateTable, n_min: np.ndarray, clip: float) -> np.ndarray:
    """G_ij ← N_i^min · G_ij / min_j G_ij per job over its candidates, clipped."""
    low = table.per_job_reduce(np.minimum, table.goodput, np.inf)
    job = table.job
    out: npt.NDArray[np.float64] = np.minimum(n_min[job] * table.goodput / low[job], clip)
    return out


def objective_values(g: np.ndarray, restart: np.ndarray, r: np.ndarray,
                     cfg: SiaConfig) -> np.ndarray:
    """sign(p)·(r·G)^p per entry, r only where the entry needs a restart."""
    rg = np.where(restart, r * g, g)
    with np.errstate(divide="ignore"):
        out: npt.NDArray[np.float64] = np.sign(cfg.p) * np.power(rg, cfg.p)
    return out


def min_count(job: PolicyJob) -> int:
    """N_i^min: the fewest GPUs the job runs on."""
    if job.adaptivity is Adaptivity.RIGID:
        return int(job.num_gpus or 1)
    return max(job.min_gpus, job.pipeline_gpus)


@dataclass(frozen=True)
class SiaPolicy(RoundFromConfig):
    config: SiaConfig = SiaConfig()
    name: str = "sia"

    @collection_paused
    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation], *,
                 queues: QueueSet | None = None,
                 warm: WarmStart | None = None) -> RoundResult:
        cfg = self.config
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        looked_up = (CACHE.found, CACHE.made)
        table = build_candidates(
            cluster, jobs, previous, max_scale_up=cfg.max_scale_up,
            start_scale=self.start_scale(),
            type_maps=self.type_maps(cluster, jobs, previous))
        timings["estimate"] = time.perf_counter() - t0
        # What the estimate found in the process's cache (models.estimate_cache):
        # the controller's solver process should find nearly every job there. (A count
        # of the process: rounds run at once on threads share it.)
        cached = {"estimates_found": float(CACHE.found - looked_up[0]),
                  "estimates_made": float(CACHE.made - looked_up[1])}
        hold = np.array([j.required or ((j.pinned or (cfg.hold_restoring and j.restoring))
                                        and j.job_id in previous) for j in jobs], dtype=bool)
        hold |= self.settling(jobs, previous)
        grow = (lambda cur, chosen: self.growth_values(table, jobs, cur, chosen, hold)) \
            if cfg.grow_into_idle else None
        # Each job's weight scales its values and its no-allocation penalty alike
        # (all 1 for Sia: the paper's objective exactly).
        w = self.job_weights(jobs)
        result = ilp_round(table, jobs, previous,
                           lambda cur: self.values(table, jobs, cur) * w[table.job],
                           -cfg.lambda_ * w, timings, time_limit=cfg.solver_time_limit,
                           rel_gap=cfg.rel_gap, solver=cfg.solver, hold=hold, grow=grow,
                           queues=queues, warm=warm)
        return dataclasses.replace(result, solver_stats={**result.solver_stats, **cached})

    def start_scale(self) -> float:
        """How many times its minimum a job not yet running may start on; Sia: 1."""
        return 1.0

    def settling(self, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation]) -> np.ndarray:
        """Running jobs kept where they are for longer than their restore; Sia: none."""
        return np.zeros(len(jobs), dtype=bool)

    def job_weights(self, jobs: Sequence[PolicyJob]) -> np.ndarray:
        """Each job's weight in the objective; Sia weighs every job alike."""
        return np.ones(len(jobs))

    def type_maps(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                  previous: Mapping[str, JobAllocation]) -> list[Mapping[str, str]] | None:
        """Per job, how its model is asked about each type (None: each as itself,
        for every job, as Sia asks)."""
        return None

    def values(self, table: CandidateTable, jobs: Sequence[PolicyJob],
               current: np.ndarray, horizon: str | None = None) -> np.ndarray:
        """The ILP value of every candidate (NaN where it can never help)."""
        cfg = self.config
        n_min = np.array([min_count(j) for j in jobs], dtype=float)
        g = normalised_goodput(table, n_min, cfg.goodput_clip)
        job = table.job
        restart = (current[job] >= 0) & (table.config != current[job])
        r = np.array([job_restart_factor(j, horizon or cfg.restart_horizon) for j in jobs])
        val = objective_values(g, restart, self.row_restart_factors(table, jobs, current, r),
                               cfg)
        # For p < 0 an entry at or below the no-allocation value never helps.
        return np.where(np.isfinite(val) & (val > -cfg.lambda_), val, np.nan)

    def row_restart_factors(self, table: CandidateTable, jobs: Sequence[PolicyJob],
                            current: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Each candidate's restart factor from its job's `r` (used only on rows that
        restart the job); Sia: the job's own, on every row."""
        rows: npt.NDArray[np.float64] = r[table.job]
        return rows

    def growth_values(self, table: CandidateTable, jobs: Sequence[PolicyJob],
                      current: np.ndarray, chosen: np.ndarray,
                      hold: np.ndarray) -> np.ndarray | None:
        """Stage 2 (`grow_into_idle`): each running job's chosen row, and its larger
        rows of the same type that fit in what the ILP left idle of that type and
        pay for their restart, valued with the lifetime restart horizon; None when
        no job can grow."""
        cluster = table.cluster
        gpus, types = table.gpus(), table.types()
        job = table.job
        idle = np.array([cluster.capacity[t] for t in cluster.gpu_types], dtype=np.int64)
        mine = chosen[job]  # each row's job's chosen row (-1: none)
        has = mine >= 0
        np.subtract.at(idle, types[chosen[chosen >= 0]], gpus[chosen[chosen >= 0]])
        base = np.where(has, mine, 0)
        larger = (has & ~hold[job] & (current[job] >= 0) & (types == types[base])
                  & (gpus > gpus[base]) & (gpus - gpus[base] <= idle[types]))
        # ... and only where it pays: the running time the faster shape saves over
        # the job's expected remaining run (its age again, if it has not said)
        # exceeds the restart it costs.
        left = np.array([j.remaining_run_time() or j.age for j in jobs])
        cost = np.array([j.restart_cost for j in jobs])
        with np.errstate(divide="ignore", invalid="ignore"):
            speedup = table.goodput / table.goodput[base]
            saved = left[job] * (1 - 1 / speedup)
        larger &= saved > cost[job]
        if not np.any(larger):
            return None
        vals = self.values(table, jobs, current, horizon="lifetime")
        options = larger | (has & (np.arange(len(table)) == mine))
        return np.where(options, vals, np.nan)
