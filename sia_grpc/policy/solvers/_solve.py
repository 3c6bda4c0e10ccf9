"""The production solver for `ChoiceProblem`.

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
   with Wentges smoothing. Prices the caller gives (a like problem's, e.g. the
   last round's) come first: if their L(λ) proves an incumbent, no LP is solved;
   otherwise column generation starts its stability centre there.
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

With side rows (`ChoiceProblem.row_ptr`...: queues' guarantees, borrowing
limits, a restart budget) the same steps run over every coupling row, and a
problem without them takes exactly the path above:

3'. Prices for all coupling rows: capacities, then side rows (a soft row's
   price at most its penalty: beyond it, paying for the excess is cheaper; a
   ≥ row's price rewards its columns). L(λ) adds λ_r·rhs_r over the side rows.
   Dantzig-Wolfe with one convexity row per block of jobs (`_blocks`: the jobs
   that share a queue's rows), so the master mixes the queues' proposals;
   it stops once its bound proves the start or is within a twentieth of the gap.
   Prices given (one per coupling row) that prove the start spare the LP, as in
   3; otherwise they are Dantzig-Wolfe's first stability centre.
4'. Incumbents that keep the hard rows: the start, none, and the master's
   primal rounded by a small MIP (the jobs it splits and the nearest-tied ones
   reopened, everything else fixed); if the gap is still open, each job's
   leanest best at λ moved one job at a time into the hard rows
   (`_repair_rows`) and greedily improved with the penalties (`_fill_rows`).
5'. Reduced-cost fixing as in 5 (it holds for every λ within the price limits).
6'. HiGHS MIP on what is left, with the side rows (each soft one with a slack
   that pays its penalty) over the right-hand sides the fixed jobs leave; the DP
   knows only capacities. Hard rows that no choice keeps raise `FieldError`
   naming `row_rhs`.

Everything is local to the call (no module state), so calls are reentrant and
can run in threads or a process pool.

The steps live in the package's private modules: reductions and pricing in
`_columns`, prices and reduced-cost fixing in `_lagrangian` (HiGHS calls in
`_highs`), incumbents in `_heuristics`, the DP in `_exact`.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.problem import ChoiceProblem, ChoiceSolution
from sia_grpc.policy.solvers._columns import _argmax, _Cols, _price, _reduce
from sia_grpc.policy.solvers._exact import _dp
from sia_grpc.policy.solvers._heuristics import (
    _fill,
    _fill_rows,
    _repair,
    _repair_rows,
    _round_master,
    _round_tied,
    _shift,
)
from sia_grpc.policy.solvers._highs import _lp, _mip
from sia_grpc.policy.solvers._lagrangian import (
    Centre,
    _blocks,
    _lagrangian,
    _price_caps,
    _residual,
    _residual_start,
)

# stats["path"] holds the index of the path taken in PATHS (stats are floats).
PATHS = ("empty", "fits", "lagrangian", "dp", "mip", "time_limit")

_DP_WORK = 2.5e7  # state-option updates the DP may do before HiGHS MIP is used instead
_DIRECT_LP = 3000  # columns + jobs up to which HiGHS simplex beats column generation
# Options tied at prices given (a round old) are those within this many `tie`s (1e-9 of
# the largest value, so 0.1 %) of their job's best: stale prices move reduced values
# by about that much. `_hinted` and `solve_separable` round the LP over them.
STALE_TIE = 1e6


# What the incumbents' search ends with: (the incumbent, None if none was found, in
# reduced columns; the prices λ; reduced values; each job's best at λ).
_Priced = tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]


def path_name(stats: dict[str, float]) -> str:
    """The name of the path `solve` took, from its stats."""
    return PATHS[int(stats["path"])]


def _eps(inc: float, bound: float, rel_gap: float) -> float:
    """An absolute gap that is within rel_gap of every objective in [inc, bound]."""
    lo, hi = min(inc, bound), max(inc, bound)
    return rel_gap * max(1.0, 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)))


def _choice_vector(p: ChoiceProblem, start: npt.ArrayLike | None) -> np.ndarray | None:
    """`start` as an int64 choice vector (-1 or a column of the job's own per job)
    if it is one, else None; it may not fit."""
    if start is None:
        return None
    s = np.asarray(start)
    if s.shape != (p.num_jobs,) or not (np.issubdtype(s.dtype, np.integer)
                                       or np.issubdtype(s.dtype, np.floating)):
        return None
    if not np.all(np.isfinite(s)) or np.any(s != np.round(s)) or np.any(s < -1) \
            or np.any(s >= p.num_cols):
        return None
    s = s.astype(np.int64)
    on = np.flatnonzero(s >= 0)
    return None if np.any(p.col_job[s[on]] != on) else s


def _start_choice(p: ChoiceProblem, start: npt.ArrayLike | None) -> np.ndarray | None:
    """`start` as an int64 choice vector if it is a feasible one, else None."""
    s = _choice_vector(p, start)
    return s if s is not None and p.is_feasible(s) else None


def _reduced_choice(p: ChoiceProblem, c: _Cols, choice: np.ndarray) -> np.ndarray:
    """A choice of `p`'s columns in `c`'s reduced ones: a column dropped (dominated,
    or no better than none) maps to none."""
    pos = np.full(p.num_cols, -1, dtype=np.int64)
    pos[c.orig] = np.arange(c.m)
    return np.where(choice >= 0, pos[np.maximum(choice, 0)], -1)


class _Finish:
    """How `solve` ends: a choice (original columns) with its bound and path as the
    `ChoiceSolution`, the start taken instead where it is as good; `prices`: the
    coupling rows' prices it carries (set once they are known)."""

    def __init__(self, p: ChoiceProblem, s0: np.ndarray | None, rel_gap: float,
                 stats: dict[str, float], t0: float) -> None:
        self.p, self.s0, self.rel_gap, self.stats, self.t0 = p, s0, rel_gap, stats, t0
        self.prices = np.zeros(len(p.capacity) + p.num_rows)

    def __call__(self, choice_orig: np.ndarray, bound: float, path: str,
                 status: str | None = None) -> ChoiceSolution:
        p, s0, stats = self.p, self.s0, self.stats
        if not p.is_feasible(choice_orig):  # a bug, not a property of the input
            raise RuntimeError("solve: internal error, infeasible choice")
        obj = p.objective(choice_orig)
        # The start wins ties: an equally good answer should not move jobs.
        if s0 is not None and p.objective(s0) >= obj - 1e-12 * max(1.0, abs(obj)):
            choice_orig, obj = s0, p.objective(s0)
        bound = max(bound, obj)
        if status is None:
            ok = bound - obj <= self.rel_gap * max(1.0, abs(obj)) * (1 + 1e-9) + 1e-12
            status = "optimal" if ok else "time_limit"
        if status != "optimal":
            path = "time_limit"
        stats["path"] = float(PATHS.index(path))
        stats["total_s"] = time.perf_counter() - self.t0
        return ChoiceSolution(choice=np.asarray(choice_orig, dtype=np.int64), objective=obj,
                              bound=bound, status=status, stats=stats,
                              row_excess=p.row_excess(choice_orig), prices=self.prices)


def solve(problem: ChoiceProblem, *, time_limit: float = 30.0, rel_gap: float = 1e-4,
          start: np.ndarray | None = None, prices: np.ndarray | None = None) -> ChoiceSolution:
    """Best choice within `rel_gap` (relative to max(1, |objective|)) or the best
    found when `time_limit` (seconds) runs out. `start`: a candidate choice (e.g.
    the previous round's); ignored unless feasible, never beaten by the answer.
    `prices`: coupling-row prices to try first, capacities then side rows (e.g.
    the previous round's `ChoiceSolution.prices`): if their bound L(λ) proves an
    incumbent within the gap, no LP is solved. Only the time depends on them; the
    answer is within `rel_gap` either way."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    stats: dict[str, float] = {"lp_s": 0.0, "mip_s": 0.0, "dw_iters": 0.0, "fractional_jobs": 0.0,
                               "residual_jobs": 0.0, "residual_cols": 0.0, "start_used": 0.0}
    p = problem
    c = _reduce(p)
    stats["reduced_cols"] = float(c.m)
    s0 = _start_choice(p, start)
    stats["start_used"] = float(s0 is not None)
    hint = _hint_prices(p, prices)
    finish = _Finish(p, s0, rel_gap, stats, t0)
    if c.m == 0:
        none = np.full(p.num_jobs, -1, dtype=np.int64)
        _check_feasible(p, none)
        return finish(none, p.objective(none), "empty")
    rc0, best0 = _price(c, np.zeros(c.T))
    greedy = _argmax(c, rc0, best0)
    if c.feasible(greedy) and c.score(greedy) == c.value(greedy):  # no soft row exceeded
        return finish(c.to_orig(greedy), float(best0.sum()), "fits")

    # A start in reduced indices (a column dropped as dominated or as no better
    # than none maps to none, which keeps it feasible: such a column is in no
    # side row, or only with coefficients >= 0; `finish` still compares against
    # the original).
    s_red = None if s0 is None else _reduced_choice(p, c, s0)
    scale = max(1.0, abs(float(best0.sum())), abs(float(c.none.sum())))
    t_lp = time.perf_counter()
    inc_red: np.ndarray | None
    if c.side is None:
        inc_red, lam, rc, best = _incumbents(c, s_red, deadline, rel_gap, scale, stats, t_lp,
                                             hint)
    else:
        inc_red, lam, rc, best = _incumbents_rows(c, s_red, deadline, rel_gap, scale, stats,
                                                  t_lp, hint)
    finish.prices = np.asarray(lam, dtype=np.float64)
    lbound = stats["lp_bound"]
    # Without an incumbent (hard side rows that the heuristics could not keep)
    # the MIP below searches everything.
    found = inc_red is not None
    inc = c.score(inc_red) if inc_red is not None else -np.inf
    eps = _eps(inc, lbound, rel_gap) if found else 0.0
    stats["incumbent"] = inc
    if inc_red is not None and lbound - inc <= eps:
        return finish(c.to_orig(inc_red), lbound, "lagrangian")
    if inc_red is not None and time.perf_counter() > deadline:
        return finish(c.to_orig(inc_red), lbound, "time_limit", "time_limit")
    return _fix_and_solve(p, c, finish, inc_red, inc, eps, lbound, rc, best, rel_gap,
                          deadline)


def _fix_and_solve(p: ChoiceProblem, c: _Cols, finish: _Finish, inc_red: np.ndarray | None,
                   inc: float, eps: float, lbound: float, rc: np.ndarray, best: np.ndarray,
                   rel_gap: float, deadline: float) -> ChoiceSolution:
    """Steps 5 and 6: reduced-cost fixing against the incumbent `inc_red` (value
    `inc`; None: none found) at the prices behind `rc`, `best` and the bound
    `lbound`, then an exact solve of what is left."""
    stats = finish.stats
    found = inc_red is not None
    t_mip = time.perf_counter()
    d = best[c.job] - rc  # shortfall of each column from its job's best at λ
    d_none = best - c.none
    # Reduced-cost fixing, then an exact solve of what is left: a DP that proves
    # the optimum itself when that is cheap, else a DP within eps, else HiGHS
    # MIP with half of eps left for its own gap. With side rows only the MIP
    # (the DP knows the capacities alone).
    pick = None
    tiny = 1e-12 * max(1.0, abs(inc)) if found else 0.0
    methods = [("dp", tiny, 0.2 * _DP_WORK), ("dp", eps, _DP_WORK)] if c.side is None else []
    for method, eps_fix, work in [*methods, ("mip", 0.5 * eps, 0.0)]:
        res = _residual(c, d, d_none, lbound - inc - eps_fix)
        if res is None:  # nothing can beat the incumbent by more than eps_fix
            stats["mip_s"] = time.perf_counter() - t_mip
            assert inc_red is not None  # (without one the margin is infinite: no fixing)
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
            srhs = None if c.side is None else c.side.rhs - c.side.activity(fixed)
            pick, _, zbound, exact = _mip(o, rcap, fixed_part, deadline - time.perf_counter(),
                                          0.5 * eps, rel_gap,
                                          _residual_start(inc_red, o)
                                          if inc_red is not None else None,
                                          c.side, srhs)
    stats["mip_s"] = time.perf_counter() - t_mip

    best_choice, best_val = inc_red, inc
    if pick is not None:
        cand = fixed.copy()
        cand[o.jobs] = o.choice(pick)
        if c.feasible(cand) and c.score(cand) > best_val:
            best_choice, best_val = cand, c.score(cand)
    if best_choice is None:
        if exact:
            _check_feasible(p, None)
        raise TimeoutError("solve: no choice within the hard side rows found in time")
    # A solution better than inc + eps_fix respects the fixing, so the optimum
    # is at most max(inc + eps_fix, the residual's bound).
    bound = min(lbound, max(inc + eps_fix, zbound))
    return finish(c.to_orig(best_choice), bound, path if exact else "time_limit",
                  None if exact else "time_limit")


def _hint_prices(p: ChoiceProblem, prices: npt.ArrayLike | None) -> np.ndarray | None:
    """`prices` as coupling-row prices if they are usable ones (one finite λ ≥ 0
    per type and then per side row), else None."""
    if prices is None:
        return None
    lam = np.asarray(prices, dtype=np.float64)
    if lam.shape != (len(p.capacity) + p.num_rows,) or not np.all(np.isfinite(lam)) \
            or np.any(lam < 0):
        return None
    return lam


def _check_feasible(p: ChoiceProblem, choice: np.ndarray | None) -> None:
    """The typed error for hard side rows that no choice keeps (`choice`: the
    only candidate; None: proven infeasible)."""
    if choice is None or not p.is_feasible(choice):
        raise FieldError("row_rhs", "no choice keeps every hard side row")


def _incumbents(c: _Cols, s_red: np.ndarray | None, deadline: float, rel_gap: float,
                scale: float, stats: dict[str, float], t_lp: float,
                hint: np.ndarray | None = None) -> _Priced:
    """Capacity prices λ and the best incumbent the heuristics find: returns
    (incumbent, λ, reduced values, each job's best at λ); L(λ) and timings go
    into `stats`. Prices `hint` that prove an incumbent are taken as they are.
    Small problems: HiGHS simplex on the whole LP is quicker than column
    generation, and its basic optimum splits at most #types jobs. Large ones:
    Dantzig-Wolfe."""
    cands = [] if s_red is None else [_fill(c, s_red)]
    tie = 1e-9 * max(1.0, float(np.abs(c.val).max()), float(np.abs(c.none).max()))
    stats["hinted"] = 0.0
    direct_lp = c.m + c.n <= _DIRECT_LP
    # Prices given are tried only where the LP would be column generation: where HiGHS
    # simplex solves it whole it is cheaper than the pricing pass and tied LP they
    # need when they do not prove an incumbent (the simulator's 64-GPU rounds: policy
    # time p50 8.8 -> 10.4 ms with them).
    centre = None
    if hint is not None and not direct_lp:
        proven, centre = _hinted(c, hint, cands, rel_gap, tie)
        if proven is not None:
            stats.update(hinted=1.0, direct_lp=0.0, lp_s=time.perf_counter() - t_lp,
                         fractional_jobs=0.0, lp_bound=centre[1], heuristic_s=0.0)
            return proven, hint, centre[2], centre[3]
    direct = (_lp(c, np.arange(c.n), np.ones(c.m, dtype=bool), c.cap, False)
              if direct_lp else None)
    if direct is not None:
        lam, rounded, frac = direct
        rc, best = _price(c, lam)
        lbound = float(best.sum() + lam @ c.cap)
        cands.append(_fill(c, _repair(c, rounded), lam))
    else:
        # (prices given that `_hinted` did not prove with: Dantzig-Wolfe starts there)
        lam, lbound, rc, best, _, iters, frac, _ = _lagrangian(c, deadline, 1e-9 * scale,
                                                               cands[:1], centre=centre)
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
    return inc_red, lam, rc, best


def _hinted(c: _Cols, lam: np.ndarray, cands: list[np.ndarray], rel_gap: float, tie: float,
            ) -> tuple[np.ndarray | None, Centre]:
    """Prices given (a like problem's, e.g. the last round's): (incumbent, λ, L(λ),
    reduced values, each job's best), the incumbent None where L(λ) proves none
    within the gap (the incumbents tried join `cands`). L(λ) bounds the optimum
    for any λ ≥ 0, so the answer is as exact as the LP path's; the LP is spared.
    Incumbents: each job's best at λ, repaired and filled, and the LP over the
    options within 0.1 % of the largest value of their job's best (prices a round
    old move reduced values by about that much), rounded and filled."""
    rc, best = _price(c, lam)
    lbound = float(best.sum() + lam @ c.cap)

    def proven() -> np.ndarray | None:
        inc = max(cands, key=c.value)
        return inc if lbound - c.value(inc) <= _eps(c.value(inc), lbound, rel_gap) else None

    cands.append(_fill(c, _repair(c, _argmax(c, rc, best, tie)), lam))
    inc = proven()
    if inc is None:  # (the LP over the tied options only when the cheap ones fall short)
        tied = _round_tied(c, rc, best, STALE_TIE * tie)
        if tied is not None:
            cands.append(_fill(c, tied, lam))
            inc = proven()
    return inc, (lam, lbound, rc, best)


def _incumbents_rows(c: _Cols, s_red: np.ndarray | None, deadline: float, rel_gap: float,
                     scale: float, stats: dict[str, float], t_lp: float,
                     hint: np.ndarray | None = None) -> _Priced:
    """`_incumbents` with side rows: prices for every coupling row by
    Dantzig-Wolfe with a block of jobs per queue (`_blocks`), and incumbents
    that keep the hard rows: the start, none, the master's primal rounded by a
    small MIP; if those leave the gap open, each job's leanest best at the
    prices, repaired and filled. The incumbent is None when all of them fail.
    Prices `hint` (a like problem's, one per coupling row) that prove the best
    of the start and none are taken as they are; otherwise Dantzig-Wolfe starts
    its stability centre there."""
    none = np.full(c.n, -1, dtype=np.int64)
    cands = [s for s in (s_red, none) if s is not None and c.feasible(s)]
    inc0 = max(c.score(s) for s in cands) if cands else -np.inf

    def proves(bound: float, inc: float = inc0) -> bool:
        return bound - inc <= _eps(inc, bound, rel_gap)

    stats["hinted"] = 0.0
    centre: Centre | None = None
    if hint is not None:
        # (L(λ) bounds the penalised optimum for every λ within the price limits)
        lam = np.minimum(hint, _price_caps(c))
        rc, best = _price(c, lam)
        lbound = float(best.sum() + lam @ c.rhs)
        if cands and proves(lbound):
            stats.update(hinted=1.0, dw_iters=0.0, direct_lp=0.0, fractional_jobs=0.0,
                         lp_s=time.perf_counter() - t_lp, lp_bound=lbound, heuristic_s=0.0)
            return max(cands, key=c.score), lam, rc, best
        centre = (lam, lbound, rc, best)
    # The bound need only be as tight as the gap: Dantzig-Wolfe stops once it
    # proves the start, or is within a twentieth of the gap of its master.
    lam, lbound, rc, best, _, iters, frac, primal = _lagrangian(
        c, deadline, max(1e-9, 0.05 * rel_gap) * scale, cands[:1], _blocks(c), proves, centre)
    stats.update(dw_iters=float(iters), direct_lp=0.0, lp_s=time.perf_counter() - t_lp,
                 fractional_jobs=float(frac), lp_bound=lbound)
    t_inc = time.perf_counter()
    if not proves(lbound):
        # The MIP need only come within the gap of the bound, not prove its optimum.
        rounded = _round_master(c, primal, rc, best, deadline - t_inc,
                                0.25 * _eps(lbound, lbound, rel_gap), 0.0)
        if rounded is not None:
            cands.append(rounded)
    inc = max(cands, key=c.score) if cands else None
    if inc is None or not proves(lbound, c.score(inc)):
        tie = 1e-9 * max(1.0, float(np.abs(c.val).max()), float(np.abs(c.none).max()))
        for choice in (_argmax(c, rc, best, tie), inc):
            fixed = None if choice is None else _repair_rows(c, choice, rc)
            if fixed is not None:
                cands.append(_fill_rows(c, fixed))
        inc = max(cands, key=c.score) if cands else None
    stats["heuristic_s"] = time.perf_counter() - t_inc
    return inc, lam, rc, best
