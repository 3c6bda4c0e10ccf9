"""Solvers for `ChoiceProblem`.

`solve` is the production path. An off-the-shelf MIP solve is 0.3-0.9 s at
2,048 GPUs and ~7 s at 8,192, and even HiGHS simplex on the LP relaxation takes
0.2-0.6 s there (the LP has a row per job), so `solve` exploits the structure:
only the few capacity rows couple the jobs.

1. Exact reductions: drop columns that cannot fit their type, that are no better
   than none, or that another column of the same job and type dominates (no
   more GPUs, at least the value).
2. If every job's best option fits, that is optimal.
3. Prices λ ≥ 0 for the capacity rows. Every λ gives the upper bound
   L(λ) = λ·cap + Σ_i max(none_i, max_c value_c − λ_{type c}·gpus_c), equal to
   the LP bound at the LP's duals. Small problems: HiGHS simplex on the whole
   LP. Large ones: Dantzig-Wolfe column generation on the capacity rows (a
   master LP with #types + 1 rows; pricing is one numpy pass over the columns)
   with Wentges smoothing.
4. Incumbents: the LP's basic optimum rounded down (it splits at most #types
   jobs), each job's leanest best option at λ, and the caller's `start`; each
   repaired to fit and greedily filled. If the gap is still open: the LP over
   the tied options only, and per-type knapsack DPs over small moves.
5. Lagrangian reduced-cost fixing: every feasible x has
   obj(x) ≤ L(λ) − Σ_i d_i(x_i), with d ≥ 0 an option's shortfall from its job's
   best at λ, so an option with d ≥ L − incumbent − ε is in no solution better
   than incumbent + ε. Jobs left with one option are fixed.
6. What is left is solved exactly: by DP over the capacities that can still
   bind, or, when that state space is too large, by HiGHS MIP.

Everything is local to the call (no module state), so calls are reentrant and
can run in threads or a process pool.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.problem import ChoiceProblem, ChoiceSolution

# stats["path"] holds the index of the path taken in PATHS (stats are floats).
PATHS = ("empty", "fits", "lagrangian", "dp", "mip", "time_limit")

_DP_WORK = 2.5e7  # state-option updates the DP may do before HiGHS MIP is used instead
_DP_STATES = 4e6
_DW_MAX_ITERS = 400
_DIRECT_LP = 3000  # columns + jobs up to which HiGHS simplex beats column generation


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


def _new_highs():
    """A silent HiGHS instance. HiGHS prints its version banner to the C stdout
    when the first instance of a process is constructed, before any option can
    be set; a scheduler's output (and `sia demo`) should not carry it, so the
    first construction runs with file descriptor 1 pointed at /dev/null."""
    global _banner_shown
    import highspy

    with _BANNER_LOCK:
        if _banner_shown:
            h = highspy.Highs()
        else:
            sys.stdout.flush()
            saved = os.dup(1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
                h = highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                os.close(devnull)
            _banner_shown = True
    h.setOptionValue("output_flag", False)
    return h


def _cat(*parts) -> np.ndarray:
    """np.concatenate of arrays and scalars (np.r_ costs ~15 µs a call)."""
    return np.concatenate([np.atleast_1d(x) for x in parts])


def path_name(stats: dict[str, float]) -> str:
    """The name of the path `solve` took, from its stats."""
    return PATHS[int(stats["path"])]


@dataclass
class _Cols:
    """The reduced column set, sorted by (job, type, GPUs)."""

    orig: np.ndarray  # original column index
    job: np.ndarray
    typ: np.ndarray
    gpus: np.ndarray  # int64
    gf: np.ndarray  # gpus as float64
    val: np.ndarray
    none: np.ndarray  # float64[n]
    cap: np.ndarray  # int64[T]
    ne_jobs: np.ndarray  # jobs with at least one column
    ne_starts: np.ndarray  # their first column

    @property
    def n(self) -> int:
        return len(self.none)

    @property
    def m(self) -> int:
        return len(self.val)

    @property
    def T(self) -> int:  # noqa: N802
        return len(self.cap)

    def usage(self, choice: np.ndarray) -> np.ndarray:
        cols = choice[choice >= 0]
        return np.bincount(self.typ[cols], weights=self.gpus[cols],
                           minlength=self.T).astype(np.int64)

    def value(self, choice: np.ndarray) -> float:
        on = choice >= 0
        return float(self.none[~on].sum() + self.val[choice[on]].sum())

    def to_orig(self, choice: np.ndarray) -> np.ndarray:
        out = np.full(len(choice), -1, dtype=np.int64)
        on = choice >= 0
        out[on] = self.orig[choice[on]]
        return out


def _reduce(p: ChoiceProblem) -> _Cols:
    job = np.asarray(p.col_job, dtype=np.intp)
    typ = np.asarray(p.col_type, dtype=np.intp)
    gpus = np.asarray(p.col_gpus, dtype=np.int64)
    val = np.asarray(p.col_value, dtype=np.float64)
    none = np.asarray(p.none_value, dtype=np.float64)
    cap = np.asarray(p.capacity, dtype=np.int64)
    keep = np.flatnonzero((gpus <= cap[typ]) & (val > none[job])) if len(job) else job
    # Order by (job, type, GPUs, -value); builders usually emit that order already,
    # and an integer key sorts far faster than a float lexsort.
    key = (job[keep] * max(1, len(cap)) + typ[keep]) * (int(gpus.max(initial=0)) + 1) + gpus[keep]
    if np.any(key[1:] < key[:-1]):
        order = np.argsort(key, kind="stable")
        keep, key = keep[order], key[order]
    if np.any(key[1:] == key[:-1]):  # duplicate (job, type, GPUs): best value first
        order = np.lexsort((-val[keep], key))
        keep, key = keep[order], key[order]
    idx = keep
    if len(idx):
        # Dominated: an earlier column of the same (job, type) -- no more GPUs --
        # has at least the value (a segmented prefix max, by doubling).
        group = np.cumsum(_cat(True, (job[idx][1:] != job[idx][:-1])
                                | (typ[idx][1:] != typ[idx][:-1])))
        v = val[idx]
        prefix = v.copy()
        step = 1
        while step < len(v) and np.any(group[step:] == group[:-step]):
            prefix[step:] = np.maximum(prefix[step:], np.where(group[step:] == group[:-step],
                                                               prefix[:-step], -np.inf))
            step *= 2
        prev = _cat(-np.inf, np.where(group[1:] == group[:-1], prefix[:-1], -np.inf))
        idx = idx[prev < v]
    j = job[idx]
    first = _cat(True, j[1:] != j[:-1]) if len(j) else np.zeros(0, dtype=bool)
    return _Cols(orig=idx.astype(np.int64), job=j, typ=typ[idx], gpus=gpus[idx],
                 gf=gpus[idx].astype(np.float64), val=val[idx], none=none.copy(), cap=cap,
                 ne_jobs=j[first], ne_starts=np.flatnonzero(first))


def _price(c: _Cols, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced values value − λ·gpus per column, and each job's best (≥ none)."""
    rc = c.val - lam[c.typ] * c.gf
    best = c.none.copy()
    if c.m:
        seg = np.maximum.reduceat(rc, c.ne_starts)
        best[c.ne_jobs] = np.maximum(best[c.ne_jobs], seg)
    return rc, best


