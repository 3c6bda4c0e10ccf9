"""Side rows of a `ChoiceProblem` (queues: guarantees, borrowing limits, a
restart budget): validation, activity/excess/objective, and the production
`solve` against the CVXPY reference with the same rows on random instances with
queues, plus properties against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from instances import VALUE_MODELS, random_problem
from test_policy_solvers import brute_force, close

from sia_grpc.bench.solver_rows import (
    QueueShape,
    add_rows,
    draw_queues,
    queue_rows,
)
from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.problem import ChoiceProblem
from sia_grpc.policy.solvers import path_name, solve, solve_reference

INF = np.inf


def random_current(rng: np.random.Generator, p: ChoiceProblem,
                   running: float = 0.6) -> np.ndarray:
    """Each job's current column (-1: not running): a share of the jobs run on
    one of their columns, together within the capacities, as running jobs are."""
    counts = np.bincount(p.col_job, minlength=p.num_jobs)
    starts = np.cumsum(counts) - counts
    cur = np.full(p.num_jobs, -1, dtype=np.int64)
    free = p.capacity.astype(np.int64).copy()
    for j in np.flatnonzero((counts > 0) & (rng.random(p.num_jobs) < running)):
        col = int(starts[j] + rng.integers(counts[j]))
        if p.col_gpus[col] <= free[p.col_type[col]]:
            cur[j] = col
            free[p.col_type[col]] -= p.col_gpus[col]
    return cur


def make(jobs: list[list[tuple[int, int, float]]], capacity: list[int],
         none: float | list[float] = -1.0, rows=()) -> ChoiceProblem:
    """A problem from per-job (type, gpus, value) columns and side rows given as
    (columns, coefficients, rhs, penalty)."""
    cols = [(j, t, g, v) for j, cs in enumerate(jobs) for t, g, v in cs]
    arr = np.asarray(cols, dtype=float).reshape(-1, 4)
    nv = np.full(len(jobs), none) if np.isscalar(none) else np.asarray(none, dtype=float)
    p = ChoiceProblem(
        num_jobs=len(jobs), col_job=arr[:, 0].astype(np.int64),
        col_type=arr[:, 1].astype(np.int64), col_gpus=arr[:, 2].astype(np.int64),
        col_value=arr[:, 3], none_value=nv, capacity=np.asarray(capacity, dtype=np.int64))
    rows = [(np.asarray(c, dtype=np.int64), np.asarray(a, dtype=float), b, pen)
            for c, a, b, pen in rows]
    return add_rows(p, rows) if rows else p


def check(p: ChoiceProblem, sol, rel_gap: float = 1e-4) -> None:
    """A feasible answer, its objective and row excess computed right, proven
    within the gap."""
    assert sol.choice.dtype == np.int64 and p.is_feasible(sol.choice)
    assert sol.objective == pytest.approx(p.objective(sol.choice), abs=1e-9)
    assert np.array_equal(sol.row_excess, p.row_excess(sol.choice))
    assert sol.bound >= sol.objective - 1e-12
    assert sol.status == "optimal"
    assert sol.gap <= rel_gap * (1 + 1e-9) + 1e-12


# -- the problem ---------------------------------------------------------------------------


def two_jobs(**rows) -> dict:
    base = dict(num_jobs=2, col_job=np.array([0, 0, 1]), col_type=np.array([0, 1, 0]),
                col_gpus=np.array([2, 4, 1]), col_value=np.array([1.0, 2.0, 0.5]),
                none_value=np.zeros(2), capacity=np.array([4, 4]))
    base.update(row_ptr=np.array([0, 2, 3]), row_col=np.array([0, 2, 1]),
                row_coef=np.array([1.0, 1.0, -4.0]), row_rhs=np.array([1.0, -2.0]),
                row_penalty=np.array([INF, 0.25]))
    base.update(rows)
    return base


@pytest.mark.parametrize(("field", "value"), [
    ("row_ptr", np.array([0, 2])),  # does not end at nnz
    ("row_ptr", np.array([1, 2, 3])),  # does not start at 0
    ("row_ptr", np.array([0, 4, 3])),  # decreasing
    ("row_coef", np.array([1.0, 1.0])),
    ("row_coef", np.array([1.0, np.nan, 1.0])),
    ("row_col", np.array([0, 3, 1])),
    ("row_col", np.array([0, -1, 1])),
    ("row_rhs", np.array([1.0])),
    ("row_rhs", np.array([1.0, np.inf])),
    ("row_penalty", np.array([INF])),
    ("row_penalty", np.array([INF, 0.0])),
    ("row_penalty", np.array([INF, -1.0])),
    ("row_penalty", np.array([INF, np.nan])),
])
def test_bad_rows_name_the_field(field: str, value: np.ndarray) -> None:
    kw = two_jobs(**{field: value})
    with pytest.raises(FieldError) as err:
        ChoiceProblem(**kw)
    assert err.value.field == field


def test_default_has_no_rows() -> None:
    kw = two_jobs()
    for name in ("row_ptr", "row_col", "row_coef", "row_rhs", "row_penalty"):
        del kw[name]
    p = ChoiceProblem(**kw)
    choice = np.array([1, 2])
    assert p.num_rows == 0 and len(p.row_excess(choice)) == 0
    assert p.objective(choice) == 2.5 and p.is_feasible(choice)
    assert len(solve(p).row_excess) == 0


def test_activity_excess_objective_by_hand() -> None:
    p = ChoiceProblem(**two_jobs())
    # Row 0 (hard): x0 + x2 <= 1. Row 1 (soft, 0.25 a unit): -4 x1 <= -2.
    both = np.array([0, 2])
    assert p.row_activity(both).tolist() == [2.0, 0.0]
    assert not p.is_feasible(both)  # the hard row is over
    assert p.row_excess(both).tolist() == [0.0, 2.0]  # hard rows have no excess
    one = np.array([0, -1])
    assert p.is_feasible(one)
    assert p.row_excess(one).tolist() == [0.0, 2.0]
    assert p.objective(one) == pytest.approx(1.0 - 0.25 * 2.0)
    big = np.array([1, 2])
    assert p.row_activity(big).tolist() == [1.0, -4.0] and p.row_excess(big).tolist() == [0, 0]
    assert p.objective(big) == 2.5


def test_repeated_entries_add_up() -> None:
    p = make([[(0, 1, 1.0)]], [4], rows=[([0, 0], [1.0, 1.0], 1.0, INF)])
    assert p.row_activity(np.array([0])).tolist() == [2.0]
    assert not p.is_feasible(np.array([0]))
    assert solve(p).choice.tolist() == [-1]
    assert solve_reference(p, "HIGHS").choice.tolist() == [-1]


# -- hand-checkable solves -------------------------------------------------------------------


def test_guarantee_moves_gpus_to_a_queue_below_it() -> None:
    # Two jobs want the only 4 GPUs; job 1 is worth less, but its queue is
    # guaranteed 4 (soft, 1.0 per GPU short): the guarantee wins.
    p = make([[(0, 4, 3.0)], [(0, 4, 1.0)]], [4], none=0.0,
             rows=[([1], [-4.0], -4.0, 1.0)])
    for sol in (solve(p), solve_reference(p, "HIGHS"), solve_reference(p, "GLPK_MI")):
        assert sol.choice.tolist() == [-1, 1] and sol.objective == pytest.approx(1.0)
    check(p, solve(p))


def test_soft_row_gives_way_when_cheaper() -> None:
    # The same, with a penalty of 0.1 per GPU short: 3.0 - 0.4 beats 1.0.
    p = make([[(0, 4, 3.0)], [(0, 4, 1.0)]], [4], none=0.0,
             rows=[([1], [-4.0], -4.0, 0.1)])
    sol = solve(p)
    check(p, sol)
    assert sol.choice.tolist() == [0, -1] and sol.objective == pytest.approx(2.6)
    assert sol.row_excess.tolist() == [4.0]


def test_borrowing_limit_is_hard() -> None:
    # A queue of two jobs may hold at most 4 GPUs although 8 are free.
    p = make([[(0, 4, 2.0)], [(0, 4, 2.0)], [(0, 4, 0.5)]], [8], none=0.0,
             rows=[([0, 1], [4.0, 4.0], 4.0, INF)])
    sol = solve(p)
    check(p, sol)
    assert sol.objective == pytest.approx(2.5) and sol.choice[2] == 2


def test_restart_budget() -> None:
    # Three running jobs (column 0 of each: stay); moving to column 1 is worth
    # more, but at most one may leave its column.
    jobs = [[(0, 1, 1.0), (0, 2, 2.0 + k)] for k in range(3)]
    stay = [0, 2, 4]
    p = make(jobs, [8], none=0.0, rows=[(stay, [-1.0] * 3, 1.0 - 3.0, INF)])
    sol = solve(p)
    check(p, sol)
    assert sol.choice.tolist() == [0, 2, 5] and sol.objective == pytest.approx(6.0)


def test_infeasible_hard_rows_raise_the_same_typed_error() -> None:
    # Job 0 must run (a hard >= row) but its only column does not fit.
    p = make([[(0, 8, 1.0)], [(0, 1, 1.0)]], [4], rows=[([0], [-1.0], -1.0, INF)])
    for run in (solve, lambda q: solve_reference(q, "HIGHS")):
        with pytest.raises(FieldError) as err:
            run(p)
        assert err.value.field == "row_rhs"
    # Nothing fits at all, and none breaks a hard row.
    q = make([[]], [4], rows=[([], [], -1.0, INF)])
    for run in (solve, lambda q: solve_reference(q, "HIGHS")):
        with pytest.raises(FieldError):
            run(q)


def test_rows_that_never_bind_change_nothing() -> None:
    rng = np.random.default_rng(3)
    p = random_problem(rng, 40, {"a": 16, "b": 8})
    loose = add_rows(p, [(np.arange(p.num_cols), p.col_gpus.astype(float), 1e6, INF),
                         (np.arange(p.num_cols), -p.col_gpus.astype(float), 0.0, 1.0)])
    a, b = solve(p, rel_gap=1e-9), solve(loose, rel_gap=1e-9)
    check(loose, b, 1e-9)
    assert b.objective == pytest.approx(a.objective, abs=1e-9)


# -- random instances with queues against the reference --------------------------------------


def queue_case(seed: int) -> ChoiceProblem:
    """A random Sia-shaped instance with queues: per-type guarantees (soft ≥
    rows), borrowing limits, type-flexible guarantees (soft ≥ rows) and a
    restart budget. Odd seeds build the rows as the policy does (borrowing soft
    at a large penalty, the budget over the running jobs' current columns);
    even seeds with hard borrowing limits and a budget on moves. Both keep
    nothing-changes-for-the-running-jobs feasible."""
    rng = np.random.default_rng(seed)
    num_jobs = int(rng.integers(2, 45))
    types = {f"t{k}": int(rng.choice([4, 8, 16, 24, 32])) for k in range(int(rng.integers(1, 4)))}
    model = VALUE_MODELS[seed % len(VALUE_MODELS)]
    if model == "ties":  # symmetric instances make GLPK's branch and bound crawl
        num_jobs = min(num_jobs, 12)
    p = random_problem(rng, num_jobs, types, value_model=model,
                       cols_per_job=(int(rng.integers(1, 3)), int(rng.integers(3, 16))))
    policy_like = seed % 2 == 1
    shape = QueueShape(num_queues=int(rng.integers(1, 6)), proportional=bool(rng.random() < 0.5),
                       guarantee_penalty=float(rng.choice([0.05, 0.5, 3.0])),
                       units_penalty=float(rng.choice([0.05, 0.5])),
                       borrow_penalty=5.0 if policy_like else INF,
                       restart_share=float(rng.uniform(0.0, 0.3)))
    qs = draw_queues(rng, num_jobs, p.capacity, shape)
    return queue_rows(p, qs, random_current(rng, p), count_preemptions=policy_like)


@pytest.mark.parametrize("seed", range(120))
def test_queue_instances_agree_with_the_reference(seed: int) -> None:
    p = queue_case(seed)
    assert p.num_rows > 0
    ours = solve(p)
    exact = solve(p, rel_gap=1e-9)
    highs = solve_reference(p, "HIGHS")
    check(p, ours)
    check(p, exact, 1e-9)
    assert p.is_feasible(highs.choice) and highs.status == "optimal"
    assert close(ours.objective, highs.objective, 1e-4)
    assert close(exact.objective, highs.objective, 1e-7)
    assert ours.bound >= highs.objective - 1e-7  # the bound is a bound
    if seed % 4 == 0:  # the paper's solver too, on a share (it is slow)
        glpk = solve_reference(p, "GLPK_MI")
        assert glpk.status == "optimal" and close(glpk.objective, highs.objective, 1e-7)


@pytest.mark.parametrize("seed", range(40))
def test_side_row_price_hints_only_change_the_time(seed: int) -> None:
    """Prices for every coupling row (`solve(..., prices=)`, capacities then side
    rows) bound the penalised optimum whatever they are: with the answer's own,
    perturbed or nonsense ones the answer is within the gap of the reference, and
    its prices have one entry per coupling row."""
    p = queue_case(seed)
    highs = solve_reference(p, "HIGHS")
    base = solve(p)
    K = len(p.capacity) + p.num_rows
    assert len(base.prices) == K and np.all(base.prices >= 0)
    rng = np.random.default_rng(seed)
    for hint in (base.prices, base.prices * (1 + 0.01 * rng.standard_normal(K)),
                 rng.exponential(1.0, K), np.zeros(K)):
        sol = solve(p, prices=np.maximum(hint, 0.0), start=base.choice)
        check(p, sol)
        assert close(sol.objective, highs.objective, 1e-4)
        assert sol.bound >= highs.objective - 1e-7
        assert len(sol.prices) == K


def test_side_row_prices_that_prove_the_start_spare_the_lp() -> None:
    """Where Dantzig-Wolfe proved an answer, its prices prove it again at once: no
    iteration, the same answer (and a hint of the wrong length is ignored)."""
    proved = []
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        p = random_problem(rng, 400, {"a": 128, "b": 64, "c": 32})
        q = queue_rows(p, draw_queues(rng, p.num_jobs, p.capacity, QueueShape(num_queues=8)),
                       random_current(rng, p))
        base = solve(q)
        if base.stats["dw_iters"] > 0 and path_name(base.stats) == "lagrangian":
            proved.append((q, base))
    assert proved
    for q, base in proved:
        again = solve(q, prices=base.prices, start=base.choice)
        assert again.stats["hinted"] == 1.0 and again.stats["dw_iters"] == 0.0
        assert np.array_equal(again.choice, base.choice)
        short = solve(q, prices=base.prices[:len(q.capacity)], start=base.choice)
        assert short.stats["hinted"] == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_larger_queue_instances_are_proven(seed: int) -> None:
    # Dantzig-Wolfe with a block per queue, then the MIP on what is left.
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, 400, {"a": 128, "b": 64, "c": 32})
    shape = QueueShape(num_queues=8, proportional=seed % 2 == 0,
                       borrow_penalty=INF if seed < 2 else 5.0)
    q = queue_rows(p, draw_queues(rng, p.num_jobs, p.capacity, shape), random_current(rng, p),
                   count_preemptions=seed >= 2)
    sol = solve(q)
    check(q, sol)
    ref = solve_reference(q, "HIGHS")
    assert close(sol.objective, ref.objective, 1e-4) and sol.bound >= ref.objective - 1e-7
    assert path_name(sol.stats) in ("lagrangian", "mip")


# -- properties ------------------------------------------------------------------------------


@st.composite
def problems_with_rows(draw):
    num_types = draw(st.integers(1, 3))
    capacity = draw(st.lists(st.integers(0, 10), min_size=num_types, max_size=num_types))
    num_jobs = draw(st.integers(0, 6))
    jobs = []
    for _ in range(num_jobs):
        k = draw(st.integers(0, 3))
        jobs.append([(draw(st.integers(0, num_types - 1)), draw(st.integers(1, 6)),
                      draw(st.floats(-2.0, 1.0, allow_nan=False))) for _ in range(k)])
    none = [draw(st.floats(-1.5, 0.0, allow_nan=False)) for _ in range(num_jobs)]
    n_cols = sum(len(j) for j in jobs)
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        cols = draw(st.lists(st.integers(0, n_cols - 1), max_size=5)) if n_cols else []
        coefs = [draw(st.sampled_from([-4.0, -2.0, -1.0, 1.0, 2.0, 3.0])) for _ in cols]
        rhs = draw(st.sampled_from([-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 5.0]))
        pen = draw(st.sampled_from([INF, INF, 0.1, 0.5, 2.0]))
        rows.append((cols, coefs, rhs, pen))
    p = make(jobs, capacity, none, rows)
    start = np.asarray([draw(st.integers(-1, max(-1, p.num_cols - 1)))
                        for _ in range(num_jobs)], dtype=np.int64)
    return p, start


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_with_rows())
def test_property_feasible_optimal_excess_right(case) -> None:
    p, start = case
    exact = brute_force(p, limit=5e3)
    if exact == -np.inf:  # no choice keeps the hard rows
        with pytest.raises(FieldError):
            solve(p, start=start)
        return
    sol = solve(p, rel_gap=1e-9, start=start)
    assert p.is_feasible(sol.choice)
    assert sol.bound >= sol.objective - 1e-12
    # The excess: max(0, A·x − rhs) on soft rows, 0 on hard ones, and the
    # objective pays each soft row's penalty on it.
    act = p.row_activity(sol.choice)
    assert np.allclose(sol.row_excess, np.where(p.soft, np.maximum(0.0, act - p.row_rhs), 0.0))
    assert np.all(sol.row_excess >= 0)
    plain = p.objective(sol.choice) + float(np.where(p.soft, p.row_penalty, 0.0)
                                            @ sol.row_excess)
    chosen = sol.choice >= 0
    assert plain == pytest.approx(float(p.none_value[~chosen].sum()
                                        + p.col_value[sol.choice[chosen]].sum()), abs=1e-9)
    assert sol.objective == pytest.approx(p.objective(sol.choice), abs=1e-9)
    if p.is_feasible(start):
        assert sol.objective >= p.objective(start) - 1e-9
    assert exact is None or sol.objective == pytest.approx(exact, abs=1e-7)


def test_a_row_over_most_jobs_does_not_melt_the_queues_into_one_block() -> None:
    # Four queues' guarantee rows and a restart budget over every job's current
    # column (a few of all columns): the budget stays a coupling row of the
    # master, each queue is its own block (one block for everything made
    # Dantzig-Wolfe ~8x slower at policy size).
    from sia_grpc.policy.solvers._columns import _reduce
    from sia_grpc.policy.solvers._lagrangian import _blocks

    rng = np.random.default_rng(0)
    p = random_problem(rng, 80, {"a": 32})
    queue = np.arange(p.num_jobs) % 4
    cols = np.arange(p.num_cols)
    rows = [(cols[queue[p.col_job] == q], -p.col_gpus[queue[p.col_job] == q].astype(float),
             -4.0, 1.0) for q in range(4)]
    current = np.unique(p.col_job, return_index=True)[1]
    rows.append((current, -np.ones(len(current)), -10.0, INF))
    c = _reduce(add_rows(p, rows))
    block = _blocks(c)
    assert len(np.unique(block)) == 4
    assert all(len(np.unique(queue[block == b])) == 1 for b in np.unique(block))


def test_time_limit_with_rows_returns_a_feasible_answer_and_a_bound() -> None:
    rng = np.random.default_rng(7)
    p = random_problem(rng, 300, {"a": 96, "b": 48})
    current = random_current(rng, p)
    q = queue_rows(p, draw_queues(rng, p.num_jobs, p.capacity, QueueShape(num_queues=6)),
                   current, count_preemptions=True)
    assert q.is_feasible(current)  # the running jobs as they are: the round's start
    sol = solve(q, time_limit=1e-4, start=current)
    assert q.is_feasible(sol.choice) and sol.objective >= q.objective(current) - 1e-9
    assert sol.objective == pytest.approx(q.objective(sol.choice), abs=1e-9)
    assert sol.bound >= solve_reference(q, "HIGHS").objective - 1e-7


def test_an_empty_residual_mip_picks_nothing():
    """Regression: reduced-cost fixing may leave the MIP no job at all (the growth
    stage with side rows, `sia simulate philly/workload-1 --policy sia-partitioned
    --queues ...`): its answer is an empty pick, not an IndexError."""
    from sia_grpc.policy.solvers._columns import _Opts
    from sia_grpc.policy.solvers._highs import _pick

    empty = np.zeros(0, dtype=np.int64)
    o = _Opts(jobs=empty, col=empty, ptr=np.zeros(1, dtype=np.int64), typ=empty, gpus=empty,
              val=np.zeros(0))
    assert len(_pick(o, np.zeros(0), True)) == 0
    assert len(_pick(o, np.zeros(0), False)) == 0
