"""`sia-plus`: Sia's ILP with what a production scheduler knows and the paper's
simulator ignored (issue 16). Same candidates, same objective, same solver and
placer (`SiaPolicy`); each lever below is one setting, off at its neutral value,
so `sia-plus` with every lever off (and `max_scale_up = 2`, Sia's) computes what
`sia` does. On by default: payback (3), larger starts (4×) and growth of up to 4×
a round; off: srpt, min_stint, give_way and net_run (measured, not worth it on
Philly).

- **Restart payback** (`payback`). Sia's restart factor guesses a job's future
  from its age and restart count. A job reports its progress, so the scheduler
  can estimate the running it still needs (`PolicyJob.remaining_run_time`). A
  restart or move of a running job stays an option only where the running time
  its new shape saves over that remaining run,

      saved = R · (1 − G_now / G_new),

  exceeds `payback` times the job's measured restart cost S: a job near its end
  is not moved for a small gain; one far from it still is. (Jobs that have
  reported no progress yet keep every option: nothing is known.)
- **Shortest remaining first** (`srpt`). Each job's values and its
  no-allocation penalty are weighted by R^(−srpt) (R floored at one round and
  capped at `srpt_cap_h`; jobs with no estimate get the median weight), so a job
  close to its end is the last to be left waiting and the first to grow.
- **Settling** (`min_stint`). Sia keeps a job's GPUs while it restores
  (`hold_restoring`); this keeps them until it has run `min_stint` restart costs
  on them, so no job pays a restore for a stint shorter than a few restores.
- **Giving way** (`give_way`). A shrink or a move to a slower type is taken for
  the other jobs' sake, which the payback gate leaves to Sia's restart factor. This
  charges the restore of such a row again, over how long the jobs made room for
  still run (the median expected remaining run, H): the row's restart factor is
  Sia's × H / (H + give_way·S), so a long job is not pushed aside for jobs done
  before its restore pays off.
- **Net remaining run** (`net_run`). The remaining-run estimate of the levers above
  from the job's running time less the restores it has paid, (1 + restarts)·S
  (`remaining_runs`): the gross one counts a young job's first restore as running.
- **Larger starts** (`start_scale`). A job not yet running may start on up to
  `start_scale` × its minimum GPUs instead of its minimum, saving the restarts of
  growing 1 → 2 → 4 one round at a time.

docs/results.md ("Beyond the paper: sia-plus") has what each lever gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.sia import SiaConfig, SiaPolicy
from sia_grpc.policy.types import JobAllocation, PolicyJob, SettingError, setting


@dataclass(frozen=True)
class SiaPlusConfig(SiaConfig):
    """Sia's settings and the levers of `sia-plus` (module docstring). The defaults
    were chosen on the Philly workloads alone (docs/results.md, "Beyond the paper")."""

    # Growing 4x a round instead of 2x: the faster growth pays with larger starts.
    max_scale_up: float = setting(4.0, "at most this many times a job's GPUs per round")
    payback: float = setting(3.0, "restart or move a running job only where the run time "
                                  "its new shape saves over its expected remaining run "
                                  "exceeds this many restart costs (0: off, Sia's rule)")
    srpt: float = setting(0.0, "weight each job by (expected remaining run time)^-srpt "
                               "in the objective (0: off, every job alike)")
    srpt_cap_h: float = setting(24.0, "hours at which the remaining run time stops "
                                      "lowering a job's srpt weight")
    min_stint: float = setting(0.0, "keep a running job's GPUs until it has run this many "
                                    "restart costs on them (0: off; Sia keeps them while it "
                                    "restores, hold_restoring)")
    give_way: float = setting(0.0, "charge a running job pushed to a shape no faster than "
                                   "its own (a shrink, a move to a slower type) this many "
                                   "restores over the others' median expected remaining "
                                   "run (0: off, Sia's restart factor alone)")
    net_run: bool = setting(False, "estimate a job's remaining run from its running time "
                                   "net of the restores it has paid (false: gross, as "
                                   "PolicyJob.remaining_run_time)")
    start_scale: float = setting(4.0, "a job not yet running may start on up to this "
                                      "many times its minimum GPUs (1: Sia's rule)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("payback", "srpt", "min_stint", "give_way"):
            if not getattr(self, name) >= 0:
                raise SettingError(name, f"must be at least 0, got {getattr(self, name):g}")
        if not self.start_scale >= 1:
            raise SettingError("start_scale", f"must be at least 1, got {self.start_scale:g}")
        if not self.srpt_cap_h > 0:
            raise SettingError("srpt_cap_h", f"must be positive, got {self.srpt_cap_h:g}")


@dataclass(frozen=True)
class SiaPlusPolicy(SiaPolicy):
    config: SiaPlusConfig = SiaPlusConfig()
    name: str = "sia-plus"

    def start_scale(self) -> float:
        return self.config.start_scale

    def settling(self, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation]) -> np.ndarray:
        k = self.config.min_stint
        return np.array([k > 0 and j.job_id in previous and j.stint < k * j.restart_cost
                         for j in jobs], dtype=bool)

    def job_weights(self, jobs: Sequence[PolicyJob]) -> np.ndarray:
        cfg = self.config
        if cfg.srpt == 0:
            return super().job_weights(jobs)
        left = remaining_runs(jobs, cfg.net_run)
        known = np.isfinite(left)
        if not np.any(known):
            return np.ones(len(jobs))
        left = np.clip(left, cfg.round_duration, cfg.srpt_cap_h * 3600.0)
        w = np.where(known, left, np.median(left[known])) ** -cfg.srpt
        # (Only ratios matter; ≤ 1 keeps the ILP's scale.)
        out: npt.NDArray[np.float64] = w / np.max(w)
        return out

    def row_restart_factors(self, table: CandidateTable, jobs: Sequence[PolicyJob],
                            current: np.ndarray, r: np.ndarray) -> np.ndarray:
        rows = super().row_restart_factors(table, jobs, current, r)
        if self.config.give_way == 0:
            return rows
        out: npt.NDArray[np.float64] = rows * give_way_factors(
            table, jobs, current, self.config.give_way, net=self.config.net_run)
        return out

    def values(self, table: CandidateTable, jobs: Sequence[PolicyJob],
               current: np.ndarray, horizon: str | None = None) -> np.ndarray:
        val = super().values(table, jobs, current, horizon)
        if self.config.payback == 0:
            return val
        pays = restart_pays(table, jobs, current, self.config.payback, net=self.config.net_run)
        return np.where(pays, val, np.nan)


def remaining_runs(jobs: Sequence[PolicyJob], net: bool = False) -> np.ndarray:
    """Each job's expected remaining run (NaN: unknown). Gross: its run time so far
    × (1 − progress) / progress (`PolicyJob.remaining_run_time`). Net: the run time
    less the restores it has paid, (1 + restarts)·S, which made no progress; a young
    job's gross estimate counts its first restore as running (after one 60 s round
    with a 50 s restore, 6× its true remaining run). Unknown while the restores take
    up all its run time."""
    if not net:
        return np.array([j.remaining_run_time() or np.nan for j in jobs], dtype=float)
    out = np.full(len(jobs), np.nan)
    for i, j in enumerate(jobs):
        ran = j.run_time - (1 + j.num_restarts) * j.restart_cost
        if 0 < j.progress < 1 and ran > 0:
            out[i] = ran * (1 - j.progress) / j.progress
    return out


def current_goodput(table: CandidateTable, current: np.ndarray) -> np.ndarray:
    """Per job: the estimated goodput of its current configuration (NaN where it
    is not running or its configuration is not among its candidates)."""
    job = table.job
    now = np.full(table.num_jobs, np.nan)
    here = (current[job] >= 0) & (table.config == current[job])
    now[job[here]] = table.goodput[here]
    return now


def give_way_factors(table: CandidateTable, jobs: Sequence[PolicyJob], current: np.ndarray,
                     k: float, *, net: bool = False) -> np.ndarray:
    """Per candidate row: the share of time a running job keeps producing when it
    gives way, H / (H + k·S), on rows no faster than its current shape (1 elsewhere).

    A shrink or a move to a slower type is taken for the other jobs' sake, and the
    shape it is pushed to lasts about as long as the jobs it made room for still
    run: H, the median expected remaining run of the jobs that report one. Its
    restore S (k of them: k = 2 counts the restart back when they are gone) is
    charged over H, on top of Sia's factor (which weighs the restores behind the
    job against its age), so a long job is not pushed aside for jobs that are done
    before its restore pays off. (`net`: as `remaining_runs`.)"""
    left = remaining_runs(jobs, net)
    out = np.ones(len(table))
    if not np.any(np.isfinite(left)):
        return out  # nothing known of how long the others run
    horizon = float(np.median(left[np.isfinite(left)]))
    cost = np.array([j.restart_cost for j in jobs], dtype=float)
    job = table.job
    now = current_goodput(table, current)
    gives = (current[job] >= 0) & (table.config != current[job]) & (table.goodput <= now[job])
    out[gives] = horizon / (horizon + k * cost[job[gives]])
    return out


def restart_pays(table: CandidateTable, jobs: Sequence[PolicyJob], current: np.ndarray,
                 payback: float, *, net: bool = False) -> np.ndarray:
    """Per candidate row: false where it restarts a running job (another
    configuration than its current one) for a faster shape and the run time it
    saves over the job's expected remaining run, R·(1 − G_now/G_row), is at most
    `payback` restart costs. True for every row of a job with no remaining-time estimate or whose
    current configuration is not among its candidates (nothing to compare). (`net`:
    the remaining run as `remaining_runs`.)"""
    job = table.job
    left = remaining_runs(jobs, net)
    cost = np.array([j.restart_cost for j in jobs], dtype=float)
    now = current_goodput(table, current)
    restart = (current[job] >= 0) & (table.config != current[job])
    with np.errstate(divide="ignore", invalid="ignore"):
        saved = left[job] * (1.0 - now[job] / table.goodput)
    # A shape no faster than the current one (a shrink or a move to a slower
    # type) is taken for the other jobs' sake, not the job's own: Sia's restart
    # factor weighs it, as in `sia`.
    slower = table.goodput <= now[job]
    unknown = ~np.isfinite(saved)
    out: npt.NDArray[np.bool_] = ~restart | unknown | slower | (saved > payback * cost[job])
    return out