def _argmax(c: _Cols, rc: np.ndarray, best: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """Each job's best option at the prices behind `rc`. Options within `tol` of
    the best count as tied, and ties go to none, then to the fewest GPUs: at LP
    prices many options tie (up to rounding), and the leanest keeps the choice
    feasible for `_fill` to build on."""
    choice = np.full(c.n, -1, dtype=np.int64)
    hit = np.flatnonzero(rc >= best[c.job] - tol)
    if len(hit):
        j = c.job[hit]
        starts = np.flatnonzero(_cat(True, j[1:] != j[:-1]))
        if tol > 0:  # fewest GPUs among the tied, then the first
            g = c.gpus[hit]
            least = np.minimum.reduceat(g, starts)
            hit = hit[g == np.repeat(least, np.diff(_cat(starts, len(hit))))]
            j = c.job[hit]
            starts = np.flatnonzero(_cat(True, j[1:] != j[:-1]))
        choice[j[starts]] = hit[starts]
    choice[best <= c.none + tol] = -1
    return choice


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


def _repair(c: _Cols, choice: np.ndarray) -> np.ndarray:
    """Make `choice` fit by moving jobs off over-full types, cheapest loss per
    freed GPU first."""
    choice = choice.copy()
    slack = c.cap - c.usage(choice)
    while (slack < 0).any():
        t = int(np.argmin(slack))
        on = np.flatnonzero(choice >= 0)
        jobs_t = on[c.typ[choice[on]] == t]
        in_t = np.zeros(c.n, dtype=bool)
        in_t[jobs_t] = True
        cols = np.flatnonzero(in_t[c.job])
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
        moved = np.zeros(c.n, dtype=bool)
        for k in order.tolist():
            j, col = int(cand_job[k]), int(cand_col[k])
            if moved[j]:
                continue
            old = int(choice[j])
            if col >= 0 and c.typ[col] != t and c.gpus[col] > slack[c.typ[col]]:
                continue
            slack[t] += c.gpus[old]
            if col >= 0:
                slack[c.typ[col]] -= c.gpus[col]
            choice[j], moved[j] = col, True
            if slack[t] >= 0:
                break
        if not moved.any():  # cannot happen with positive GPUs; never loop forever
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
        moved = np.zeros(c.n, dtype=bool)
        any_moved = False
        least = int(need[cand].min())
        for k in cand.tolist():
            j, t = int(c.job[k]), int(c.typ[k])
            if moved[j]:
                continue
            if slack.max() < least:  # nothing left can fit
                break
            need_k = int(c.gpus[k]) - (int(cur_g[j]) if cur_t[j] == t else 0)
            if need_k > slack[t]:
                continue
            if cur_t[j] >= 0 and cur_t[j] != t:
                slack[cur_t[j]] += cur_g[j]
            slack[t] -= need_k
            choice[j], moved[j], any_moved = k, True, True
        if not any_moved:
            break
    return choice


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
            continue
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
        # Net change u in [-reach, slack + reach] at index u + reach.
        width = slack + 2 * reach + 1
        f = np.full(width, -np.inf)
        f[reach] = 0.0
        pos = np.arange(width)
        args = []
        for s0, k in zip(starts.tolist(), counts.tolist(), strict=True):
            src = pos[None, :] - opt_dg[s0:s0 + k, None]
            valid = (src >= 0) & (src < width)
            cand = np.where(valid, f[np.clip(src, 0, width - 1)], -np.inf)
            cand += opt_gain[s0:s0 + k, None]
            top = cand.max(axis=0)
            better = top > f + 1e-12
            args.append(np.where(better, cand.argmax(axis=0) + 1, 0))
            f = np.where(better, top, f)
        u = int(np.argmax(f[:reach + slack + 1]))
        if f[u] <= 1e-12:
            continue
        for r in range(len(jobs) - 1, -1, -1):
            k = int(args[r][u])
            if k:
                o = starts[r] + k - 1
                choice[jobs[r]] = opt_col[o]
                u -= int(opt_dg[o])
    return choice


def _dp(o: _Opts, cap: np.ndarray, work: float):
    """Exact DP over the capacities that can bind, every job taking one of its
    options. Returns (option index per job, value), (None, -inf) if infeasible,
    or None when it would take more than `work` state updates."""
    opt_typ, opt_gpus, opt_val, opt_ptr = o.typ, o.gpus, o.val, o.ptr
    nj = len(opt_ptr) - 1
    T = len(cap)
    demand = np.zeros(T, dtype=np.int64)
    for t in range(T):
        g = np.where(opt_typ == t, opt_gpus, 0)
        demand[t] = np.maximum.reduceat(g, opt_ptr[:-1]).sum() if nj else 0
    binding = [t for t in range(T) if demand[t] > cap[t]]
    axis = {t: a for a, t in enumerate(binding)}
    # A (1,)-shaped state when nothing binds keeps the slicing below uniform.
    dims = tuple(int(cap[t]) + 1 for t in binding) or (1,)
    states = math.prod(dims)
    if states > _DP_STATES or states * len(opt_val) > work:
        return None
    f = np.zeros(dims)
    args = []
    full = tuple(slice(None) for _ in dims)
    for j in range(nj):
        new = np.full(dims, -np.inf)
        arg = np.full(dims, -1, dtype=np.int16 if opt_ptr[j + 1] - opt_ptr[j] < 32000 else np.int32)
        for k in range(opt_ptr[j], opt_ptr[j + 1]):
            t, g, v = int(opt_typ[k]), int(opt_gpus[k]), float(opt_val[k])
            if t in axis and g > 0:
                a = axis[t]
                if g >= dims[a]:
                    continue
                src = full[:a] + (slice(0, dims[a] - g),) + full[a + 1:]
                dst = full[:a] + (slice(g, None),) + full[a + 1:]
            else:
                src = dst = full
            cand = f[src] + v
            view, aview = new[dst], arg[dst]
            better = cand > view
            np.copyto(view, cand, where=better)
            np.copyto(aview, k - opt_ptr[j], where=better)
        f = new
        args.append(arg)
    at = [int(cap[t]) for t in binding] or [0]
    value = float(f[tuple(at)])
    if not np.isfinite(value):
        return None, -np.inf
    pick = np.zeros(nj, dtype=np.int64)
    for j in range(nj - 1, -1, -1):
        k = int(args[j][tuple(at)])
        pick[j] = k
        o = opt_ptr[j] + k
        if int(opt_typ[o]) in axis:
            at[axis[int(opt_typ[o])]] -= int(opt_gpus[o])
    return pick, value


@dataclass
class _Opts:
    """Options (columns, and none as column -1) of a subset of jobs."""

    jobs: np.ndarray  # job indices
    col: np.ndarray  # reduced column per option, -1 = none; job-major
    ptr: np.ndarray  # options of jobs[r] are ptr[r]:ptr[r+1]
    typ: np.ndarray
    gpus: np.ndarray
    val: np.ndarray

    @property
    def local_job(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.jobs)), np.diff(self.ptr))

    def choice(self, pick: np.ndarray) -> np.ndarray:
        """Columns for option indices `pick` (one per job, relative to ptr)."""
        return self.col[self.ptr[:-1] + pick]


