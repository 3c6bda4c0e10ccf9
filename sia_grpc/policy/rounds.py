"""A round of an ILP policy, after estimating (`ilp_round`): its values weighed and
held as the queues say, the ILP built and solved (`ilp`; the queues' rows taken
lazily, `lazy_rows`, their silos solved as needed, `silos`), jobs grown onto idle
GPUs (`growth`), and the choice placed and explained (`result`)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sia_grpc.policy.candidates import CandidateTable, current_index
from sia_grpc.policy.growth import Grow, grow_into_idle, stage2_rows
from sia_grpc.policy.ilp import SolveOptions, hold_current, picked_rows, warm_start
from sia_grpc.policy.lazy_rows import Shared, guaranteed_round, lazy_borrowing
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.queues.rows import (
    QueueRows,
    SideRows,
    job_weights,
    min_runtime_holds,
    queue_index,
    queue_usage,
)
from sia_grpc.policy.result import finish_round
from sia_grpc.policy.silos import Silo
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult, SiloHint, WarmStart


def ilp_round(table: CandidateTable, jobs: Sequence[PolicyJob],
              previous: Mapping[str, JobAllocation],
              values: Callable[[np.ndarray], np.ndarray], none_value: float | np.ndarray,
              timings: dict[str, float], *, time_limit: float, rel_gap: float,
              solver: str, hold: np.ndarray | None = None,
              grow: Grow | None = None, queues: QueueSet | None = None,
              warm: WarmStart | None = None) -> RoundResult:
    """The rest of a round for an ILP policy: `values(current)` gives every
    candidate's value from each job's current configuration index (-1: none);
    `none_value` is leaving a job out, one value for all or one per job.
    Jobs where `hold` is true keep their current configuration (`hold_current`).
    With `grow`, jobs may then take GPUs the ILP left idle (`grow_into_idle`).
    With `queues`, priority weights, minimum-runtime holds and the queues' rows
    (`queue_rows`) join the program, the guarantees' only where they are needed
    (`guaranteed_round`); `warm` (the previous round's `RoundResult.warm`) starts
    the solves."""
    t0 = time.perf_counter()
    kw: SolveOptions = {"time_limit": time_limit, "rel_gap": rel_gap, "solver": solver}
    rnd = _Round(table, jobs, previous, values, none_value, hold, grow, queues, timings, kw)
    timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
    hints: dict[str, SiloHint] = {}
    needed: frozenset[str] = frozenset()
    if queues is not None and any(q.guarantee for q in queues.queues):
        assert rnd.qix is not None  # (set with `queues`)
        chosen, objective, stats, prices, side, hints, needed = guaranteed_round(
            rnd, table, jobs, rnd.qix, rnd.vals, rnd.none, rnd.current, rnd.hold, queues,
            timings, kw, warm)
    else:
        chosen, objective, stats, prices, side = rnd.shared(None, warm)
    placed = np.flatnonzero(chosen >= 0)
    by_job = dict(zip([jobs[i].job_id for i in placed.tolist()], chosen[placed].tolist(),
                      strict=True))
    # (The queues' minimum-runtime holds only: the paper's placer stays the paper's.)
    pinned = frozenset() if rnd.young is None else frozenset(
        jobs[i].job_id for i in np.flatnonzero(rnd.young).tolist())
    result = finish_round(table, jobs, by_job, previous, objective=objective, timings=timings,
                          solver_stats=stats, pinned=pinned)
    T = len(table.cluster.gpu_types)
    if queues is None:
        return dataclasses.replace(result, warm=warm_start(None, prices, T, {}))
    assert rnd.qix is not None
    return dataclasses.replace(result, queues=queue_usage(table, chosen, queues, rnd.qix),
                               rows=_row_report(side, table, chosen),
                               warm=warm_start(side, prices, T, hints, needed))


class _Round:
    """One ILP round's program: the values and none values, weighed by the queues'
    priorities, and the held jobs (the policy's, and the queues' minimum runtimes:
    `young`) forced to keep what they have; its shared round (`shared`: stage 1,
    then growth) with the queues' rows (`side_rows`) as `lazy_rows.SharedRound`."""

    def __init__(self, table: CandidateTable, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation],
                 values: Callable[[np.ndarray], np.ndarray], none_value: float | np.ndarray,
                 hold: np.ndarray | None, grow: Grow | None, queues: QueueSet | None,
                 timings: dict[str, float], kw: SolveOptions) -> None:
        self.table, self.grow, self.queues, self.timings, self.kw = (
            table, grow, queues, timings, kw)
        self.current = current = current_index(table.cluster, jobs, previous)
        vals = values(current)
        none = np.broadcast_to(np.asarray(none_value, dtype=np.float64),
                               (table.num_jobs,)).copy()
        hold = np.zeros(table.num_jobs, dtype=bool) if hold is None else np.asarray(hold, bool)
        self.qix = qix = None if queues is None else queue_index(jobs, queues)
        self.young: np.ndarray | None = None
        if queues is not None:
            assert qix is not None  # (set with `queues`, as below)
            w = job_weights(jobs, queues)
            vals, none = vals * w[table.job], none * w
            self.young = min_runtime_holds(jobs, current, queues, qix)
            hold = hold | self.young
        self.worth = worth = none.copy()  # (before holds: what sizes the queues' penalties)
        if np.any(hold):
            vals, none = hold_current(table, vals, none, current, hold)
        self.vals, self.none, self.hold = vals, none, hold
        # (What the queues' rows share across this round's builds, found once.)
        self.builder = None if queues is None or qix is None else QueueRows(
            table, qix, vals, worth, current, queues, hold=hold)

    def side_rows(self, silo: Silo | None) -> SideRows | None:
        return None if self.builder is None else self.builder.rows(silo=silo)

    def shared(self, silo: Silo | None, start_prices: WarmStart | None) -> Shared:
        """The shared round (stage 1, then growth) with the guarantee rows of the
        queues in `silo`: (choice, objective, stats, prices, side rows)."""
        table, timings, current, queues, qix = (self.table, self.timings, self.current,
                                                self.queues, self.qix)
        t1 = time.perf_counter()
        side = self.side_rows(silo)
        timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t1
        chosen, objective, stats, prices = lazy_borrowing(
            table, self.vals, self.none, current, side, start_prices, timings, self.kw)
        if self.grow is not None:
            stage2 = None if queues is None or qix is None else functools.partial(
                stage2_rows, table, qix, self.worth, current, queues, chosen, self.hold, silo)
            chosen = grow_into_idle(table, current, chosen, self.grow, timings, side=stage2,
                                    hold=self.hold, **self.kw)
        return chosen, objective, stats, prices, side


def _row_report(side: SideRows | None, table: CandidateTable,
                chosen: np.ndarray) -> dict[str, tuple[float, float]]:
    """Each side row's activity and bound at the choice: name -> (Σ coef·x, rhs)."""
    if side is None:
        return {}
    activity = side.activity(picked_rows(table, chosen))
    return {n: (float(a), float(b)) for n, a, b in zip(side.names, activity, side.rhs,
                                                       strict=True)}
