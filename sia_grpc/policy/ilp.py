"""A round's ILP: the candidate table as a `ChoiceProblem` (`assemble`), held jobs
forced to keep what they have (`hold_current`), and its solve (`choose`) by the
production solver or a reference one; and the solve's prices as the next round's
warm start (`warm_start`, `warm_prices`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TypedDict

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.problem import ChoiceProblem
from sia_grpc.policy.queues.rows import SideRows
from sia_grpc.policy.solvers import solve, solve_reference
from sia_grpc.policy.types import SiloHint, WarmStart

REFERENCE_SOLVERS = {"glpk_mi": "GLPK_MI", "cvxpy-highs": "HIGHS"}
SOLVERS = ("highs", *REFERENCE_SOLVERS)


class SolveOptions(TypedDict):
    """How a round solves its ILPs (`choose`'s keywords)."""

    time_limit: float
    rel_gap: float
    solver: str


def assemble(table: CandidateTable, values: np.ndarray, none_value: float | np.ndarray,
             current: np.ndarray, side: SideRows | None = None,
             capacity: np.ndarray | None = None, only: np.ndarray | None = None,
             ) -> tuple[ChoiceProblem, np.ndarray, np.ndarray]:
    """The ChoiceProblem over the table's rows whose value is finite (NaN = not
    an option); `none_value` is one value for every job or one per job; `side`:
    side rows over table rows (queues), mapped onto the columns; `capacity`: per
    type, instead of the cluster's; `only`: the jobs (a mask) of a smaller problem,
    numbered in order (no side rows then).

    Returns the problem, `rows` (column → row of the table) and `start`: each
    job's current configuration as a column (-1 where it has none or it is not
    an option), the solver's warm start.
    """
    cluster = table.cluster
    none_values = np.broadcast_to(np.asarray(none_value, dtype=np.float64),
                                  (table.num_jobs,)).copy()
    finite = np.isfinite(values)
    num_jobs, renumber = table.num_jobs, np.arange(table.num_jobs)
    if only is not None:
        finite &= only[table.job]
        num_jobs, none_values = int(only.sum()), none_values[only]
        renumber = np.cumsum(only) - 1
    rows = np.flatnonzero(finite)
    job = renumber[table.job[rows]]
    problem = ChoiceProblem(**_side_columns(side, rows, len(table)),
        num_jobs=num_jobs,
        col_job=job,
        col_type=table.types()[rows],
        col_gpus=table.gpus()[rows],
        col_value=values[rows].astype(np.float64),
        none_value=none_values,
        capacity=(np.array([cluster.capacity[t] for t in cluster.gpu_types], dtype=np.int64)
                  if capacity is None else np.asarray(capacity, dtype=np.int64)),
    )
    start = np.full(num_jobs, -1, dtype=np.int64)
    same = np.flatnonzero(table.config[rows] == current[table.job[rows]])
    start[job[same]] = same
    return problem, rows, start


def _side_columns(side: SideRows | None, rows: np.ndarray,
                  n_rows: int) -> dict[str, np.ndarray]:
    """`side`'s rows in ChoiceProblem's terms: entries on table rows that are no
    column (no option) drop out."""
    if side is None or not len(side):
        return {}
    col_of = np.full(n_rows, -1, dtype=np.int64)
    col_of[rows] = np.arange(len(rows))
    col = col_of[side.row]
    keep = col >= 0
    entry_row = np.repeat(np.arange(len(side)), np.diff(side.ptr))[keep]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(entry_row, minlength=len(side)))])
    return dict(row_ptr=ptr.astype(np.int64), row_col=col[keep], row_coef=side.coef[keep],
                row_rhs=side.rhs.astype(np.float64), row_penalty=side.penalty.astype(np.float64))