def _options(c: _Cols, jobs: np.ndarray, keep: np.ndarray, none_ok: np.ndarray) -> _Opts:
    """The kept columns and allowed nones of `jobs` (ascending), none first
    within a job."""
    sel = np.zeros(c.n, dtype=bool)
    sel[jobs] = True
    cols = np.flatnonzero(keep & sel[c.job])
    nj = jobs[none_ok[jobs]]
    opt_job = _cat(nj, c.job[cols])
    opt_col = _cat(np.full(len(nj), -1, dtype=np.int64), cols)
    order = np.lexsort((opt_col, opt_job))
    opt_job, opt_col = opt_job[order], opt_col[order]
    ptr = _cat(0, np.cumsum(np.bincount(opt_job, minlength=c.n)[jobs])).astype(np.int64)
    on = opt_col >= 0
    typ = np.zeros(len(opt_col), dtype=c.typ.dtype)
    gpus = np.zeros(len(opt_col), dtype=np.int64)
    val = c.none[opt_job]
    typ[on], gpus[on], val[on] = c.typ[opt_col[on]], c.gpus[opt_col[on]], c.val[opt_col[on]]
    return _Opts(jobs=jobs, col=opt_col, ptr=ptr, typ=typ, gpus=gpus, val=val)


def _highs(o: _Opts, cap: np.ndarray, integer: bool, offset: float = 0.0):
    """A HiGHS model of the options: one = 1 row per job, one capacity row per
    type, built in bulk as CSC."""
    import highspy

    nj, T, k = len(o.jobs), len(cap), len(o.val)
    has_g = o.gpus > 0
    a_start = _cat(0, np.cumsum(1 + has_g)).astype(np.int32)
    a_index = np.empty(a_start[-1], dtype=np.int32)
    a_value = np.ones(a_start[-1])
    a_index[a_start[:-1]] = o.local_job
    second = a_start[:-1][has_g] + 1
    a_index[second] = nj + o.typ[has_g]
    a_value[second] = o.gpus[has_g]
    h = _new_highs()
    h.passModel(k, nj + T, len(a_index), int(highspy.MatrixFormat.kColwise.value),
                int(highspy.ObjSense.kMaximize.value), float(offset),
                o.val.astype(np.float64), np.zeros(k), np.ones(k),
                _cat(np.ones(nj), np.full(T, -highspy.kHighsInf)),
                _cat(np.ones(nj), cap.astype(np.float64)),
                a_start, a_index, a_value, np.full(k, int(integer), dtype=np.int32))
    return h


