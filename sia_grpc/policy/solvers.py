"""Solvers for `ChoiceProblem`.

`solve` is the production path. An off-the-shelf MIP solve is 0.3-0.9 s at
2,048 GPUs and ~7 s at 8,192, and even HiGHS' simplex on the LP relaxation is
too slow there (the LP has one row per job), so `solve` exploits the structure:
only the few capacity rows couple the jobs.

1. Exact reductions: drop columns that cannot fit their type, that are no better
   than "none", or that are dominated by a column of the same job and type with
   no more GPUs and at least the value.
2. If every job's best option fits, that is optimal.
3. Lagrangian dual of the capacity rows, min_{λ≥0} L(λ) = λ·cap + Σ_i max(none_i,
   max_c value_c − λ_{type c}·gpus_c), solved by Dantzig-Wolfe column generation
   (a HiGHS master LP with #types + 1 rows; pricing is one numpy pass) with
   Wentges smoothing. L(λ) equals the LP bound at the optimum, and any λ ≥ 0
   gives a valid upper bound, so an early stop is safe.
4. Incumbent: each job's best option at λ, repaired to fit and greedily filled;
   the caller's `start` and its greedy fill compete.
5. Lagrangian reduced-cost fixing: a feasible x satisfies
   obj(x) ≤ L(λ) − Σ_i d_i(x_i), with d ≥ 0 the option's shortfall from its job's
   best at λ, so an option with d ≥ L − incumbent − ε cannot be in a solution
   better than incumbent + ε. Jobs left with a single option are fixed.
6. The residual problem is solved exactly by dynamic programming over the
   capacities that can still bind, or, when that state space is too large, by
   HiGHS MIP (bulk-built sparse model, incumbent as start).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.problem import ChoiceProblem, ChoiceSolution

# stats["path"] holds the index of the path taken in PATHS (stats are floats).
PATHS = ("empty", "fits", "lagrangian", "dp", "mip", "time_limit")

_DP_WORK = 2.5e7  # state-option updates the DP may do before HiGHS MIP is used instead
_DP_STATES = 4e6
_DW_MAX_ITERS = 400


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
    order = np.lexsort((-val[keep], gpus[keep], typ[keep], job[keep]))
    idx = keep[order]
    if len(idx):
        # Dominated: an earlier column of the same (job, type) -- no more GPUs --
        # has at least the value. Segmented prefix max on exact integer keys.
        j, t = job[idx], typ[idx]
        new_group = np.r_[True, (j[1:] != j[:-1]) | (t[1:] != t[:-1])]
        rank = np.unique(val[idx], return_inverse=True)[1].astype(np.int64)
        key = (np.cumsum(new_group) - 1) * (len(idx) + 1) + rank
        prev = np.r_[-1, np.maximum.accumulate(key)[:-1]]
        idx = idx[prev < key]
    j = job[idx]
    first = np.r_[True, j[1:] != j[:-1]] if len(j) else np.zeros(0, dtype=bool)
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


def _argmax(c: _Cols, rc: np.ndarray, best: np.ndarray) -> np.ndarray:
    """Each job's best option; ties go to none, then to the fewest GPUs."""
    choice = np.full(c.n, -1, dtype=np.int64)
    hit = np.flatnonzero(rc >= best[c.job])
    if len(hit):
        j = c.job[hit]
        firsts = hit[np.r_[True, j[1:] != j[:-1]]]
        choice[c.job[firsts]] = firsts
    choice[best <= c.none] = -1
    return choice


