"""Lagrangian relaxation of the capacity rows: prices λ by Dantzig-Wolfe column
generation, and reduced-cost fixing against an incumbent (what is left is the
residual problem that the exact DP or HiGHS MIP solves)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from sia_grpc.policy.solvers._columns import (
    _argmax,
    _cat,
    _Cols,
    _options,
    _Opts,
    _price,
    _ranges,
)
from sia_grpc.policy.solvers._highs import _new_highs

_DW_MAX_ITERS = 400


def _price_caps(c: _Cols) -> np.ndarray:
    """Upper limits on the coupling rows' prices: none on the capacities and hard
    rows; a soft row's penalty (its excess costs that much). A hard row that
    none violates (rhs < 0) gets a large finite limit, so that the master, which
    pays it for a slack, is always feasible (any limit leaves L(λ) a bound)."""
    if c.side is None:
        return np.full(c.T, np.inf)
    side = c.side
    scale = 1.0 + float(np.abs(c.val).max(initial=0.0)) + float(np.abs(c.none).max(initial=0.0))
    big = np.full(side.R, 1e3 * scale * (c.n + 1))
    return _cat(np.full(c.T, np.inf),
                np.where(side.soft, side.pen, np.where(side.rhs < 0, big, np.inf)))


def _blocks(c: _Cols, share: float = 0.5) -> np.ndarray:
    """Jobs grouped into blocks for Dantzig-Wolfe: the jobs that share side
    rows (a queue's rows) are in one block, and the jobs in no such block form
    one more. Each block prices and proposes on its own, so the master can mix
    the blocks' proposals: far fewer iterations than one proposal for all jobs
    when many rows bind. Rows join their jobs' blocks smallest first while the
    block stays within `share` of the jobs, so that a row over many queues'
    jobs (the restart budget) stays a coupling row of the master and does not
    melt the queues into one block. Any partition is valid; at most
    _MAX_BLOCKS blocks (the rest merged)."""
    side = c.side
    assert side is not None  # (blocks are of side rows)
    label = np.full(c.n, -1, dtype=np.int64)  # each job's block (a row's index; -1: none)
    size = np.zeros(side.R, dtype=np.int64)  # jobs per block
    entry_job = c.job[side.row_col]
    cap = max(2, int(share * c.n))
    counts = np.diff(side.row_ptr)
    for r in np.argsort(counts, kind="stable").tolist():
        jobs = entry_job[side.row_ptr[r]:side.row_ptr[r + 1]]
        joined = np.unique(label[jobs])
        joined = joined[joined >= 0]
        fresh = len(np.unique(jobs[label[jobs] < 0]))
        if fresh + int(size[joined].sum()) > cap:
            continue
        merge = np.zeros(side.R + 1, dtype=bool)  # indexed by label + 1
        merge[joined + 1] = True
        label[merge[label + 1]] = r
        label[jobs] = r
        size[r] = fresh + int(size[joined].sum())
        size[joined[joined != r]] = 0
    _, block = np.unique(label, return_inverse=True)
    return block % _MAX_BLOCKS


_MAX_BLOCKS = 64


def _block_use(c: _Cols, choice: np.ndarray, block: np.ndarray, B: int,
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each block's coupling-row activity (B × K) and value (B) under a choice."""
    on = np.flatnonzero(choice >= 0)
    cols, bj = choice[on], block[on]
    use = np.bincount(bj * c.T + c.typ[cols], weights=c.gf[cols],
                      minlength=B * c.T).reshape(B, c.T)
    if c.side is not None:
        side, R = c.side, c.side.R
        e = _ranges(side.col_ptr[cols], side.col_ptr[cols + 1])
        be = np.repeat(bj, side.col_ptr[cols + 1] - side.col_ptr[cols])
        act = np.bincount(be * R + side.col_row[e], weights=side.col_coef[e],
                          minlength=B * R).reshape(B, R)
        use = np.hstack([use, act])
    vals = c.none.copy()
    vals[on] = c.val[cols]
    return use, np.bincount(block, weights=vals, minlength=B)


# A stability centre of Dantzig-Wolfe: prices λ, L(λ), reduced values, each job's best.
Centre = tuple[np.ndarray, float, np.ndarray, np.ndarray]
# The master's primal: (job indices, choice of those jobs, weight) per proposal in use.
Primal = list[tuple[np.ndarray, np.ndarray, float]]


class _Master:
    """The Dantzig-Wolfe master LP in HiGHS: the coupling rows, one convexity row
    per block of jobs, a slack column per row with a price limit (at that limit),
    and a column per proposal (one block's choice, at its activity and value)."""

    def __init__(self, c: _Cols, block: np.ndarray | None) -> None:
        import highspy

        self.c, self.block = c, block
        K = self.K = c.K
        B = self.B = 1 if block is None else int(block.max()) + 1
        self.members = [np.arange(c.n)] if block is None else [np.flatnonzero(block == b)
                                                                for b in range(B)]
        inf = self.inf = highspy.kHighsInf
        h = self.h = _new_highs()
        h.setOptionValue("presolve", "off")
        h.passModel(highspy.HighsLp())
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        h.addRows(K + B, _cat(np.full(K, -inf), np.ones(B)), _cat(c.rhs.astype(np.float64),
                                                                 np.ones(B)),
                  0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        self.rows = np.arange(K + 1, dtype=np.int32)
        self.columns: list[tuple[int, np.ndarray]] = []  # (block, its jobs' choice) each
        ub = self.ub = _price_caps(c)
        self.n_slack = int(np.isfinite(ub).sum())
        for r in np.flatnonzero(np.isfinite(ub)):  # a row's slack, at the price limit
            h.addCol(-float(ub[r]), 0.0, inf, 1, np.asarray([r], np.int32), np.asarray([-1.0]))

    def split(self, choice: np.ndarray, lam: np.ndarray | None = None,
              best: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each block's activity (B × K) and value (B) under `choice`; for one
        block at prices `lam` the value is best_i + λ·activity summed."""
        c = self.c
        if self.block is None:
            use = c.use(choice)
            if lam is None:
                v = c.value(choice)
            else:
                assert best is not None  # (given with `lam`)
                v = float(best.sum() + lam @ use)
            return use[None, :], np.asarray([v])
        return _block_use(c, choice, self.block, self.B)

    def propose(self, choice: np.ndarray) -> None:
        """`choice` as a column of every block."""
        self.add(choice, *self.split(choice))

    def add(self, choice: np.ndarray, uses: np.ndarray, vals: np.ndarray,
            which: np.ndarray | None = None) -> None:
        """The proposal `choice` (`split`'s `uses` and `vals`) as a column of each
        block in `which` (default: all)."""
        K, B, h, inf = self.K, self.B, self.h, self.inf
        if self.block is None:
            h.addCol(float(vals[0]), 0.0, inf, K + 1, self.rows,
                     _cat(uses[0].astype(np.float64), 1.0))
            self.columns.append((0, choice))
            return
        which = np.arange(B) if which is None else which
        nz = uses[which] != 0
        cnt = nz.sum(axis=1) + 1
        starts = _cat(0, np.cumsum(cnt)[:-1]).astype(np.int32)
        idx = np.empty(int(cnt.sum()), dtype=np.int32)
        val = np.ones(len(idx))
        at_conv = starts + cnt - 1  # each column's convexity row comes last
        body = np.ones(len(idx), dtype=bool)
        body[at_conv] = False
        idx[body] = np.nonzero(nz)[1]
        val[body] = uses[which][nz]
        idx[at_conv] = K + which
        h.addCols(len(which), vals[which], np.zeros(len(which)), np.full(len(which), inf),
                  len(idx), starts, idx, val)
        members = self.members
        self.columns.extend((int(b), choice[members[b]]) for b in which)

    def primal(self, mobj: float) -> tuple[int, Primal]:
        """The master's primal at its objective `mobj` (none if not finite): the
        jobs its proposals in use split, and those proposals with their weights."""
        frac, primal = 0, []
        if np.isfinite(mobj):
            columns = self.columns
            mu = np.asarray(self.h.getSolution().col_value)[self.n_slack:]
            used = [k for k in np.flatnonzero(mu > 1e-9) if k < len(columns)]
            primal = [(self.members[columns[k][0]], columns[k][1], float(mu[k])) for k in used]
            for b in range(self.B):
                active = [columns[k][1] for k in used if columns[k][0] == b]
                if len(active) > 1:
                    frac += int(np.any(np.stack(active) != active[0], axis=0).sum())
        return frac, primal


def _lagrangian(c: _Cols, deadline: float, tol: float, seeds: list[np.ndarray],
                block: np.ndarray | None = None, enough: Callable[[float], bool] | None = None,
                centre: Centre | None = None,
                ) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, float, int, int, Primal]:
    """Dantzig-Wolfe on the coupling rows, one convexity row per block of jobs
    (`block`: each job's; None: one block), until the bound is within `tol` of
    the master or `enough(bound)` says it proves what is needed. `centre`:
    prices to start the stability centre from, as (λ, L(λ), rc, best) (a like
    problem's; zero prices otherwise), their proposal a first column. Returns (λ,
    L(λ), rc, best, master objective, iterations, fractional jobs of the
    master's primal, the master's primal as (job indices, choice of those
    jobs, weight) per proposal in use)."""
    import highspy

    master = _Master(c, block)
    h, K = master.h, master.K
    master.propose(np.full(c.n, -1, dtype=np.int64))  # (none) keeps the master feasible
    for s in seeds:
        master.propose(s)
    lam_stab = np.zeros(K)
    rc_stab, best_stab = _price(c, lam_stab)
    stab: Centre = (lam_stab, float(best_stab.sum()), rc_stab, best_stab)
    master.propose(_argmax(c, rc_stab, best_stab))
    if centre is not None:
        master.propose(_argmax(c, centre[2], centre[3]))
        if centre[1] < stab[1]:
            stab = centre
    alpha, mobj, it = 0.5, -math.inf, 0
    while it < _DW_MAX_ITERS:
        it += 1
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        mobj = h.getInfo().objective_function_value
        dual = np.asarray(h.getSolution().row_dual)
        lam_m, pi = np.minimum(np.maximum(dual[:K], 0.0), master.ub), dual[K:]
        if stab[1] - mobj <= tol or time.perf_counter() > deadline or (
                enough is not None and enough(stab[1])):
            break
        alpha, stab, choice, uses, vals, good = _smoothed_proposal(master, stab, alpha, lam_m,
                                                                   pi, mobj)
        if block is not None and not len(good):
            break  # no block improves on the master even at its own prices
        master.add(choice, uses, vals, good)
    frac, primal = master.primal(mobj)
    return (*stab, mobj, it, frac, primal)


def _smoothed_proposal(master: _Master, stab: Centre, alpha: float, lam_m: np.ndarray,
                       pi: np.ndarray, mobj: float,
                       ) -> tuple[float, Centre, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Wentges smoothing: price at `alpha` of the way from the master's prices
    `lam_m` (convexity duals `pi`) to the stability centre `stab`, halving `alpha`
    while no block's proposal improves the master. Returns (alpha, the centre,
    the proposal, its activity and value per block, the blocks it improves)."""
    c = master.c
    while True:
        lam = alpha * stab[0] + (1.0 - alpha) * lam_m
        rc, best = _price(c, lam)
        lval = float(best.sum() + lam @ c.rhs)
        if lval < stab[1]:
            stab = (lam, lval, rc, best)
        choice = _argmax(c, rc, best)
        uses, vals = master.split(choice, lam, best)
        # The blocks whose proposal improves the master.
        if master.block is None:
            red = np.asarray([vals[0] - lam_m @ uses[0] - float(pi[0])])
        else:
            red = vals - uses @ lam_m - pi
        good = np.flatnonzero(red > 1e-12 * max(1.0, abs(mobj)))
        if len(good) or alpha == 0:
            return alpha, stab, choice, uses, vals, good
        alpha = 0.0 if alpha < 0.1 else alpha / 2  # mis-pricing: trust the master more


def _residual(c: _Cols, d: np.ndarray, d_none: np.ndarray, delta: float,
              ) -> tuple[np.ndarray, _Opts, np.ndarray] | None:
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