def _pick(o: _Opts, x: np.ndarray, integral: bool = False) -> np.ndarray:
    """Option index per job from a solution x. `integral` (a MIP's): each job's
    largest x. Otherwise (a basic LP optimum) a job at 1 keeps that option and
    a split job takes its option with the fewest GPUs (rounding down)."""
    lj = o.local_job
    pick = np.zeros(len(o.jobs), dtype=np.int64)
    if integral:
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


def _mip(o: _Opts, cap, offset, time_limit, abs_gap, rel_gap, start):
    """HiGHS MIP over the options. Returns (option index per job or None, value
    (with offset), proven bound, whether optimal)."""
    import highspy

    h = _highs(o, cap, True, offset)
    h.setOptionValue("time_limit", max(0.01, time_limit))
    h.setOptionValue("mip_abs_gap", abs_gap)
    h.setOptionValue("mip_rel_gap", rel_gap)
    if start is not None:
        k = len(o.val)
        x0 = np.zeros(k)
        x0[o.ptr[:-1] + start] = 1.0
        h.setSolution(k, np.arange(k, dtype=np.int32), x0)
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None, -np.inf, -np.inf, True
    if info.primal_solution_status != highspy.kSolutionStatusFeasible:
        return None, -np.inf, float(info.mip_dual_bound), False
    x = np.asarray(h.getSolution().col_value)
    return (_pick(o, x, True), float(info.objective_function_value), float(info.mip_dual_bound),
            status == highspy.HighsModelStatus.kOptimal)