def _lagrangian(c: _Cols, deadline: float, tol: float, seeds: list[np.ndarray]):
    """Dantzig-Wolfe on the capacity rows. Returns (λ, L(λ), rc, best, master
    objective, iterations, fractional jobs of the master's primal)."""
    import highspy

    T = c.T
    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve", "off")
    h.passModel(highspy.HighsLp())
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.addRows(T + 1, np.r_[np.full(T, -inf), 1.0], np.r_[c.cap.astype(np.float64), 1.0],
              0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
    rows = np.arange(T + 1, dtype=np.int32)
    columns: list[np.ndarray] = []

    def add(choice: np.ndarray) -> tuple[np.ndarray, float]:
        use, v = c.usage(choice).astype(np.float64), c.value(choice)
        h.addCol(v, 0.0, inf, T + 1, rows, np.r_[use, 1.0])
        columns.append(choice)
        return use, v

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
            if c.value(choice) - lam_m @ use - pi > 1e-12 * max(1.0, abs(mobj)) or alpha == 0:
                break
            alpha = 0.0 if alpha < 0.1 else alpha / 2  # mis-pricing: trust the master more
        add(choice)
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
        cand_job = np.r_[c.job[cols], jobs_t]
        cand_col = np.r_[cols, np.full(len(jobs_t), -1)]
        cand_freed = np.r_[freed, c.gpus[choice[jobs_t]]].astype(np.float64)
        cand_loss = np.r_[c.val[cur] - c.val[cols], c.val[choice[jobs_t]] - c.none[jobs_t]]
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
    return choice


def _fill(c: _Cols, choice: np.ndarray, rounds: int = 20) -> np.ndarray:
    """Greedy improvement of a feasible choice: single-job moves that fit the
    slack, largest gain first."""
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
        cand = cand[np.argsort(-gain[cand], kind="stable")]
        moved = np.zeros(c.n, dtype=bool)
        any_moved = False
        for k in cand.tolist():
            j, t = int(c.job[k]), int(c.typ[k])
            if moved[j]:
                continue
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


def _dp(opt_typ, opt_gpus, opt_val, opt_ptr, cap):
    """Exact DP for a small multiple-choice problem in which every job must take
    one of its options (an option with 0 GPUs stands for none). Returns (option
    index per job, value), (None, -inf) if infeasible, or None when too large."""
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
    if states > _DP_STATES or states * len(opt_val) > _DP_WORK:
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


def _mip(opt_typ, opt_gpus, opt_val, opt_ptr, cap, offset, time_limit, abs_gap, rel_gap, start):
    """HiGHS MIP for the residual problem (same contract as `_dp`, plus the
    proven bound). `start`: option index per job or None."""
    import highspy

    nj, T, k = len(opt_ptr) - 1, len(cap), len(opt_val)
    opt_job = np.repeat(np.arange(nj), np.diff(opt_ptr))
    has_g = opt_gpus > 0
    nnz_per = 1 + has_g.astype(np.int64)
    a_start = np.r_[0, np.cumsum(nnz_per)].astype(np.int32)
    a_index = np.empty(a_start[-1], dtype=np.int32)
    a_value = np.ones(a_start[-1])
    a_index[a_start[:-1]] = opt_job
    second = a_start[:-1][has_g] + 1
    a_index[second] = nj + opt_typ[has_g]
    a_value[second] = opt_gpus[has_g]
    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.01, time_limit))
    h.setOptionValue("mip_abs_gap", abs_gap)
    h.setOptionValue("mip_rel_gap", rel_gap)
    h.passModel(k, nj + T, len(a_index), int(highspy.MatrixFormat.kColwise.value),
                int(highspy.ObjSense.kMaximize.value), float(offset),
                np.asarray(opt_val, np.float64), np.zeros(k), np.ones(k),
                np.r_[np.ones(nj), np.full(T, -inf)], np.r_[np.ones(nj), cap.astype(np.float64)],
                a_start, a_index, a_value, np.ones(k, dtype=np.int32))
    if start is not None:
        x0 = np.zeros(k)
        x0[opt_ptr[:-1] + start] = 1.0
        h.setSolution(k, np.arange(k, dtype=np.int32), x0)
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None, -np.inf, -np.inf, True
    if info.primal_solution_status != highspy.kSolutionStatusFeasible:
        return None, -np.inf, float(info.mip_dual_bound), False
    x = np.asarray(h.getSolution().col_value)
    pick = np.zeros(nj, dtype=np.int64)
    sel = np.flatnonzero(x > 0.5)
    pick[opt_job[sel]] = sel - opt_ptr[opt_job[sel]]
    return (pick, float(info.objective_function_value), float(info.mip_dual_bound),
            status == highspy.HighsModelStatus.kOptimal)


