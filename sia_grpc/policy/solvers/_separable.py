"""`solve_separable`: many independent problems in one (the queues' silos).

A problem without side rows whose GPU types fall into blocks, every job's
columns within one block's types, is that many independent problems. Each is
solved to within the gap of its own optimum, but the cheap steps run once over
all of them, since per-call overhead (reductions, numpy passes, a HiGHS model)
dominates problems of a few hundred jobs:

1. Bounds per block: min(L_b(λ), L_b(0)) with λ the prices given (a like
   problem's, e.g. the last round's), L_b the Lagrangian bound of `_solve.py`
   over the block's jobs and types; L_b(0) is exact where the block's best
   options fit.
2. Incumbents over all blocks: the starts (each in the blocks it fits), each
   job's best at 0 (in the blocks where every job's best fits), each job's best
   at λ (repaired and filled) and, where those leave a block open, the LP over
   the tied options; per block the best of them.
3. A block those do not prove within the gap is solved alone by `solve`,
   from the incumbent.
"""

from __future__ import annotations

import time

import numpy as np

from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.problem import ChoiceProblem, ChoiceSolution
from sia_grpc.policy.solvers._columns import _argmax, _Cols, _price, _reduce
from sia_grpc.policy.solvers._heuristics import _fill, _repair, _round_tied
from sia_grpc.policy.solvers._solve import (
    STALE_TIE,
    _choice_vector,
    _eps,
    _hint_prices,
    _reduced_choice,
    solve,
)


