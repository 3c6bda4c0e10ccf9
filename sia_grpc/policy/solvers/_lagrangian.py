"""Lagrangian relaxation of the capacity rows: prices λ by Dantzig-Wolfe column
generation, and reduced-cost fixing against an incumbent (what is left is the
residual problem that the exact DP or HiGHS MIP solves)."""

from __future__ import annotations

import math
import time

import numpy as np

from sia_grpc.policy.solvers._columns import _argmax, _cat, _Cols, _options, _Opts, _price
from sia_grpc.policy.solvers._highs import _new_highs

_DW_MAX_ITERS = 400


def _lagrangian(c: _Cols, deadline: float, tol: float, seeds: list[np.ndarray]):
    """Dantzig-Wolfe on the capacity rows. Returns (λ, L(λ), rc, best, master
    objective, iterations, fractional jobs of the master's primal)."""
    import highspy

    T = c.T
    inf = highspy.kHighsInf
    h = _new_highs()
    h.setOptionValue("presolve", "off")
    h.passModel(highspy.HighsLp())
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.addRows(T + 1, _cat(np.full(T, -inf), 1.0), _cat(c.cap.astype(np.float64), 1.0),
              0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
    rows = np.arange(T + 1, dtype=np.int32)
    columns: list[np.ndarray] = []

    def add(choice: np.ndarray, use: np.ndarray | None = None, v: float | None = None) -> None:
        use = c.usage(choice) if use is None else use
        v = c.value(choice) if v is None else v
        h.addCol(v, 0.0, inf, T + 1, rows, _cat(use.astype(np.float64), 1.0))
        columns.append(choice)

    add(np.full(c.n, -1, dtype=np.int64))  # keeps the master feasible
    for s in seeds:
        add(s)
    lam_stab = np.zeros(T)
    rc_stab, best_stab = _price(c, lam_stab)
    l_stab = float(best_stab.sum())
    add(_argmax(c, rc_stab, best_stab))
    alpha, mobj, it = 0.5, -math.inf, 0
    while it < _DW_MAX_ITERS:
        it += 1
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        mobj = h.getInfo().objective_function_value
        dual = np.asarray(h.getSolution().row_dual)
        lam_m, pi = np.maximum(dual[:T], 0.0), float(dual[T])
        if l_stab - mobj <= tol or time.perf_counter() > deadline:
            break
        while True:
            lam = alpha * lam_stab + (1.0 - alpha) * lam_m
            rc, best = _price(c, lam)
            lval = float(best.sum() + lam @ c.cap)
            if lval < l_stab:
                lam_stab, l_stab, rc_stab, best_stab = lam, lval, rc, best
            choice = _argmax(c, rc, best)
            use = c.usage(choice)
            v = float(best.sum() + lam @ use)  # the choice's value: best_i + λ·gpus
            if v - lam_m @ use - pi > 1e-12 * max(1.0, abs(mobj)) or alpha == 0:
                break
            alpha = 0.0 if alpha < 0.1 else alpha / 2  # mis-pricing: trust the master more
        add(choice, use, v)
    frac = 0
    if np.isfinite(mobj):
        mu = np.asarray(h.getSolution().col_value)
        active = [columns[k] for k in np.flatnonzero(mu > 1e-9) if k < len(columns)]
        if len(active) > 1:
            frac = int(np.any(np.stack(active) != active[0], axis=0).sum())
    return lam_stab, l_stab, rc_stab, best_stab, mobj, it, frac


def _residual(c: _Cols, d: np.ndarray, d_none: np.ndarray, delta: float):
    """Fix options whose shortfall is at least `delta`. Returns None when the
    fixed jobs alone overfill a type (no solution beats the incumbent), else
    (the fixed jobs' choice, the residual jobs' options, residual capacity)."""
    if delta <= 0:
        return None
    keep = d < delta
    none_ok = d_none < delta
    # A job's best option has shortfall 0 < delta, so every job keeps one.
    single = np.bincount(c.job[keep], minlength=c.n) + none_ok == 1
    fixed = np.full(c.n, -1, dtype=np.int64)
    kept = np.flatnonzero(keep & single[c.job])
    fixed[c.job[kept]] = kept
    rcap = c.cap - c.usage(fixed)
    if (rcap < 0).any():
        return None
    return fixed, _options(c, np.flatnonzero(~single), keep, none_ok), rcap


def _residual_start(inc: np.ndarray, o: _Opts) -> np.ndarray | None:
    """The incumbent as option indices of the residual jobs, if it only uses
    their remaining options (otherwise HiGHS finds its own start)."""
    lj = o.local_job
    hit = np.flatnonzero(o.col == inc[o.jobs][lj])
    if len(np.unique(lj[hit])) != len(o.jobs):
        return None
    pick = np.zeros(len(o.jobs), dtype=np.int64)
    pick[lj[hit]] = hit - o.ptr[lj[hit]]
    return pick