def _start_choice(p: ChoiceProblem, start) -> np.ndarray | None:
    if start is None:
        return None
    s = np.asarray(start)
    if s.shape != (p.num_jobs,) or not np.issubdtype(s.dtype, np.integer):
        return None
    s = s.astype(np.int64)
    if np.any(s < -1):
        return None
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
        obj = p.objective(choice_orig)
        if s0 is not None and p.objective(s0) > obj:
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

    scale = max(1.0, abs(float(best0.sum())), abs(float(c.none.sum())))
    t_lp = time.perf_counter()
    lam, lbound, rc, best, mobj, iters, frac = _lagrangian(
        c, deadline, max(0.1 * rel_gap, 1e-10) * scale, [s_red] if s_red is not None else [])
    stats.update(lp_s=time.perf_counter() - t_lp, dw_iters=float(iters),
                 fractional_jobs=float(frac), lp_bound=lbound)

    cands = [_fill(c, _repair(c, _argmax(c, rc, best)))]
    if s_red is not None:
        cands.append(s_red)
    inc_red = max(cands, key=c.value)
    inc = c.value(inc_red)
    lo, hi = min(inc, lbound), max(inc, lbound)
    eps = rel_gap * max(1.0, 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)))
    if lbound - inc <= eps:
        return finish(c.to_orig(inc_red), lbound, "lagrangian")
    if time.perf_counter() > deadline:
        return finish(c.to_orig(inc_red), lbound, "time_limit", "time_limit")

    t_mip = time.perf_counter()
    d = best[c.job] - rc  # shortfall of each column from its job's best at λ
    d_none = best - c.none
    res = None
    for eps_fix in (eps, 0.5 * eps):
        res = _residual(c, d, d_none, lbound - inc - eps_fix)
        if res is None:  # nothing can beat the incumbent by more than eps_fix
            stats["mip_s"] = time.perf_counter() - t_mip
            return finish(c.to_orig(inc_red), min(lbound, inc + eps_fix), "lagrangian")
        fixed, rjobs, opt_col, opt_ptr, opt_typ, opt_gpus, opt_val, rcap = res
        stats.update(residual_jobs=float(len(rjobs)), residual_cols=float(len(opt_col)))
        if eps_fix == eps:
            out = _dp(opt_typ, opt_gpus, opt_val, opt_ptr, rcap)
            if out is not None:
                path, pick, zr = "dp", out[0], out[1]
                zbound, exact = zr, True
                break
        else:
            rstart = _residual_start(inc_red, rjobs, opt_col, opt_ptr)
            offset = c.value(fixed) - float(c.none[rjobs].sum()) if len(rjobs) else c.value(fixed)
            pick, zr, zbound, exact = _mip(
                opt_typ, opt_gpus, opt_val, opt_ptr, rcap, offset,
                deadline - time.perf_counter(), 0.5 * eps, rel_gap, rstart)
            path = "mip"
            if pick is not None:
                zr -= offset
            zbound -= offset
    stats["mip_s"] = time.perf_counter() - t_mip

    best_choice, best_val = inc_red, inc
    if pick is not None:
        cand = fixed.copy()
        cand[rjobs] = opt_col[opt_ptr[:-1] + pick]
        if c.value(cand) > best_val:
            best_choice, best_val = cand, c.value(cand)
    # A solution better than inc + eps_fix respects the fixing, so the optimum
    # is at most max(inc + eps_fix, residual bound).
    fixed_part = c.value(fixed) - float(c.none[rjobs].sum())
    bound = min(lbound, max(inc + eps_fix, fixed_part + zbound if exact or zbound > -np.inf
                            else lbound))
    return finish(c.to_orig(best_choice), bound, path if exact else "time_limit",
                  None if exact else "time_limit")