class _Blocks:
    """The blocks of a separable problem over its reduced columns `c`: each type's
    (`tb`) and each job's (-1: it has no column, none it is)."""

    def __init__(self, c: _Cols, tb: np.ndarray, num_jobs: int) -> None:
        self.c, self.tb = c, tb
        self.B = int(tb.max()) + 1 if len(tb) else 0
        self.job_block = np.full(num_jobs, -1, dtype=np.int64)
        self.job_block[c.job] = tb[c.typ]

    def per_block(self, per_job: np.ndarray) -> np.ndarray:
        on = self.job_block >= 0
        return np.bincount(self.job_block[on], weights=per_job[on], minlength=self.B)

    def values(self, choice: np.ndarray) -> np.ndarray:
        c = self.c
        v = c.none.copy()
        v[choice >= 0] = c.val[choice[choice >= 0]]
        return self.per_block(v)

    def fitting(self, choice: np.ndarray) -> np.ndarray:
        """`choice` in the blocks whose types it fits, none in the others."""
        over = self.c.usage(choice) > self.c.cap
        return np.where(np.isin(self.job_block, self.tb[over]), -1, choice)

    def merged(self, cands: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per block, the best candidate's choice: (choice, each block's value)."""
        vals = np.array([self.values(x) for x in cands])
        pick = np.argmax(vals, axis=0)
        choice = np.full(self.c.n, -1, dtype=np.int64)
        for k in np.unique(pick):
            jobs = np.isin(self.job_block, np.flatnonzero(pick == k))
            choice[jobs] = cands[k][jobs]
        return choice, vals[pick, np.arange(self.B)]


def solve_separable(problem: ChoiceProblem, type_block: np.ndarray, *,
                    time_limit: float = 30.0, rel_gap: float = 1e-4,
                    start: np.ndarray | None = None,
                    prices: np.ndarray | None = None) -> ChoiceSolution:
    """Each block of `problem` (`type_block`: each type's block) within `rel_gap`
    of its own optimum; `start` a choice, or several as rows (each used in the
    blocks it fits; on ties the first wins), and `prices` as for `solve` (the
    answer's `prices` are each block's; a block's are its own solve's or, where
    it was proven without one, the ones given). `stats["blocks_alone"]`: the
    blocks solved alone."""
    t0 = time.perf_counter()
    p = problem
    tb = np.asarray(type_block, dtype=np.int64)
    if p.num_rows or tb.shape != p.capacity.shape or (len(tb) and tb.min() < 0):
        raise FieldError("type_block", "one block (>= 0) per type, for a problem "
                                       "without side rows")
    if np.any((tb[p.col_type[1:]] != tb[p.col_type[:-1]])
              & (p.col_job[1:] == p.col_job[:-1])):
        raise FieldError("type_block", "a job's columns must all be in one block")
    c = _reduce(p)
    blocks = _Blocks(c, tb, p.num_jobs)
    B = blocks.B
    lam = _hint_prices(p, prices)
    lam = np.zeros(c.T) if lam is None else lam
    zero = np.zeros(c.T)
    tie = 1e-9 * max(1.0, float(np.abs(c.val).max(initial=0.0)), float(np.abs(c.none).max(
        initial=0.0)))
    rc0, best0 = _price(c, zero)
    rc, best = _price(c, lam)
    bound = np.minimum(blocks.per_block(best0),
                       blocks.per_block(best) + np.bincount(tb, weights=lam * c.cap,
                                                            minlength=B))
    # (every job's best at 0 is optimal where it fits; repairing it elsewhere cost
    # more than the other candidates needed)
    cands = [blocks.fitting(s_red) for s_red in _starts(p, c, start)]
    cands += [blocks.fitting(_argmax(c, rc0, best0, tie)),
              _fill(c, _repair(c, _argmax(c, rc, best, tie)), lam)]
    inc, value = blocks.merged(cands)
    still = _open_blocks(bound, value, rel_gap)
    if still.any():
        tied = _round_tied(c, rc, best, STALE_TIE * tie)
        if tied is not None:
            cands.append(_fill(c, tied, lam))
            inc, value = blocks.merged(cands)
            still = _open_blocks(bound, value, rel_gap)
    choice = c.to_orig(inc)
    out_prices = np.where(np.isin(tb, np.flatnonzero(blocks.per_block(best0) <= bound)), 0.0,
                          lam)
    timed_out = _solve_alone(p, blocks, still, choice, bound, out_prices,
                             t0 + time_limit, rel_gap)
    obj = p.objective(choice)
    rest = float(c.none[blocks.job_block < 0].sum())  # jobs with no column: none, exactly
    return ChoiceSolution(
        choice=choice, objective=obj, bound=max(obj, float(bound.sum()) + rest),
        status="time_limit" if timed_out else "optimal",
        stats={"blocks": float(B), "blocks_alone": float(still.sum()),
               "total_s": time.perf_counter() - t0},
        prices=out_prices)


def _open_blocks(bound: np.ndarray, value: np.ndarray, rel_gap: float) -> np.ndarray:
    """The blocks whose `value` is not proven within the gap of their `bound`."""
    return np.array([bound[b] - value[b] > _eps(value[b], bound[b], rel_gap)
                     for b in range(len(bound))], dtype=bool)


def _solve_alone(p: ChoiceProblem, blocks: _Blocks, still: np.ndarray, choice: np.ndarray,
                 bound: np.ndarray, out_prices: np.ndarray, deadline: float,
                 rel_gap: float) -> bool:
    """Solve each block in `still` alone by `solve`, from `choice`: its choice,
    bound and prices replace theirs in `choice`, `bound` and `out_prices`.
    Returns whether a solve stopped short of its gap."""
    timed_out = False
    for b in np.flatnonzero(still):
        jobs = np.flatnonzero(blocks.job_block == b)
        types = np.flatnonzero(blocks.tb == b)
        sub, cols = _block(p, jobs, types)
        local_of = np.full(p.num_cols, -1, dtype=np.int64)
        local_of[cols] = np.arange(len(cols))
        sol = solve(sub, time_limit=max(0.0, deadline - time.perf_counter()),
                    rel_gap=rel_gap, start=np.where(choice[jobs] >= 0,
                                                    local_of[np.maximum(choice[jobs], 0)], -1))
        local = sol.choice
        choice[jobs] = np.where(local >= 0, cols[np.maximum(local, 0)], -1)
        bound[b] = sol.bound
        out_prices[types] = sol.prices if len(sol.prices) == len(types) else 0.0
        timed_out |= sol.status != "optimal"
    return timed_out


def _starts(p: ChoiceProblem, c: _Cols, start: np.ndarray | None) -> list[np.ndarray]:
    """The starts given (one choice, or several as rows) that are choice vectors, in
    reduced columns (one may not fit: `fitting` keeps the blocks it does)."""
    if start is None:
        return []
    rows = np.asarray(start)
    vectors = (_choice_vector(p, s) for s in (rows[None, :] if rows.ndim == 1 else rows))
    return [_reduced_choice(p, c, s) for s in vectors if s is not None]


def _block(p: ChoiceProblem, jobs: np.ndarray, types: np.ndarray,
           ) -> tuple[ChoiceProblem, np.ndarray]:
    """The problem of `jobs` over `types` alone (renumbered), and its columns'
    indices in `p`."""
    renumber = np.full(p.num_jobs, -1, dtype=np.int64)
    renumber[jobs] = np.arange(len(jobs))
    tmap = np.full(len(p.capacity), -1, dtype=np.int64)
    tmap[types] = np.arange(len(types))
    cols = np.flatnonzero(renumber[p.col_job] >= 0)
    return ChoiceProblem(num_jobs=len(jobs), col_job=renumber[p.col_job[cols]],
                         col_type=tmap[p.col_type[cols]], col_gpus=p.col_gpus[cols],
                         col_value=p.col_value[cols], none_value=p.none_value[jobs],
                         capacity=p.capacity[types]), cols