def hold_current(table: CandidateTable, values: np.ndarray, none_value: np.ndarray,
                 current: np.ndarray, hold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Force each held job to keep its current configuration: its other rows
    become NaN (not an option) and leaving it out costs more than the whole rest
    of the objective can gain, so every optimum keeps it. The previous round's
    allocation fits, so the held jobs together always fit. A held job with no
    current configuration must get one of its rows, if any fits; one whose current
    configuration is not an option is left free.

    Returns new (values, none_value) arrays."""
    job = table.job
    finite = np.isfinite(values)
    cur_row = hold[job] & (current[job] >= 0) & (table.config == current[job]) & finite
    new_row = hold[job] & (current[job] < 0) & finite
    held = np.zeros(table.num_jobs, dtype=bool)
    held[job[cur_row]] = True
    if not np.any(held) and not np.any(new_row):
        return values, none_value
    scale = float(np.max(np.abs(values[finite]))) + float(np.max(np.abs(none_value))) + 1.0
    big = (table.num_jobs + 1) * scale
    out = np.where(held[job] & ~cur_row, np.nan, values)
    none = none_value.astype(np.float64).copy()
    none[job[cur_row]] = values[cur_row] - big
    worst = np.full(table.num_jobs, np.inf)
    np.minimum.at(worst, job[new_row], values[new_row])
    placed = np.isfinite(worst)
    none[placed] = worst[placed] - big
    return out, none


def choose(problem: ChoiceProblem, rows: np.ndarray, start: np.ndarray,
           timings: dict[str, float], *, time_limit: float, rel_gap: float,
           solver: str = "highs", prices: np.ndarray | None = None,
           ) -> tuple[np.ndarray, float, dict[str, float], np.ndarray]:
    """Solve the problem: each job's chosen row of the table (-1: none), the
    objective, the solver's statistics and the capacity prices behind its bound
    (a warm start for a like problem; `prices` are such a start, `solve`'s; empty
    from a reference solve, which has none).

    `solver` is "highs" (the production path) or a reference path, "glpk_mi" or
    "cvxpy-highs" (the same ILP through CVXPY), for comparison and benchmarks.
    """
    t0 = time.perf_counter()
    if solver == "highs":
        sol = solve(problem, time_limit=time_limit, rel_gap=rel_gap, start=start,
                    prices=prices)
    elif solver in REFERENCE_SOLVERS:
        sol = solve_reference(problem, solver=REFERENCE_SOLVERS[solver], time_limit=time_limit)
    else:
        raise ValueError(f"solver: unknown {solver!r}; choose one of {', '.join(SOLVERS)}")
    timings["solve"] = timings.get("solve", 0.0) + time.perf_counter() - t0
    chosen = np.full(len(sol.choice), -1, dtype=np.int64)
    picked = sol.choice >= 0
    chosen[picked] = rows[sol.choice[picked]]
    return chosen, float(sol.objective), {**sol.stats, "gap": sol.gap}, sol.prices


def picked_rows(table: CandidateTable, chosen: np.ndarray) -> np.ndarray:
    """1.0 on each table row in `chosen` (each job's row, -1: none), else 0."""
    picked = np.zeros(len(table))
    picked[chosen[chosen >= 0]] = 1.0
    return picked


def warm_start(side: SideRows | None, prices: np.ndarray, T: int,
               silos: Mapping[str, SiloHint], needed: frozenset[str] = frozenset(),
               ) -> WarmStart:
    """A solve's prices (capacities, then its side rows) as a warm start; none
    where the solve has none (empty `prices`: a reference solve's)."""
    if not len(prices):
        return WarmStart(silos=dict(silos), needed=needed)
    names = () if side is None else side.names
    return WarmStart(silos=dict(silos), prices=tuple(prices[:T].tolist()),
                     row_prices=dict(zip(names, prices[T:].tolist(), strict=True)),
                     needed=needed)


def warm_prices(warm: WarmStart | None, side: SideRows | None) -> np.ndarray | None:
    """The last round's prices for this round's coupling rows: its capacity prices,
    then each side row's by name (0 for a row it did not have). The solver takes
    them only where they fit."""
    if warm is None or warm.prices is None:
        return None
    if side is None or not len(side):
        return np.asarray(warm.prices, dtype=np.float64)
    rows = warm.row_prices
    return np.concatenate([warm.prices, [rows.get(n, 0.0) for n in side.names]])
