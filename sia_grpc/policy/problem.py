"""The integer program every policy in this package reduces to.

A *multiple-choice, multi-knapsack* problem: each job picks at most one column
(an allocation option); each column uses some GPUs of one type; each type has a
capacity. Sia's ILP, the Pollux-style baseline and FIFO all build one of these,
so there is one solver to trust and to make fast. Optional *side rows* over the
columns add more coupling constraints of the same kind (queues: guarantees,
borrowing limits, a restart budget), each hard or soft:

    maximise   Σ_i [ Σ_{c ∈ cols(i)} value_c · x_c  +  none_value_i · (1 − Σ_{c ∈ cols(i)} x_c) ]
               − Σ_{r soft} penalty_r · s_r
    subject to Σ_{c ∈ cols(i)} x_c ≤ 1                          for every job i
               Σ_{c : type_c = t} gpus_c · x_c ≤ capacity_t        for every GPU type t
               Σ_c a_rc · x_c ≤ rhs_r                              for every hard side row r
               Σ_c a_rc · x_c − s_r ≤ rhs_r,  s_r ≥ 0              for every soft side row r
               x_c ∈ {0, 1}

`none_value_i` is what job i scores when it gets nothing (Sia's λ term).
Columns are stored job-major: `col_job` is non-decreasing.

Side rows are CSR over columns: row r's entries are `row_ptr[r]:row_ptr[r+1]`
of `row_col` (column index) and `row_coef` (a_rc; negative for a ≥ row, which
comes negated; repeated entries add up). `row_penalty[r]` is inf for a hard row
and a finite p > 0 for a soft one: it may be exceeded at a cost of p per unit of
excess (s_r = max(0, A·x − rhs)_r at the optimum). Without side rows (the
default) the program is the plain one above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from sia_grpc.policy.errors import FieldError


def _empty(dtype: type[np.int64] | type[np.float64]) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass(frozen=True, eq=False)
class ChoiceProblem:
    num_jobs: int
    col_job: np.ndarray  # int64[n_cols], non-decreasing, in [0, num_jobs)
    col_type: np.ndarray  # int64[n_cols], in [0, n_types)
    col_gpus: np.ndarray  # int64[n_cols], > 0
    col_value: np.ndarray  # float64[n_cols]
    none_value: np.ndarray  # float64[num_jobs]
    capacity: np.ndarray  # int64[n_types], >= 0
    # Side rows (CSR over columns, see the module docstring); default: none.
    row_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    row_col: np.ndarray = field(default_factory=lambda: _empty(np.int64))  # int64[nnz]
    row_coef: np.ndarray = field(default_factory=lambda: _empty(np.float64))  # float64[nnz]
    row_rhs: np.ndarray = field(default_factory=lambda: _empty(np.float64))  # float64[n_rows]
    row_penalty: npt.NDArray[np.float64] = field(  # [n_rows]: inf = hard, finite > 0 = soft
        default_factory=lambda: _empty(np.float64))

    def __post_init__(self) -> None:
        n = len(self.col_job)
        for name in ("col_type", "col_gpus", "col_value"):
            if len(getattr(self, name)) != n:
                raise FieldError(name, f"length {len(getattr(self, name))} != {n} columns")
        if len(self.none_value) != self.num_jobs:
            raise FieldError("none_value", "one entry per job required")
        if n and (np.any(np.diff(self.col_job) < 0) or self.col_job[0] < 0
                  or self.col_job[-1] >= self.num_jobs):
            raise FieldError("col_job", "must be non-decreasing job indices")
        if n and (self.col_type.min() < 0 or self.col_type.max() >= len(self.capacity)):
            raise FieldError("col_type", "out of range of capacity")
        for name in ("col_value", "none_value"):
            if not np.all(np.isfinite(getattr(self, name))):
                raise FieldError(name, "must be finite")
        self._check_rows()

    def _check_rows(self) -> None:
        ptr, nnz = np.asarray(self.row_ptr), len(self.row_col)
        if ptr.ndim != 1 or len(ptr) < 1 or ptr[0] != 0 or np.any(np.diff(ptr) < 0) \
                or ptr[-1] != nnz:
            raise FieldError("row_ptr", f"must be non-decreasing from 0 to {nnz} entries")
        if len(self.row_coef) != nnz:
            raise FieldError("row_coef", f"length {len(self.row_coef)} != {nnz} entries")
        for name in ("row_rhs", "row_penalty"):
            if len(getattr(self, name)) != self.num_rows:
                raise FieldError(name, f"length {len(getattr(self, name))} != "
                                       f"{self.num_rows} rows")
        if nnz and (np.min(self.row_col) < 0 or np.max(self.row_col) >= self.num_cols):
            raise FieldError("row_col", f"column indices must be in [0, {self.num_cols})")
        if not np.all(np.isfinite(self.row_coef)):
            raise FieldError("row_coef", "must be finite")
        if not np.all(np.isfinite(self.row_rhs)):
            raise FieldError("row_rhs", "must be finite")
        if not np.all(np.asarray(self.row_penalty) > 0):  # also rejects NaN
            raise FieldError("row_penalty", "must be > 0 (inf: a hard row)")

    @property
    def num_cols(self) -> int:
        return len(self.col_job)

    @property
    def num_types(self) -> int:
        return len(self.capacity)

    @property
    def num_rows(self) -> int:
        """Number of side rows."""
        return len(self.row_ptr) - 1

    @cached_property
    def _entry_row(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_rows), np.diff(self.row_ptr))

    @property
    def soft(self) -> np.ndarray:
        """Which side rows are soft (a finite penalty)."""
        return np.isfinite(self.row_penalty)

    def row_activity(self, choice: np.ndarray) -> np.ndarray:
        """A·x of the side rows for a choice vector."""
        on = np.zeros(self.num_cols, dtype=bool)
        on[choice[choice >= 0]] = True
        hit = on[self.row_col]
        return np.bincount(self._entry_row[hit], weights=self.row_coef[hit],
                           minlength=self.num_rows).astype(np.float64)

    def row_excess(self, choice: np.ndarray) -> np.ndarray:
        """Per side row, by how much a choice exceeds a soft row (0 for hard rows)."""
        if not self.num_rows:
            return np.zeros(0)
        return np.where(self.soft, np.maximum(0.0, self.row_activity(choice) - self.row_rhs),
                        0.0)

    def objective(self, choice: np.ndarray) -> float:
        """Objective of a choice vector (column index per job, -1 for none),
        soft rows' penalties included."""
        chosen = choice >= 0
        val = float(self.none_value[~chosen].sum())
        val += float(self.col_value[choice[chosen]].sum())
        if self.num_rows:
            val -= float(np.where(self.soft, self.row_penalty, 0.0) @ self.row_excess(choice))
        return val

    def usage(self, choice: np.ndarray) -> np.ndarray:
        """GPUs used per type by a choice vector."""
        cols = choice[choice >= 0]
        return np.bincount(self.col_type[cols], weights=self.col_gpus[cols],
                           minlength=self.num_types).astype(np.int64)

    def is_feasible(self, choice: np.ndarray) -> bool:
        """A valid choice within the capacities and the hard side rows."""
        if len(choice) != self.num_jobs:
            return False
        cols = choice[choice >= 0]
        owners = np.flatnonzero(choice >= 0)
        if np.any(cols >= self.num_cols) or np.any(self.col_job[cols] != owners):
            return False
        if not np.all(self.usage(choice) <= self.capacity):
            return False
        if not self.num_rows:
            return True
        over = self.row_activity(choice) - self.row_rhs
        return bool(np.all(self.soft | (over <= ROW_TOL * np.maximum(1.0, np.abs(self.row_rhs)))))


# Relative slack on a hard side row's right-hand side, for floating-point sums.
ROW_TOL = 1e-9


@dataclass
class ChoiceSolution:
    choice: np.ndarray  # int64[num_jobs]: chosen column per job, -1 = none
    objective: float
    bound: float  # proven upper bound on the optimum (objective when optimal)
    status: str  # "optimal", "time_limit" (best found), ...
    stats: dict[str, float] = field(default_factory=dict)
    row_excess: np.ndarray = field(  # float64[n_rows]: soft rows' excess (>= 0), 0 for hard
        default_factory=lambda: np.zeros(0))
    # float64[n_types + n_rows]: the coupling rows' prices λ behind `bound`, capacities
    # then side rows (zeros where no price was needed), a warm start for a like
    # problem (`solve(..., prices=)`).
    prices: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def gap(self) -> float:
        return (self.bound - self.objective) / max(1.0, abs(self.objective))