def lp_interior(value: np.ndarray, a_ub, b_ub: np.ndarray) -> np.ndarray:
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


def _lp(c: _Cols, jobs: np.ndarray, cols: np.ndarray, cap: np.ndarray, presolve: bool):
    """HiGHS simplex on the LP of `jobs` over `cols` and none, within `cap`.
    Returns (capacity duals, a basic optimum rounded down as a choice for
    `jobs`, the number of jobs it splits), or None."""
    import highspy

    o = _options(c, jobs, cols, np.ones(c.n, dtype=bool))
    h = _highs(o, cap, False)
    if not presolve:
        h.setOptionValue("presolve", "off")
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    sol = h.getSolution()
    x = np.asarray(sol.col_value)
    frac = int(len(np.unique(o.local_job[(x > 1e-7) & (x < 1 - 1e-7)])))
    lam = np.maximum(np.asarray(sol.row_dual)[len(jobs):], 0.0)
    return lam, o.choice(_pick(o, x)), frac


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


def _eps(inc: float, bound: float, rel_gap: float) -> float:
    """An absolute gap that is within rel_gap of every objective in [inc, bound]."""
    lo, hi = min(inc, bound), max(inc, bound)
    return rel_gap * max(1.0, 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)))


def _start_choice(p: ChoiceProblem, start) -> np.ndarray | None:
    """`start` as an int64 choice vector if it is a feasible one, else None."""
    if start is None:
        return None
    s = np.asarray(start)
    if s.shape != (p.num_jobs,) or not (np.issubdtype(s.dtype, np.integer)
                                       or np.issubdtype(s.dtype, np.floating)):
        return None
    if not np.all(np.isfinite(s)) or np.any(s != np.round(s)) or np.any(s < -1):
        return None
    s = s.astype(np.int64)
    return s if p.is_feasible(s) else None


