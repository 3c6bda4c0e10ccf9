"""Stage 2 of a round: after the ILP, jobs may grow onto the GPUs it leaves idle
(`grow_into_idle`), within the queues' rows as stage 1 left them (`stage2_rows`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Unpack

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.ilp import SolveOptions, assemble, choose
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.queues.rows import SideRows, queue_rows

# A second stage after the ILP, for GPUs it leaves idle: `grow(current, chosen)`
# gives each candidate's stage-2 value (NaN: not an option) from the chosen rows
# (-1: none), or None when there is nothing to grow into.
Grow = Callable[[np.ndarray, np.ndarray], np.ndarray | None]


def grow_into_idle(table: CandidateTable, current: np.ndarray, chosen: np.ndarray,
                   grow: Grow, timings: dict[str, float],
                   side: Callable[[np.ndarray], SideRows] | None = None,
                   hold: np.ndarray | None = None,
                   **solve_kw: Unpack[SolveOptions]) -> np.ndarray:
    """Stage 2: every job keeps its stage-1 row or takes one of the larger rows of
    the same type `grow` allows; the capacity is the cluster's, so what jobs take
    is what stage 1 left idle. Jobs where `hold` is true (held by the policy or
    by their queue's minimum runtime) keep their stage-1 row. Nothing to grow
    into: stage 1's answer."""
    t0 = time.perf_counter()
    vals = grow(current, chosen)
    if vals is None:
        return chosen
    keep = np.zeros(len(table), dtype=bool)
    keep[chosen[chosen >= 0]] = True
    if hold is not None and np.any(hold):
        vals = np.where(hold[table.job] & ~keep, np.nan, vals)
    finite = np.isfinite(vals)
    # Leaving a job out (or below its stage-1 row) costs more than anything gains.
    scale = float(np.max(np.abs(vals[finite]))) + 1.0 if np.any(finite) else 1.0
    none = np.full(table.num_jobs, -(table.num_jobs + 1) * scale)
    none[chosen < 0] = 0.0  # (not an option to them: they have no rows)
    vals = np.where(finite, vals, np.nan)
    problem, rows, start = assemble(table, vals, none, current,
                                    None if side is None else side(vals))
    start = np.full(table.num_jobs, -1, dtype=np.int64)
    at = {int(r): k for k, r in enumerate(rows)}
    for i in np.flatnonzero(chosen >= 0):
        start[i] = at.get(int(chosen[i]), -1)
    timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
    grown, _, _, _ = choose(problem, rows, start, timings, **solve_kw)
    # A job whose stage-1 row was not an option to stage 2 keeps it.
    return np.where(keep[np.maximum(chosen, 0)] & (grown < 0), chosen, grown)


def stage2_rows(table: CandidateTable, qix: np.ndarray, worth: np.ndarray,
                current: np.ndarray, queues: QueueSet, first: np.ndarray, hold: np.ndarray,
                silo: Mapping[str, Mapping[str, int]] | None, vals: np.ndarray) -> SideRows:
    """The queues' rows for the growth stage: restarts stage 1 spent count."""
    job = table.job
    stay = np.isfinite(vals) & (current[job] >= 0) & (table.config == current[job])
    could = np.zeros(table.num_jobs, dtype=bool)
    could[job[(current[job] >= 0) & (table.config == current[job])]] = True
    kept = np.zeros(table.num_jobs, dtype=bool)
    kept[job[stay]] = True
    used = int(np.sum(could & ~kept & (current >= 0)))
    return queue_rows(table, qix, vals, worth, current, queues, restarts_used=used,
                      hold=hold, silo=silo)
