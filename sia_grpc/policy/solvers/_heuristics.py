"""Incumbents: make a choice fit (`_repair`), improve it greedily (`_fill`) and
by per-type knapsack moves (`_shift`), and round the LP over tied options
(`_round_tied`). With side rows: make a choice fit the hard rows too
(`_repair_rows`) and improve it in the objective with the soft penalties
(`_fill_rows`), one job's move at a time (`_RowState`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sia_grpc.policy.problem import ROW_TOL
from sia_grpc.policy.solvers._columns import _cat, _Cols, _options, _Side
from sia_grpc.policy.solvers._highs import _lp, _mip
from sia_grpc.policy.solvers._lagrangian import Primal


def _repair(c: _Cols, choice: np.ndarray) -> np.ndarray:
    """Make `choice` fit by moving jobs off over-full types, cheapest loss per
    freed GPU first."""
    choice = choice.copy()
    slack = c.cap - c.usage(choice)
    while (slack < 0).any():
        t = int(np.argmin(slack))
        on = np.flatnonzero(choice >= 0)
        jobs_t = on[c.typ[choice[on]] == t]
        cols = c.cols_of(jobs_t)  # (not a pass over every column: per over-full type)
        cur = choice[c.job[cols]]
        freed = c.gpus[cur] - np.where(c.typ[cols] == t, c.gpus[cols], 0)
        room = np.maximum(slack, 0)[c.typ[cols]]
        ok = (freed > 0) & ((c.typ[cols] == t) | (c.gpus[cols] <= room))
        cols, cur, freed = cols[ok], cur[ok], freed[ok]
        jobs_t = jobs_t[c.gpus[choice[jobs_t]] > 0]  # to none frees GPUs
        cand_job = _cat(c.job[cols], jobs_t)
        cand_col = _cat(cols, np.full(len(jobs_t), -1))
        cand_freed = _cat(freed, c.gpus[choice[jobs_t]]).astype(np.float64)
        cand_loss = _cat(c.val[cur] - c.val[cols], c.val[choice[jobs_t]] - c.none[jobs_t])
        order = np.argsort(cand_loss / cand_freed, kind="stable")
        # The moves one at a time, in Python ints (as in `_fill`): a repair from every
        # job's best option can move thousands of jobs, and numpy's per-element cost
        # dominated it. A job moves at most once, so its old GPUs are known up front.
        to = cand_col[order]
        moves = zip(cand_job[order].tolist(), to.tolist(),
                    np.where(to >= 0, c.typ[np.maximum(to, 0)], -1).tolist(),
                    np.where(to >= 0, c.gpus[np.maximum(to, 0)], 0).tolist(),
                    c.gpus[choice[cand_job[order]]].tolist(), strict=True)
        free = slack.tolist()
        moved: dict[int, int] = {}
        for j, col, col_t, col_g, old_g in moves:
            if j in moved:
                continue
            if col >= 0 and col_t != t and col_g > free[col_t]:
                continue
            free[t] += old_g
            if col >= 0:
                free[col_t] -= col_g
            moved[j] = col
            if free[t] >= 0:
                break
        slack = np.array(free, dtype=np.int64)
        if moved:
            choice[list(moved)] = list(moved.values())
        else:  # cannot happen with positive GPUs; never loop forever
            choice[jobs_t] = -1
            slack = c.cap - c.usage(choice)
            if slack[t] < 0:
                raise RuntimeError("solve: internal error, cannot repair")
    return choice


def _fill(c: _Cols, choice: np.ndarray, lam: np.ndarray | None = None,
          rounds: int = 20) -> np.ndarray:
    """Greedy improvement of a feasible choice by single-job moves that fit the
    slack. Moves are taken in order of their change in λ-reduced value, then of
    gain: at the LP prices many moves gain about equally (ties, degenerate LPs),
    and the ones the LP itself would make fill capacity without wasting it."""
    choice = choice.copy()
    for _ in range(rounds):
        on = choice >= 0
        cur_val = c.none.copy()
        cur_val[on] = c.val[choice[on]]
        cur_t = np.full(c.n, -1, dtype=np.intp)
        cur_t[on] = c.typ[choice[on]]
        cur_g = np.zeros(c.n, dtype=np.int64)
        cur_g[on] = c.gpus[choice[on]]
        slack = c.cap - c.usage(choice)
        need = c.gpus - np.where(cur_t[c.job] == c.typ, cur_g[c.job], 0)
        gain = c.val - cur_val[c.job]
        cand = np.flatnonzero((gain > 1e-12) & (need <= slack[c.typ]))
        if not len(cand):
            break
        if lam is None:
            cand = cand[np.argsort(-gain[cand], kind="stable")]
        else:
            cur_price = np.where(cur_t >= 0, lam[np.maximum(cur_t, 0)], 0.0) * cur_g
            score = gain[cand] - lam[c.typ[cand]] * c.gf[cand] + cur_price[c.job[cand]]
            cand = cand[np.lexsort((-gain[cand], -np.round(score, 12)))]
        # The moves one at a time, in Python ints: this loop can visit thousands of
        # candidates, and numpy's per-call cost on 1-element work dominated it.
        moved: set[int] = set()
        least = int(need[cand].min())
        free = slack.tolist()
        has_t, has_g = cur_t.tolist(), cur_g.tolist()
        any_moved = False
        for k, j, t, g in zip(cand.tolist(), c.job[cand].tolist(), c.typ[cand].tolist(),
                              c.gpus[cand].tolist(), strict=True):
            if j in moved:
                continue
            if max(free) < least:  # nothing left can fit
                break
            need_k = g - (has_g[j] if has_t[j] == t else 0)
            if need_k > free[t]:
                continue
            if has_t[j] >= 0 and has_t[j] != t:
                free[has_t[j]] += has_g[j]
            free[t] -= need_k
            choice[j] = k
            moved.add(j)
            any_moved = True
        if not any_moved:
            break
    return choice


class _Moves(NamedTuple):
    """One type's moves for `_shift`, job-major: each job's (`jobs`) moves are
    `starts[r]:starts[r] + counts[r]` of `col` (-1: none), `dg` (net GPUs) and
    `gain`; the knapsack is over net changes in [-reach, slack + reach]."""

    jobs: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    col: np.ndarray
    dg: np.ndarray
    gain: np.ndarray
    slack: int
    reach: int


def _shift(c: _Cols, choice: np.ndarray, allowed: np.ndarray, none_ok: np.ndarray,
           max_jobs: int = 400) -> np.ndarray:
    """Improve a feasible choice type by type: the best set of moves within the
    type (or to/from none), at most one per job, whose net GPUs fit the type's
    slack -- an exact multiple-choice knapsack DP over the net change, so that
    rounding one job up can be paid for by moving others down. Only `allowed`
    columns (and none where `none_ok`) are considered; the jobs with the most
    allowed moves come first when there are more than `max_jobs`."""
    choice = choice.copy()
    for t in range(c.T):
        moves = _type_moves(c, choice, t, allowed, none_ok, max_jobs)
        if moves is not None:
            _best_moves(choice, moves)
    return choice


def _type_moves(c: _Cols, choice: np.ndarray, t: int, allowed: np.ndarray,
                none_ok: np.ndarray, max_jobs: int) -> _Moves | None:
    """The moves `_shift` weighs within type `t` from `choice` (None: none)."""
    on = choice >= 0
    cur_t = np.full(c.n, -1, dtype=np.intp)
    cur_t[on] = c.typ[choice[on]]
    cur_g = np.zeros(c.n, dtype=np.int64)
    cur_g[on] = c.gpus[choice[on]]
    cur_v = c.none.copy()
    cur_v[on] = c.val[choice[on]]
    mine = (cur_t == t) | (cur_t < 0)
    cols = np.flatnonzero(allowed & (c.typ == t) & mine[c.job])
    cols = cols[cols != choice[c.job[cols]]]
    down = np.flatnonzero((cur_t == t) & none_ok)
    opt_job = _cat(c.job[cols], down)
    opt_col = _cat(cols, np.full(len(down), -1))
    if not len(opt_job):
        return None
    opt_dg = _cat(c.gpus[cols], np.zeros(len(down), np.int64)) - cur_g[opt_job]
    opt_gain = _cat(c.val[cols], c.none[down]) - cur_v[opt_job]
    slack = int(c.cap[t] - c.usage(choice)[t])
    reach = int(np.abs(opt_dg).max()) * 2
    ok = opt_dg <= slack + reach
    order = np.lexsort((opt_col[ok], opt_job[ok]))
    opt_job, opt_col = opt_job[ok][order], opt_col[ok][order]
    opt_dg, opt_gain = opt_dg[ok][order], opt_gain[ok][order]
    jobs, starts, counts = np.unique(opt_job, return_index=True, return_counts=True)
    if len(jobs) > max_jobs:
        keep = np.sort(np.argsort(-counts, kind="stable")[:max_jobs])
        jobs, starts, counts = jobs[keep], starts[keep], counts[keep]
    return _Moves(jobs, starts, counts, opt_col, opt_dg, opt_gain, slack, reach)


def _best_moves(choice: np.ndarray, m: _Moves) -> None:
    """The knapsack DP over `m`'s net changes; its best set of moves, if it gains,
    applied to `choice` in place."""
    slack, reach, opt_dg, opt_gain = m.slack, m.reach, m.dg, m.gain
    # Net change u in [-reach, slack + reach] at index u + reach.
    width = slack + 2 * reach + 1
    # f is a view into a buffer with `reach` (>= every |opt_dg|) entries of -inf on
    # either side: a move out of range reads -inf, with no clip and mask per job.
    padded = np.full(width + 2 * reach, -np.inf)
    f = padded[reach:reach + width]
    f[reach] = 0.0
    at = np.arange(width) + reach
    args = []
    for s0, k in zip(m.starts.tolist(), m.counts.tolist(), strict=True):
        cand = padded[at[None, :] - opt_dg[s0:s0 + k, None]]
        cand += opt_gain[s0:s0 + k, None]
        top = cand.max(axis=0)
        better = top > f + 1e-12
        args.append(np.where(better, cand.argmax(axis=0) + 1, 0))
        np.copyto(f, top, where=better)
    u = int(np.argmax(f[:reach + slack + 1]))
    if f[u] <= 1e-12:
        return
    for r in range(len(m.jobs) - 1, -1, -1):
        k = int(args[r][u])
        if k:
            o = m.starts[r] + k - 1
            choice[m.jobs[r]] = m.col[o]
            u -= int(opt_dg[o])


def _round_tied(c: _Cols, rc: np.ndarray, best: np.ndarray, tie: float,
                max_jobs: int = 1500) -> np.ndarray | None:
    """Jobs with one tight option at λ take it; the LP over the tight options
    of the rest (if few) picks among them, rounded down. None if that fails."""
    tight = best[c.job] - rc <= tie
    none_tight = best - c.none <= tie
    n_tight = np.bincount(c.job[tight], minlength=c.n) + none_tight
    tied = np.flatnonzero(n_tight > 1)
    if len(tied) > max_jobs:
        return None
    choice = np.full(c.n, -1, dtype=np.int64)
    single = np.flatnonzero(tight & (n_tight[c.job] == 1))
    choice[c.job[single]] = single
    rcap = c.cap - c.usage(choice)
    if (rcap < 0).any():
        return None
    if len(tied):
        out = _lp(c, tied, tight, rcap, True)
        if out is None:
            return None
        choice[tied] = out[1]
    return _repair(c, choice)  # a job split across types may overfill when rounded


# -- with side rows -------------------------------------------------------------------------


def _entries(side: _Side, col: int) -> tuple[np.ndarray, np.ndarray]:
    """Side-row entries (rows, coefficients) of one column (none: no entries)."""
    if col < 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    s, e = side.col_ptr[col], side.col_ptr[col + 1]
    return side.col_row[s:e], side.col_coef[s:e]


class _RowState:
    """A choice with its usage and side-row activity, for moves one job at a
    time: what a move changes, whether it keeps the hard rows, what it gains."""

    def __init__(self, c: _Cols, choice: np.ndarray) -> None:
        assert c.side is not None  # (only made for a problem with side rows)
        self.c, self.side = c, c.side
        self.choice = choice.copy()
        self.slack = c.cap - c.usage(choice)
        self.act = self.side.activity(choice)
        self.tol = ROW_TOL * np.maximum(1.0, np.abs(self.side.rhs))

    def delta(self, j: int, col: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and change of activity if job j moves to `col`."""
        r0, a0 = _entries(self.side, int(self.choice[j]))
        r1, a1 = _entries(self.side, col)
        rows = _cat(r0, r1).astype(np.int64)
        return rows, _cat(-a0, a1)

    def fits(self, j: int, col: int, rows: np.ndarray, d: np.ndarray) -> bool:
        """Whether the move keeps the capacities and makes no hard row worse
        than allowed (a row within its rhs stays within; one over it does not grow)."""
        c, old = self.c, int(self.choice[j])
        if col >= 0:
            free = self.slack[c.typ[col]] + (c.gpus[old] if old >= 0 and c.typ[old] == c.typ[col]
                                             else 0)
            if c.gpus[col] > free:
                return False
        if not len(rows):
            return True
        u, inv = np.unique(rows, return_inverse=True)
        dd = np.bincount(inv, weights=d)
        hard = ~self.side.soft[u]
        new = self.act[u] + dd
        lim = np.maximum(self.side.rhs[u] + self.tol[u], self.act[u])
        return bool(np.all(~hard | (new <= lim) | (dd <= 0)))

    def gain(self, j: int, col: int, rows: np.ndarray, d: np.ndarray) -> float:
        """Change of the objective (values and soft penalties) by the move."""
        c, side, old = self.c, self.side, int(self.choice[j])
        g = (c.val[col] if col >= 0 else c.none[j]) - (c.val[old] if old >= 0 else c.none[j])
        if len(rows):
            u, inv = np.unique(rows, return_inverse=True)
            dd = np.bincount(inv, weights=d)
            soft = side.soft[u]
            before = np.maximum(0.0, self.act[u] - side.rhs[u])
            after = np.maximum(0.0, self.act[u] + dd - side.rhs[u])
            g -= float(side.pen[u][soft] @ (after - before)[soft])
        return float(g)

    def move(self, j: int, col: int, rows: np.ndarray, d: np.ndarray) -> None:
        c, old = self.c, int(self.choice[j])
        if old >= 0:
            self.slack[c.typ[old]] += c.gpus[old]
        if col >= 0:
            self.slack[c.typ[col]] -= c.gpus[col]
        np.add.at(self.act, rows, d)
        self.choice[j] = col

    def worst_hard_row(self) -> int:
        """The hard row most over its rhs, or -1 when none is."""
        over = np.where(self.side.soft, -np.inf, self.act - self.side.rhs - self.tol)
        r = int(np.argmax(over)) if len(over) else -1
        return r if r >= 0 and over[r] > 0 else -1