def solve(problem: ChoiceProblem, *, time_limit: float = 30.0, rel_gap: float = 1e-4,
          start: np.ndarray | None = None) -> ChoiceSolution:
    """Best choice within `rel_gap` (relative to max(1, |objective|)) or the best
    found when `time_limit` (seconds) runs out. `start`: a candidate choice (e.g.
    the previous round's); ignored unless feasible, never beaten by the answer."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    stats: dict[str, float] = {"lp_s": 0.0, "mip_s": 0.0, "dw_iters": 0.0, "fractional_jobs": 0.0,
                               "residual_jobs": 0.0, "residual_cols": 0.0, "start_used": 0.0}
    p = problem
    c = _reduce(p)
    stats["reduced_cols"] = float(c.m)
    s0 = _start_choice(p, start)
    stats["start_used"] = float(s0 is not None)

    def finish(choice_orig, bound, path, status=None):
        if not p.is_feasible(choice_orig):  # a bug, not a property of the input
            raise RuntimeError("solve: internal error, infeasible choice")
        obj = p.objective(choice_orig)
        # The start wins ties: an equally good answer should not move jobs.
        if s0 is not None and p.objective(s0) >= obj - 1e-12 * max(1.0, abs(obj)):
            choice_orig, obj = s0, p.objective(s0)
        bound = max(bound, obj)
        if status is None:
            ok = bound - obj <= rel_gap * max(1.0, abs(obj)) * (1 + 1e-9) + 1e-12
            status = "optimal" if ok else "time_limit"
        if status != "optimal":
            path = "time_limit"
        stats["path"] = float(PATHS.index(path))
        stats["total_s"] = time.perf_counter() - t0
        return ChoiceSolution(choice=np.asarray(choice_orig, dtype=np.int64), objective=obj,
                              bound=bound, status=status, stats=stats)

    if c.m == 0:
        return finish(np.full(p.num_jobs, -1, dtype=np.int64), float(c.none.sum()), "empty")
    rc0, best0 = _price(c, np.zeros(c.T))
    greedy = _argmax(c, rc0, best0)
    if np.all(c.usage(greedy) <= c.cap):
        return finish(c.to_orig(greedy), float(best0.sum()), "fits")

    # A start in reduced indices (a column dropped as dominated maps to none,
    # which keeps it feasible; `finish` still compares against the original).
    s_red = None
    if s0 is not None:
        pos = np.full(p.num_cols, -1, dtype=np.int64)
        pos[c.orig] = np.arange(c.m)
        s_red = np.where(s0 >= 0, pos[np.maximum(s0, 0)], -1)
        s_red = _fill(c, s_red)

    # Prices λ for the capacity rows, and incumbents. Small problems: HiGHS
    # simplex on the whole LP is quicker than column generation, and its basic
    # optimum splits at most #types jobs. Large ones: Dantzig-Wolfe.
    cands = [] if s_red is None else [s_red]
    tie = 1e-9 * max(1.0, float(np.abs(c.val).max()), float(np.abs(c.none).max()))
    t_lp = time.perf_counter()
    direct = (_lp(c, np.arange(c.n), np.ones(c.m, dtype=bool), c.cap, False)
              if c.m + c.n <= _DIRECT_LP else None)
    if direct is not None:
        lam, rounded, frac = direct
        rc, best = _price(c, lam)
        lbound = float(best.sum() + lam @ c.cap)
        cands.append(_fill(c, _repair(c, rounded), lam))
    else:
        scale = max(1.0, abs(float(best0.sum())), abs(float(c.none.sum())))
        lam, lbound, rc, best, _, iters, frac = _lagrangian(c, deadline, 1e-9 * scale,
                                                            cands[:1])
        stats["dw_iters"] = float(iters)
    stats["direct_lp"] = float(direct is not None)
    stats.update(lp_s=time.perf_counter() - t_lp, fractional_jobs=float(frac), lp_bound=lbound)
    cands.append(_fill(c, _repair(c, _argmax(c, rc, best, tie)), lam))
    inc_red = max(cands, key=c.value)
    inc = c.value(inc_red)
    t_inc = time.perf_counter()
    if direct is None and lbound - inc > _eps(inc, lbound, rel_gap) and t_inc < deadline:
        # A basic optimum of the LP over the (nearly) tight columns, rounded.
        out = _round_tied(c, rc, best, 1e3 * tie)
        if out is not None:
            rounded = _fill(c, out, lam)
            if c.value(rounded) > inc:
                inc_red, inc = rounded, c.value(rounded)
    if lbound - inc > _eps(inc, lbound, rel_gap) and time.perf_counter() < deadline:
        # Only options that could be part of a solution better than inc matter.
        d = best[c.job] - rc
        shifted = _fill(c, _shift(c, inc_red, d < lbound - inc, best - c.none < lbound - inc),
                        lam)
        if c.value(shifted) > inc:
            inc_red, inc = shifted, c.value(shifted)
    stats["heuristic_s"] = time.perf_counter() - t_inc
    eps = _eps(inc, lbound, rel_gap)
    stats["incumbent"] = inc
    if lbound - inc <= eps:
        return finish(c.to_orig(inc_red), lbound, "lagrangian")
    if time.perf_counter() > deadline:
        return finish(c.to_orig(inc_red), lbound, "time_limit", "time_limit")

    t_mip = time.perf_counter()
    d = best[c.job] - rc  # shortfall of each column from its job's best at λ
    d_none = best - c.none
    # Reduced-cost fixing, then an exact solve of what is left: a DP that proves
    # the optimum itself when that is cheap, else a DP within eps, else HiGHS
    # MIP with half of eps left for its own gap.
    pick = None
    tiny = 1e-12 * max(1.0, abs(inc))
    for method, eps_fix, work in (("dp", tiny, 0.2 * _DP_WORK), ("dp", eps, _DP_WORK),
                                  ("mip", 0.5 * eps, 0.0)):
        res = _residual(c, d, d_none, lbound - inc - eps_fix)
        if res is None:  # nothing can beat the incumbent by more than eps_fix
            stats["mip_s"] = time.perf_counter() - t_mip
            return finish(c.to_orig(inc_red), min(lbound, inc + eps_fix), "lagrangian")
        fixed, o, rcap = res
        fixed_part = c.value(fixed) - float(c.none[o.jobs].sum())
        stats.update(residual_jobs=float(len(o.jobs)), residual_cols=float(len(o.col)))
        if method == "dp":
            out = _dp(o, rcap, work)
            if out is not None:
                path, exact = "dp", True
                pick, zbound = out[0], fixed_part + out[1]
                break
        else:
            path = "mip"
            pick, _, zbound, exact = _mip(o, rcap, fixed_part, deadline - time.perf_counter(),
                                          0.5 * eps, rel_gap, _residual_start(inc_red, o))
    stats["mip_s"] = time.perf_counter() - t_mip

    best_choice, best_val = inc_red, inc
    if pick is not None:
        cand = fixed.copy()
        cand[o.jobs] = o.choice(pick)
        if np.all(c.usage(cand) <= c.cap) and c.value(cand) > best_val:
            best_choice, best_val = cand, c.value(cand)
    # A solution better than inc + eps_fix respects the fixing, so the optimum
    # is at most max(inc + eps_fix, the residual's bound).
    bound = min(lbound, max(inc + eps_fix, zbound))
    return finish(c.to_orig(best_choice), bound, path if exact else "time_limit",
                  None if exact else "time_limit")


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


def solve_reference(problem: ChoiceProblem, solver: str = "GLPK_MI",
                    time_limit: float | None = None) -> ChoiceSolution:
    """The plain ILP in CVXPY -- a binary variable per column, a <= 1 row per
    job, a capacity row per type, none as none_value * (1 - sum x) -- solved by
    GLPK_MI (the paper's choice, via cvxopt) or CVXPY's HIGHS."""
    import cvxpy as cp
    import scipy.sparse as sp

    if solver not in ("GLPK_MI", "HIGHS"):
        raise ValueError(f"solver: expected 'GLPK_MI' or 'HIGHS', got {solver!r}")
    t0 = time.perf_counter()
    p = problem
    n = p.num_jobs
    choice = np.full(n, -1, dtype=np.int64)
    # Columns wider than their type are 0 in every solution; GLPK's presolver
    # aborts the process (glp_add_cols: ncs = 0) when that empties the model.
    cols = np.flatnonzero(p.col_gpus <= p.capacity[p.col_type]) if p.num_cols else np.zeros(0, int)
    m = len(cols)
    status = "optimal"
    if m:
        x = cp.Variable(m, boolean=True)
        idx = np.arange(m)
        a_job = sp.csr_matrix((np.ones(m), (p.col_job[cols], idx)), shape=(n, m))
        a_typ = sp.csr_matrix((p.col_gpus[cols].astype(float), (p.col_type[cols], idx)),
                              shape=(p.num_types, m))
        objective = cp.Maximize(p.col_value[cols] @ x + p.none_value @ (1 - a_job @ x))
        prob = cp.Problem(objective, [a_job @ x <= 1, a_typ @ x <= p.capacity])
        opts: dict = {}
        if solver == "GLPK_MI" and time_limit is not None:
            opts["tm_lim"] = int(time_limit * 1000)
        if solver == "HIGHS":
            opts["mip_rel_gap"] = 1e-7
            if time_limit is not None:
                opts["time_limit"] = float(time_limit)
        prob.solve(solver=solver, **opts)
        if x.value is None:
            raise RuntimeError(f"{solver}: no solution ({prob.status})")
        sel = cols[np.flatnonzero(np.asarray(x.value) > 0.5)]
        choice[p.col_job[sel]] = sel
        status = "optimal" if prob.status == cp.OPTIMAL else str(prob.status)
    obj = p.objective(choice)
    return ChoiceSolution(choice, obj, obj if status == "optimal" else math.inf, status,
                          {"total_s": time.perf_counter() - t0})
