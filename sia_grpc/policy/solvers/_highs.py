"""HiGHS plumbing: silent instances that survive fork, models of a set of
options built in bulk, and the LP and MIP calls `solve` makes; `lp_interior`
for Gavel's LPs."""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

import numpy as np

from sia_grpc.policy.solvers._columns import _cat, _Cols, _options, _Opts, _ranges, _Side

if TYPE_CHECKING:
    import highspy
    from scipy import sparse


def _reset_highs_after_fork() -> None:
    # HiGHS keeps a process-wide pool of worker threads, started by the first
    # solve; a forked child inherits the pool's state but not its threads, and
    # its next MIP waits on them forever. Drop the stale pool in the child.
    highspy = sys.modules.get("highspy")
    if highspy is not None:
        highspy.Highs.resetGlobalScheduler(False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_highs_after_fork)


_BANNER_LOCK = threading.Lock()
_banner_shown = False


def _new_highs() -> highspy.Highs:
    """A silent HiGHS instance. HiGHS prints its version banner to the C stdout
    when the first instance of a process is constructed, before any option can
    be set; a scheduler's output (and `sia demo`) should not carry it, so the
    first construction runs with file descriptor 1 pointed at /dev/null."""
    global _banner_shown
    import highspy

    with _BANNER_LOCK:
        if _banner_shown:
            h = highspy.Highs()  # type: ignore[no-untyped-call]  # (its __init__: no -> None)
        else:
            sys.stdout.flush()
            saved = os.dup(1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
                h = highspy.Highs()  # type: ignore[no-untyped-call]  # (as above)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                os.close(devnull)
            _banner_shown = True
    h.setOptionValue("output_flag", False)
    return h


def _highs(o: _Opts, cap: np.ndarray, integer: bool, offset: float = 0.0,
           side: _Side | None = None, srhs: np.ndarray | None = None) -> highspy.Highs:
    """A HiGHS model of the options: one = 1 row per job, one capacity row per
    type, built in bulk as CSC. With `side`, also its rows (right-hand sides
    `srhs`), each soft one with a slack column that pays its penalty."""
    import highspy

    nj, T, k = len(o.jobs), len(cap), len(o.val)
    inf = highspy.kHighsInf
    has_g = o.gpus > 0
    n_side = np.zeros(k, dtype=np.int64)
    on = o.col >= 0
    if side is not None:
        n_side[on] = side.col_ptr[o.col[on] + 1] - side.col_ptr[o.col[on]]
    a_start = _cat(0, np.cumsum(1 + has_g + n_side)).astype(np.int32)
    a_index = np.empty(a_start[-1], dtype=np.int32)
    a_value = np.ones(a_start[-1])
    a_index[a_start[:-1]] = o.local_job
    second = a_start[:-1][has_g] + 1
    a_index[second] = nj + o.typ[has_g]
    a_value[second] = o.gpus[has_g]
    cost, upper, lo, hi = o.val.astype(np.float64), np.ones(k), np.zeros(0), np.zeros(0)
    if side is not None:
        e = _ranges(side.col_ptr[o.col[on]], side.col_ptr[o.col[on] + 1])
        at = _ranges((a_start[:-1] + 1 + has_g)[on], a_start[1:][on])
        a_index[at] = nj + T + side.col_row[e]
        a_value[at] = side.col_coef[e]
        soft = np.flatnonzero(side.soft)
        a_start = _cat(a_start, a_start[-1] + 1 + np.arange(len(soft))).astype(np.int32)
        a_index = _cat(a_index, nj + T + soft).astype(np.int32)
        a_value = _cat(a_value, np.full(len(soft), -1.0))
        cost, upper = _cat(cost, -side.pen[soft]), _cat(upper, np.full(len(soft), inf))
        lo, hi = np.full(side.R, -inf), np.asarray(srhs, dtype=np.float64)
    cols = len(cost)
    integrality = _cat(np.full(k, int(integer)), np.zeros(cols - k)).astype(np.int32)
    h = _new_highs()
    h.passModel(cols, nj + T + len(lo), len(a_index), int(highspy.MatrixFormat.kColwise.value),
                int(highspy.ObjSense.kMaximize.value), float(offset),
                cost, np.zeros(cols), upper,
                _cat(np.ones(nj), np.full(T, -inf), lo),
                _cat(np.ones(nj), cap.astype(np.float64), hi),
                a_start, a_index, a_value, integrality)
    return h


def _pick(o: _Opts, x: np.ndarray, integral: bool = False) -> np.ndarray:
    """Option index per job from a solution x. `integral` (a MIP's): each job's
    largest x. Otherwise (a basic LP optimum) a job at 1 keeps that option and
    a split job takes its option with the fewest GPUs (rounding down)."""
    lj = o.local_job
    pick = np.zeros(len(o.jobs), dtype=np.int64)
    if integral:
        if not len(lj):  # (a residual with no jobs left: the growth stage's, with rows)
            return pick
        order = np.lexsort((-x, lj))
        first = order[_cat(True, lj[order][1:] != lj[order][:-1])]
        pick[lj[first]] = first - o.ptr[lj[first]]
        return pick
    frac = np.ones(len(o.jobs), dtype=bool)
    whole = np.flatnonzero(x > 1 - 1e-7)
    pick[lj[whole]] = whole - o.ptr[lj[whole]]
    frac[lj[whole]] = False
    part = np.flatnonzero((x > 1e-7) & frac[lj])
    if len(part):
        order = part[np.lexsort((o.gpus[part], lj[part]))]
        first = order[_cat(True, lj[order][1:] != lj[order][:-1])]
        pick[lj[first]] = first - o.ptr[lj[first]]
    return pick


def _lp(c: _Cols, jobs: np.ndarray, cols: np.ndarray, cap: np.ndarray, presolve: bool,
        srhs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """HiGHS simplex on the LP of `jobs` over `cols` and none, within `cap` (and
    the side rows, with right-hand sides `srhs`, when given). Returns (the
    coupling rows' duals, a basic optimum rounded down as a choice for `jobs`,
    the number of jobs it splits), or None."""
    import highspy

    o = _options(c, jobs, cols, np.ones(c.n, dtype=bool))
    h = _highs(o, cap, False, side=None if srhs is None else c.side, srhs=srhs)
    if not presolve:
        h.setOptionValue("presolve", "off")
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    sol = h.getSolution()
    x = np.asarray(sol.col_value)[:len(o.val)]
    frac = int(len(np.unique(o.local_job[(x > 1e-7) & (x < 1 - 1e-7)])))
    lam = np.maximum(np.asarray(sol.row_dual)[len(jobs):], 0.0)
    if srhs is not None:  # a soft row's dual is at most its penalty (up to rounding)
        assert c.side is not None
        lam[c.T:] = np.minimum(lam[c.T:], c.side.pen)
    return lam, o.choice(_pick(o, x)), frac


def _mip(o: _Opts, cap: np.ndarray, offset: float, time_limit: float, abs_gap: float,
         rel_gap: float, start: np.ndarray | None, side: _Side | None = None,
         srhs: np.ndarray | None = None) -> tuple[np.ndarray | None, float, float, bool]:
    """HiGHS MIP over the options (and the side rows with right-hand sides
    `srhs`, when given). Returns (option index per job or None, value (with
    offset), proven bound, whether optimal)."""
    import highspy

    h = _highs(o, cap, True, offset, side, srhs)
    h.setOptionValue("time_limit", max(0.01, time_limit))
    h.setOptionValue("mip_abs_gap", abs_gap)
    h.setOptionValue("mip_rel_gap", rel_gap)
    if start is not None:
        k = len(o.val)
        x0 = np.zeros(k)
        x0[o.ptr[:-1] + start] = 1.0
        if side is not None:  # the soft rows' slacks at the start's excess
            assert srhs is not None  # (given with `side`)
            excess = np.maximum(0.0, side.activity(o.choice(start)) - srhs)
            x0 = _cat(x0, excess[side.soft])
        h.setSolution(len(x0), np.arange(len(x0), dtype=np.int32), x0)
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None, -np.inf, -np.inf, True
    if info.primal_solution_status != highspy.kSolutionStatusFeasible:
        return None, -np.inf, float(info.mip_dual_bound), False
    x = np.asarray(h.getSolution().col_value)[:len(o.val)]
    return (_pick(o, x, True), float(info.objective_function_value), float(info.mip_dual_bound),
            status == highspy.HighsModelStatus.kOptimal)


def lp_interior(value: np.ndarray, a_ub: sparse.csr_matrix, b_ub: np.ndarray) -> np.ndarray:
    """max value·x s.t. a_ub·x ≤ b_ub (a scipy sparse matrix), 0 ≤ x ≤ 1, by
    HiGHS's interior-point method without crossover.

    On a degenerate LP the answer then lies inside the optimal face, as with the
    interior-point solver (ECOS) Gavel uses: identical jobs get equal shares
    rather than one simplex vertex's all-or-nothing. Entries below 1e-6 are 0.
    """
    import highspy

    n = len(value)
    if n == 0:
        return np.zeros(0)
    a = a_ub.tocsc()
    h = _new_highs()
    h.passModel(n, a.shape[0], a.nnz, int(highspy.MatrixFormat.kColwise.value),
                int(highspy.ObjSense.kMaximize.value), 0.0, np.asarray(value, dtype=np.float64),
                np.zeros(n), np.ones(n), np.full(a.shape[0], -highspy.kHighsInf),
                np.asarray(b_ub, dtype=np.float64), a.indptr.astype(np.int32),
                a.indices.astype(np.int32), a.data.astype(np.float64),
                np.zeros(n, dtype=np.int32))
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    h.setOptionValue("presolve", "off")  # presolve alone can land on a vertex
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"interior-point LP: {h.modelStatusToString(status)}")
    x = np.clip(np.asarray(h.getSolution().col_value), 0.0, 1.0)
    return np.where(x > 1e-6, x, 0.0)