def _repair_rows(c: _Cols, choice: np.ndarray, rc: np.ndarray,
                 max_moves: int = 2000) -> np.ndarray | None:
    """Make `choice` fit the capacities (`_repair`) and then the hard side rows:
    while a hard row is over, move the job that brings it down at the least
    loss of reduced value `rc` per unit, among moves that keep the capacities
    and make no other hard row worse. None if that gets stuck."""
    st = _RowState(c, _repair(c, choice))
    side = st.side
    for _ in range(max_moves):
        r = st.worst_hard_row()
        if r < 0:
            return st.choice
        a_r = np.zeros(c.m)
        s, e = side.row_ptr[r], side.row_ptr[r + 1]
        a_r[side.row_col[s:e]] = side.row_coef[s:e]
        cur = st.choice
        cur_a = np.where(cur >= 0, a_r[np.maximum(cur, 0)], 0.0)
        cur_rc = np.where(cur >= 0, rc[np.maximum(cur, 0)], c.none)
        # Moves to another column, and to none, that lower row r.
        down = a_r - cur_a[c.job]
        cols = np.flatnonzero((down < 0) & (np.arange(c.m) != cur[c.job]))
        drop = np.flatnonzero(cur_a > 0)
        cand_job = _cat(c.job[cols], drop)
        cand_col = _cat(cols, np.full(len(drop), -1))
        cand_down = -_cat(down[cols], -cur_a[drop])
        cand_loss = cur_rc[cand_job] - _cat(rc[cols], c.none[drop])
        order = np.argsort(cand_loss / cand_down, kind="stable")
        for k in order.tolist():
            j, col = int(cand_job[k]), int(cand_col[k])
            rows, d = st.delta(j, col)
            if st.fits(j, col, rows, d):
                st.move(j, col, rows, d)
                break
        else:
            return None
    return None