def _residual(c: _Cols, d: np.ndarray, d_none: np.ndarray, delta: float):
    """Fix options whose shortfall is at least `delta`. Returns None when the
    fixed jobs alone overfill a type (no solution beats the incumbent), else
    (fixed choice, residual jobs, and their options: column (-1 none), option
    pointer per job, type, GPUs, value; residual capacity)."""
    if delta <= 0:
        return None
    keep = d < delta
    none_ok = d_none < delta
    n_opts = np.bincount(c.job[keep], minlength=c.n) + none_ok
    # A job's best option has shortfall 0 < delta, so every job keeps one.
    single = n_opts == 1
    fixed = np.full(c.n, -1, dtype=np.int64)
    kept = np.flatnonzero(keep)
    sj = single[c.job[kept]]
    fixed[c.job[kept[sj]]] = kept[sj]
    rjobs = np.flatnonzero(~single)
    fixed[rjobs] = -1
    rcap = c.cap - c.usage(fixed)
    if (rcap < 0).any():
        return None
    in_r = ~single
    rcols = kept[in_r[c.job[kept]]]
    # Options per residual job: none first (ties prefer it), then its columns.
    nr = np.zeros(c.n, dtype=bool)
    nr[rjobs] = none_ok[rjobs]
    opt_job = np.r_[rjobs[nr[rjobs]], c.job[rcols]]
    opt_col = np.r_[np.full(int(nr.sum()), -1, dtype=np.int64), rcols]
    order = np.lexsort((opt_col, opt_job))
    opt_job, opt_col = opt_job[order], opt_col[order]
    counts = np.bincount(opt_job, minlength=c.n)[rjobs]
    opt_ptr = np.r_[0, np.cumsum(counts)].astype(np.int64)
    on = opt_col >= 0
    opt_typ = np.where(on, c.typ[np.maximum(opt_col, 0)], 0)
    opt_gpus = np.where(on, c.gpus[np.maximum(opt_col, 0)], 0)
    opt_val = np.where(on, c.val[np.maximum(opt_col, 0)], c.none[opt_job])
    return fixed, rjobs, opt_col, opt_ptr, opt_typ, opt_gpus, opt_val, rcap


def _residual_start(inc, rjobs, opt_col, opt_ptr):
    """The incumbent as option indices of the residual jobs, if it only uses
    residual options (otherwise HiGHS finds its own start)."""
    pick = np.zeros(len(rjobs), dtype=np.int64)
    for r, j in enumerate(rjobs.tolist()):
        hit = np.flatnonzero(opt_col[opt_ptr[r]:opt_ptr[r + 1]] == inc[j])
        if not len(hit):
            return None
        pick[r] = hit[0]
    return pick


def solve_reference(problem: ChoiceProblem, solver: str = "GLPK_MI",
                    time_limit: float | None = None) -> ChoiceSolution:
    """The plain ILP in CVXPY, solved by GLPK_MI (the paper's choice) or HIGHS."""
    import cvxpy as cp
    import scipy.sparse as sp

    t0 = time.perf_counter()
    p = problem
    n, m = p.num_jobs, p.num_cols
    if m == 0:
        choice = np.full(n, -1, dtype=np.int64)
        obj = p.objective(choice)
        return ChoiceSolution(choice, obj, obj, "optimal",
                              {"total_s": time.perf_counter() - t0})
    x = cp.Variable(m, boolean=True)
    cols = np.arange(m)
    a_job = sp.csr_matrix((np.ones(m), (p.col_job, cols)), shape=(n, m))
    a_typ = sp.csr_matrix((p.col_gpus.astype(float), (p.col_type, cols)), shape=(p.num_types, m))
    objective = cp.Maximize(p.col_value @ x + p.none_value @ (1 - a_job @ x))
    prob = cp.Problem(objective, [a_job @ x <= 1, a_typ @ x <= p.capacity])
    opts: dict = {}
    if solver == "GLPK_MI":
        if time_limit is not None:
            opts["tm_lim"] = int(time_limit * 1000)
    elif solver == "HIGHS":
        opts["mip_rel_gap"] = 1e-7
        if time_limit is not None:
            opts["time_limit"] = float(time_limit)
    else:
        raise ValueError(f"solver: expected 'GLPK_MI' or 'HIGHS', got {solver!r}")
    prob.solve(solver=solver, **opts)
    if x.value is None:
        raise RuntimeError(f"{solver}: no solution ({prob.status})")
    xv = np.asarray(x.value) > 0.5
    choice = np.full(n, -1, dtype=np.int64)
    sel = np.flatnonzero(xv)
    choice[p.col_job[sel]] = sel
    obj = p.objective(choice)
    status = "optimal" if prob.status == cp.OPTIMAL else str(prob.status)
    return ChoiceSolution(choice, obj, obj if status == "optimal" else math.inf, status,
                          {"total_s": time.perf_counter() - t0, "path": -1.0})
