"""The integer program every policy in this package reduces to.

A *multiple-choice, multi-knapsack* problem: each job picks at most one column
(an allocation option); each column uses some GPUs of one type; each type has a
capacity. Sia's ILP, the Pollux-style baseline and FIFO all build one of these,
so there is one solver to trust and to make fast.

    maximise   Σ_i [ Σ_{c ∈ cols(i)} value_c · x_c  +  none_value_i · (1 − Σ_{c ∈ cols(i)} x_c) ]
    subject to Σ_{c ∈ cols(i)} x_c ≤ 1                          for every job i
               Σ_{c : type_c = t} gpus_c · x_c ≤ capacity_t        for every GPU type t
               x_c ∈ {0, 1}

`none_value_i` is what job i scores when it gets nothing (Sia's λ term).
Columns are stored job-major: `col_job` is non-decreasing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class ChoiceProblem:
    num_jobs: int
    col_job: np.ndarray  # int64[n_cols], non-decreasing, in [0, num_jobs)
    col_type: np.ndarray  # int64[n_cols], in [0, n_types)
    col_gpus: np.ndarray  # int64[n_cols], > 0
    col_value: np.ndarray  # float64[n_cols]
    none_value: np.ndarray  # float64[num_jobs]
    capacity: np.ndarray  # int64[n_types], >= 0

    def __post_init__(self) -> None:
        n = len(self.col_job)
        for name in ("col_type", "col_gpus", "col_value"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: length {len(getattr(self, name))} != {n} columns")
        if len(self.none_value) != self.num_jobs:
            raise ValueError("none_value: one entry per job required")
        if n and (np.any(np.diff(self.col_job) < 0) or self.col_job[0] < 0
                  or self.col_job[-1] >= self.num_jobs):
            raise ValueError("col_job: must be non-decreasing job indices")
        if n and (self.col_type.min() < 0 or self.col_type.max() >= len(self.capacity)):
            raise ValueError("col_type: out of range of capacity")
        if not (np.all(np.isfinite(self.col_value)) and np.all(np.isfinite(self.none_value))):
            raise ValueError("col_value/none_value: must be finite")

    @property
    def num_cols(self) -> int:
        return len(self.col_job)

    @property
    def num_types(self) -> int:
        return len(self.capacity)

    def objective(self, choice: np.ndarray) -> float:
        """Objective of a choice vector (column index per job, -1 for none)."""
        chosen = choice >= 0
        val = float(self.none_value[~chosen].sum())
        return val + float(self.col_value[choice[chosen]].sum())

    def usage(self, choice: np.ndarray) -> np.ndarray:
        """GPUs used per type by a choice vector."""
        cols = choice[choice >= 0]
        return np.bincount(self.col_type[cols], weights=self.col_gpus[cols],
                           minlength=self.num_types).astype(np.int64)

    def is_feasible(self, choice: np.ndarray) -> bool:
        if len(choice) != self.num_jobs:
            return False
        cols = choice[choice >= 0]
        owners = np.flatnonzero(choice >= 0)
        if np.any(cols >= self.num_cols) or np.any(self.col_job[cols] != owners):
            return False
        return bool(np.all(self.usage(choice) <= self.capacity))


@dataclass
class ChoiceSolution:
    choice: np.ndarray  # int64[num_jobs]: chosen column per job, -1 = none
    objective: float
    bound: float  # proven upper bound on the optimum (objective when optimal)
    status: str  # "optimal", "time_limit" (best found), ...
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        return (self.bound - self.objective) / max(1.0, abs(self.objective))