def _fill_rows(c: _Cols, choice: np.ndarray, rounds: int = 6, per_round: int = 4000) -> np.ndarray:
    """Greedy improvement of a feasible choice by single-job moves that keep the
    capacities and the hard rows and raise the objective (soft penalties
    included). Moves are tried in order of their gain with each soft row priced
    at its penalty where it is at or over its rhs, each checked exactly."""
    st = _RowState(c, choice)
    side = st.side
    for _ in range(rounds):
        on = st.choice >= 0
        cur_val = c.none.copy()
        cur_val[on] = c.val[st.choice[on]]
        price = np.where(side.soft & (st.act >= side.rhs - st.tol), side.pen, 0.0)
        shift = side.shift(price)
        cur_shift = np.where(on, shift[np.maximum(st.choice, 0)], 0.0)
        est = c.val - shift - (cur_val - cur_shift)[c.job]
        drop_est = cur_shift - 0.0 + c.none - cur_val  # moving to none
        cand = np.flatnonzero(est > 1e-12)
        drop = np.flatnonzero(on & (drop_est > 1e-12))
        cand_job = _cat(c.job[cand], drop)
        cand_col = _cat(cand, np.full(len(drop), -1))
        cand_est = _cat(est[cand], drop_est[drop])
        if not len(cand_job):
            break
        order = np.argsort(-cand_est, kind="stable")[:per_round]
        moved = np.zeros(c.n, dtype=bool)
        for k in order.tolist():
            j, col = int(cand_job[k]), int(cand_col[k])
            if moved[j] or col == st.choice[j]:
                continue
            rows, d = st.delta(j, col)
            if st.fits(j, col, rows, d) and st.gain(j, col, rows, d) > 1e-12:
                st.move(j, col, rows, d)
                moved[j] = True
        if not moved.any():
            break
    return st.choice


def _round_master(c: _Cols, primal: Primal, rc: np.ndarray, best: np.ndarray, time_limit: float,
                  abs_gap: float, rel_gap: float, budget: int = 128) -> np.ndarray | None:
    """The Dantzig-Wolfe master's primal rounded by a small MIP. Jobs on which
    every proposal in use agrees keep that option, except the `budget` jobs
    closest to a tie at the prices (each job's second-best option nearest its
    best): those, and the jobs the proposals split, choose within what is left
    of every row among their options at most as far from their best as the
    last such job's second best, the proposals' options, and none. Reopening
    near-tied jobs lets the MIP pay for rounding the split ones. None if that
    MIP finds nothing."""
    if not primal:
        return None
    job = _cat(*[jobs for jobs, _, _ in primal]).astype(np.int64)
    col = _cat(*[choice for _, choice, _ in primal]).astype(np.int64)
    key = np.unique(job * (c.m + 1) + (col + 1))
    job, col = key // (c.m + 1), key % (c.m + 1) - 1
    count = np.bincount(job, minlength=c.n)
    fixed = np.full(c.n, -1, dtype=np.int64)
    one = count[job] == 1
    fixed[job[one]] = col[one]
    split = count > 1
    # Each job's second-smallest shortfall over its options (none included).
    d = _cat(best[c.job] - rc, best - c.none)
    owner = _cat(c.job, np.arange(c.n))
    order = np.lexsort((d, owner))
    starts = np.searchsorted(owner[order], np.arange(c.n))
    second = np.full(c.n, np.inf)
    has2 = np.bincount(owner, minlength=c.n) > 1
    second[has2] = d[order[starts[has2] + 1]]
    room = max(0, budget - int(split.sum()))
    near = np.argsort(np.where(split, np.inf, second), kind="stable")[:room]
    near = near[np.isfinite(second[near])]
    delta = float(second[near].max()) if len(near) else 0.0
    open_jobs = np.zeros(c.n, dtype=bool)
    open_jobs[near] = True
    open_jobs |= split
    if not open_jobs.any():
        return fixed if c.feasible(fixed) else None
    keep = (d[:c.m] <= delta) & open_jobs[c.job]
    keep[col[open_jobs[job] & (col >= 0)]] = True  # and what the master gives them
    jobs = np.flatnonzero(open_jobs)
    fixed[jobs] = -1
    o = _options(c, jobs, keep, np.ones(c.n, dtype=bool))
    rcap = c.cap - c.usage(fixed)
    assert c.side is not None
    srhs = c.side.rhs - c.side.activity(fixed)
    pick, _, _, _ = _mip(o, rcap, 0.0, time_limit, abs_gap, rel_gap, None, c.side, srhs)
    if pick is None:
        return None
    fixed[o.jobs] = o.choice(pick)
    return fixed if c.feasible(fixed) else None
