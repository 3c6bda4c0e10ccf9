"""The ChoiceProblem solvers: the production path (`solve`) against the CVXPY
references (GLPK_MI, HiGHS) and brute force, hand-checkable cases, the start
vector, and properties over generated instances."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from instances import (
    DEGENERATE_KINDS,
    VALUE_MODELS,
    bench_problem,
    degenerate_problem,
    paper_types,
    random_problem,
)

from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.problem import ChoiceProblem
from sia_grpc.policy.solvers import _solve as solve_module  # owns _DP_WORK, read by solve
from sia_grpc.policy.solvers import path_name, solve, solve_reference, solve_separable


def make(jobs: list[list[tuple[int, int, float]]], capacity: list[int],
         none: float | list[float] = -1.0) -> ChoiceProblem:
    """A problem from per-job (type, gpus, value) columns."""
    cols = [(j, t, g, v) for j, cs in enumerate(jobs) for t, g, v in cs]
    arr = np.asarray(cols, dtype=float).reshape(-1, 4)
    nv = np.full(len(jobs), none) if np.isscalar(none) else np.asarray(none, dtype=float)
    return ChoiceProblem(
        num_jobs=len(jobs), col_job=arr[:, 0].astype(np.int64),
        col_type=arr[:, 1].astype(np.int64), col_gpus=arr[:, 2].astype(np.int64),
        col_value=arr[:, 3], none_value=nv, capacity=np.asarray(capacity, dtype=np.int64))


def brute_force(p: ChoiceProblem, limit: float = 2e4) -> float | None:
    """The optimum by enumeration (-inf: nothing keeps the hard side rows), or None
    when there are more than `limit` choices."""
    per_job = [[-1, *np.flatnonzero(p.col_job == j).tolist()] for j in range(p.num_jobs)]
    if np.prod([len(o) for o in per_job], dtype=float) > limit:
        return None
    best = -np.inf
    for combo in itertools.product(*per_job):
        choice = np.asarray(combo, dtype=np.int64)
        if p.is_feasible(choice):
            best = max(best, p.objective(choice))
    return best


def close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(b)) + 1e-9


def check(p: ChoiceProblem, sol, rel_gap: float = 1e-4) -> None:
    assert sol.choice.dtype == np.int64 and p.is_feasible(sol.choice)
    assert sol.objective == pytest.approx(p.objective(sol.choice), abs=1e-12)
    assert sol.bound >= sol.objective - 1e-12
    assert sol.status == "optimal"
    assert sol.gap <= rel_gap * (1 + 1e-9) + 1e-12


def random_case(seed: int) -> ChoiceProblem:
    rng = np.random.default_rng(seed)
    num_jobs = int(rng.integers(1, 61))
    types = {f"t{k}": int(rng.choice([0, 4, 8, 16, 24, 32]))
             for k in range(int(rng.integers(1, 5)))}
    model = VALUE_MODELS[seed % len(VALUE_MODELS)]
    if model == "ties":  # symmetric instances make GLPK's branch and bound crawl
        num_jobs = min(num_jobs, 12)
    return random_problem(rng, num_jobs, types, value_model=model,
                          cols_per_job=(int(rng.integers(0, 3)), int(rng.integers(3, 25))))


# -- against the references ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(120))
def test_agrees_with_references(seed: int) -> None:
    p = random_case(seed)
    ours = solve(p)
    exact = solve(p, rel_gap=1e-9)
    glpk = solve_reference(p, "GLPK_MI")
    highs = solve_reference(p, "HIGHS")
    check(p, ours)
    check(p, exact, 1e-9)
    for ref in (glpk, highs):
        assert p.is_feasible(ref.choice) and ref.status == "optimal"
    assert close(ours.objective, glpk.objective, 1e-4)
    assert close(highs.objective, glpk.objective, 1e-4)
    assert close(exact.objective, glpk.objective, 1e-7)
    assert ours.bound >= glpk.objective - 1e-9  # the bound is a bound


@pytest.mark.parametrize("kind", DEGENERATE_KINDS)
def test_degenerate_instances(kind: str) -> None:
    for seed in range(3):
        p = degenerate_problem(np.random.default_rng(seed), kind)
        ours = solve(p)
        check(p, ours)
        assert close(ours.objective, solve_reference(p, "GLPK_MI").objective, 1e-9)
        exact = brute_force(p)
        assert exact is None or close(ours.objective, exact, 1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_larger_instances_against_highs(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    p = random_problem(rng, 300, paper_types(4), value_model=("sia", "uniform", "ties")[seed])
    ours = solve(p)
    ref = solve_reference(p, "HIGHS")
    check(p, ours)
    assert close(ours.objective, ref.objective, 1e-4)
    assert ours.bound >= ref.objective - 1e-4 * abs(ref.objective)


@pytest.mark.parametrize("seed", range(24))
def test_medium_instances_are_feasible_and_proven(seed: int) -> None:
    """Hundreds of jobs on 64-2,048 GPUs: every heuristic and the residual
    paths run here; the answer must be feasible, within its gap, and no worse
    than a start."""
    rng = np.random.default_rng(500 + seed)
    p = random_problem(rng, int(rng.choice([100, 200, 400, 800])),
                       paper_types(int(rng.choice([1, 4, 16, 32]))),
                       value_model=("sia", "ties", "uniform")[seed % 3],
                       cols_per_job=((1, 24), (16, 24), (4, 8))[seed // 3 % 3])
    start = solve(p, time_limit=0.0).choice
    sol = solve(p, start=start)
    check(p, sol)
    assert sol.objective >= p.objective(start) - 1e-12


def test_mip_fallback_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the DP disabled every residual goes to HiGHS MIP."""
    monkeypatch.setattr(solve_module, "_DP_WORK", 0)
    paths = set()
    for seed in range(12):
        p = random_case(seed)
        ours = solve(p, rel_gap=1e-7)
        check(p, ours, 1e-7)
        paths.add(path_name(ours.stats))
        assert close(ours.objective, solve_reference(p, "GLPK_MI").objective, 1e-6)
    assert "mip" in paths


def test_all_paths_exercised() -> None:
    paths = {path_name(solve(random_case(seed)).stats) for seed in range(60)}
    assert {"fits", "lagrangian", "dp"} <= paths


# -- hand-checkable cases ------------------------------------------------------------------


def test_everything_fits_takes_each_best() -> None:
    p = make([[(0, 1, -0.5), (0, 2, -0.3)], [(1, 4, -0.2), (0, 1, -0.6)], []], [8, 4])
    sol = solve(p)
    check(p, sol)
    assert sol.choice.tolist() == [1, 2, -1]
    assert sol.objective == pytest.approx(-0.3 - 0.2 - 1.0)
    assert sol.bound == pytest.approx(sol.objective)
    assert path_name(sol.stats) == "fits"


def test_knapsack_where_rounding_the_lp_fails() -> None:
    # LP: the 6-GPU job plus 4/5 of a 5-GPU one (1.05); integer: both 5s (1.0).
    p = make([[(0, 6, -0.35)], [(0, 5, -0.5)], [(0, 5, -0.5)]], [10])
    sol = solve(p, rel_gap=1e-9)
    check(p, sol, 1e-9)
    assert sol.choice.tolist() == [-1, 1, 2]
    assert sol.objective == pytest.approx(-2.0)
    assert solve_reference(p, "GLPK_MI").objective == pytest.approx(-2.0)
    assert solve_reference(p, "HIGHS").objective == pytest.approx(-2.0)


def test_multiple_choice_knapsack_optimum() -> None:
    # Cap 4: A at 4 GPUs alone (-0.05 - 1) loses to A and B at 2 each (-0.1 - 0.2).
    p = make([[(0, 2, -0.1), (0, 4, -0.05)], [(0, 2, -0.2)]], [4])
    sol = solve(p)
    check(p, sol)
    assert sol.choice.tolist() == [0, 2]
    assert sol.objective == pytest.approx(-0.3)


def test_job_without_columns_gets_none() -> None:
    p = make([[], [(0, 2, -0.1)], []], [2], none=[-3.0, -1.0, -2.0])
    sol = solve(p)
    check(p, sol)
    assert sol.choice.tolist() == [-1, 0, -1]
    assert sol.objective == pytest.approx(-5.1)


def test_zero_capacity_type_is_never_used() -> None:
    p = make([[(0, 1, 0.0), (1, 1, -0.5)], [(0, 2, 0.0), (1, 2, -0.4)], [(0, 1, 0.0)]],
             [0, 2])
    sol = solve(p)
    check(p, sol)
    assert np.all(p.col_type[sol.choice[sol.choice >= 0]] == 1)
    assert sol.objective == pytest.approx(brute_force(p))


def test_none_beats_poor_columns() -> None:
    p = make([[(0, 1, -2.0)], [(0, 1, -0.5)]], [8], none=-1.0)
    sol = solve(p)
    assert sol.choice.tolist() == [-1, 1]


def test_no_jobs() -> None:
    p = make([], [4])
    sol = solve(p)
    assert sol.choice.shape == (0,) and sol.objective == 0.0 and sol.status == "optimal"
    assert solve_reference(p).objective == 0.0


def test_reference_rejects_unknown_solver() -> None:
    with pytest.raises(ValueError, match="solver"):
        solve_reference(make([[(0, 1, 0.0)]], [1]), "CPLEX")


# -- the start vector ----------------------------------------------------------------------


def test_optimal_start_is_kept_on_ties() -> None:
    # Two jobs, room for one: both choices score the same.
    p = make([[(0, 2, -0.5)], [(0, 2, -0.5)]], [2])
    for start in ([0, -1], [-1, 1]):
        sol = solve(p, start=np.asarray(start))
        assert sol.choice.tolist() == start
        assert sol.stats["start_used"] == 1.0


@pytest.mark.parametrize("seed", range(20))
def test_start_never_makes_things_worse(seed: int) -> None:
    p = random_case(seed)
    base = solve(p)
    rng = np.random.default_rng(seed)
    # A feasible but random start: the reference answer with some jobs dropped.
    start = solve_reference(p, "GLPK_MI").choice.copy()
    start[rng.random(p.num_jobs) < 0.3] = -1
    sol = solve(p, start=start)
    check(p, sol)
    assert sol.objective >= p.objective(start) - 1e-12
    assert close(sol.objective, base.objective, 1e-4)
    # The optimum itself as the start comes back unchanged or equally good.
    again = solve(p, start=sol.choice)
    assert again.objective >= sol.objective - 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_price_hints_only_change_the_time(seed: int) -> None:
    """Prices given (`solve(..., prices=)`) bound the optimum whatever they are, so
    the answer is within the gap of the reference with the optimal prices, the
    last round's (perturbed) ones or nonsense ones; the optimal ones spare the LP."""
    p = random_case(seed)
    glpk = solve_reference(p, "GLPK_MI")
    base = solve(p)
    rng = np.random.default_rng(seed)
    hints = [base.prices, base.prices * (1 + 0.01 * rng.standard_normal(len(base.prices))),
             rng.exponential(1.0, len(p.capacity)), np.zeros(len(p.capacity))]
    for hint in hints:
        sol = solve(p, prices=np.maximum(hint, 0.0), start=base.choice)
        check(p, sol)
        assert close(sol.objective, glpk.objective, 1e-4)
        assert sol.bound >= glpk.objective - 1e-9
        assert len(sol.prices) == len(p.capacity) and np.all(sol.prices >= 0)


def test_the_prices_of_an_answer_prove_it_again_without_an_lp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the Lagrangian proved an answer, its own prices prove it again (on the
    column-generation path: the cases are small, so the whole-LP one is turned off)."""
    monkeypatch.setattr(solve_module, "_DIRECT_LP", 0)
    proved = [p for p in map(random_case, range(40))
              if path_name(solve(p).stats) == "lagrangian"]
    assert len(proved) >= 10
    for p in proved:
        base = solve(p)
        again = solve(p, prices=base.prices, start=base.choice)
        assert again.stats["hinted"] == 1.0 and again.stats["direct_lp"] == 0.0
        assert again.objective >= base.objective - 1e-12


def test_prices_that_do_not_prove_start_column_generation_near_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prices given that prove nothing (the answer's own, perturbed by 5 %) are
    Dantzig-Wolfe's first stability centre: over the cases it iterates less than
    from zero prices, and each answer stays within the gap."""
    monkeypatch.setattr(solve_module, "_DIRECT_LP", 0)
    cold = warm = 0.0
    for seed in range(40):
        p = random_case(seed)
        base = solve(p)
        hint = base.prices * (1 + 0.05 * np.random.default_rng(seed).standard_normal(
            len(base.prices)))
        sol = solve(p, prices=np.maximum(hint, 0.0))
        check(p, sol)
        assert close(sol.objective, base.objective, 1e-4)
        if not sol.stats.get("hinted", 0.0):
            cold += base.stats["dw_iters"]
            warm += sol.stats["dw_iters"]
    assert cold > 0 and warm < 0.8 * cold


def test_a_problem_small_enough_for_the_whole_lp_does_not_try_prices_given() -> None:
    """Where HiGHS solves the whole LP, it is cheaper than trying prices given that may
    not prove an incumbent: they are not tried, and the answer is the one without."""
    p = random_case(0)
    base = solve(p)
    assert base.stats["direct_lp"] == 1.0
    again = solve(p, prices=base.prices, start=base.choice)
    assert again.stats["hinted"] == 0.0 and again.stats["direct_lp"] == 1.0
    assert np.array_equal(again.choice, solve(p, start=base.choice).choice)


def stacked(parts: list[ChoiceProblem]) -> tuple[ChoiceProblem, np.ndarray]:
    """Independent problems as one, a block of types each: (problem, type_block)."""
    job_off = np.cumsum([0] + [q.num_jobs for q in parts])
    type_off = np.cumsum([0] + [len(q.capacity) for q in parts])
    cat = np.concatenate
    return ChoiceProblem(
        num_jobs=int(job_off[-1]),
        col_job=cat([q.col_job + o for q, o in zip(parts, job_off[:-1], strict=True)]),
        col_type=cat([q.col_type + o for q, o in zip(parts, type_off[:-1], strict=True)]),
        col_gpus=cat([q.col_gpus for q in parts]), col_value=cat([q.col_value for q in parts]),
        none_value=cat([q.none_value for q in parts]),
        capacity=cat([q.capacity for q in parts])), \
        np.repeat(np.arange(len(parts)), [len(q.capacity) for q in parts])


@pytest.mark.parametrize("seed", range(60))
def test_separable_blocks_are_each_within_the_gap_of_their_own_optimum(seed: int) -> None:
    """`solve_separable` (the queues' silos): every block as good as solving it alone,
    with any price hint (a block's answer, its prices, a random one)."""
    rng = np.random.default_rng(seed)
    parts = [random_case(7 * seed + k) for k in range(int(rng.integers(1, 5)))]
    p, blocks = stacked(parts)
    alone = [solve(q, rel_gap=1e-9) for q in parts]
    hints = [None, np.concatenate([a.prices for a in alone]),
             rng.exponential(1.0, len(p.capacity))]
    for hint in hints:
        sol = solve_separable(p, blocks, prices=hint)
        assert p.is_feasible(sol.choice) and sol.status == "optimal"
        assert sol.bound >= sum(a.objective for a in alone) - 1e-9
        first = 0
        for q, a in zip(parts, alone, strict=True):
            mine = sol.choice[first:first + q.num_jobs]
            value = sum(p.col_value[k] if k >= 0 else p.none_value[first + i]
                        for i, k in enumerate(mine))
            assert close(value, a.objective, 1e-4)
            first += q.num_jobs
    # With the blocks' own prices and answers, only a block whose LP bound did not
    # prove it alone (a DP or MIP) is solved alone again.
    again = solve_separable(p, blocks, prices=hints[1], start=sol.choice)
    hard = sum(path_name(a.stats) in ("dp", "mip") for a in alone)
    assert again.stats["blocks_alone"] <= hard


def test_separable_starts_count_in_the_blocks_they_fit() -> None:
    """Each start is used in the blocks whose types it fits (a queue that borrows
    overfills its silo, the others still start where they are), and on a tie the
    first start wins: block 0 (types 0) has two jobs tied for one GPU; block 1
    (type 1) has room for one of its two. The first start overfills block 1 and
    keeps job 1 in block 0; the second fits both blocks and would keep job 0."""
    p = make([[(0, 1, -0.5)], [(0, 1, -0.5)], [(1, 1, -0.2)], [(1, 1, -0.3)]], [1, 1])
    blocks = np.array([0, 1])
    first = np.array([-1, 1, 2, 3])  # block 1 overfilled
    second = np.array([0, -1, 2, -1])
    for starts, held in (([first, second], 1), ([second, first], 0), ([first], 1)):
        sol = solve_separable(p, blocks, start=np.stack(starts))
        assert p.is_feasible(sol.choice) and sol.status == "optimal"
        assert sol.choice[held] >= 0 and sol.choice[1 - held] == -1
        assert sol.choice[2] == 2 and sol.choice[3] == -1
    # Starts that are no choice at all (another job's column, out of range) are ignored.
    for bad in ([2, 1, 2, 3], [0, 1, 9, -1], [0.5, 1, 2, 3]):
        sol = solve_separable(p, blocks, start=np.asarray(bad))
        assert p.is_feasible(sol.choice) and sol.status == "optimal"


def test_separable_refuses_a_job_across_blocks() -> None:
    p = make([[(0, 1, 1.0), (1, 1, 1.0)]], [1, 1])
    with pytest.raises(FieldError, match="one block"):
        solve_separable(p, np.array([0, 1]))
    with pytest.raises(FieldError, match="type_block"):
        solve_separable(p, np.array([0]))


@pytest.mark.parametrize("prices", [[-1.0], [np.nan], [1.0, 2.0], [np.inf]])
def test_unusable_price_hints_are_ignored(prices: list) -> None:
    p = make([[(0, 2, -0.5)], [(0, 2, -0.4)], [(0, 2, -0.3)]], [4])
    sol = solve(p, prices=np.asarray(prices))
    check(p, sol)
    assert sol.stats.get("hinted", 0.0) == 0.0
    assert sol.objective == pytest.approx(-0.7 - 1.0)


@pytest.mark.parametrize("start", [
    [0, 1, 2],  # over capacity
    [1, -1, -1],  # job 0 given job 1's column
    [0, -1],  # wrong length
    [5, -1, -1],  # no such column
    [-2, -1, -1],  # bad index
    [0.5, -1, -1],  # not integral
])
def test_infeasible_start_is_ignored(start: list) -> None:
    p = make([[(0, 2, -0.5)], [(0, 2, -0.4)], [(0, 2, -0.3)]], [4])
    sol = solve(p, start=np.asarray(start))
    check(p, sol)
    assert sol.stats["start_used"] == 0.0
    assert sol.objective == pytest.approx(-0.7 - 1.0)


# -- limits, reentrancy, scale ---------------------------------------------------------------


def test_time_limit_returns_a_feasible_answer_and_a_bound() -> None:
    p = random_problem(np.random.default_rng(7), 400, paper_types(8))
    sol = solve(p, time_limit=0.0)
    assert p.is_feasible(sol.choice)
    assert sol.bound >= sol.objective
    assert sol.status in ("optimal", "time_limit")
    assert (sol.status == "optimal") == (path_name(sol.stats) != "time_limit")


@pytest.mark.parametrize("dp_work", [solve_module._DP_WORK, 0])
def test_reentrant_across_threads(monkeypatch: pytest.MonkeyPatch, dp_work: float) -> None:
    monkeypatch.setattr(solve_module, "_DP_WORK", dp_work)  # 0: residuals go to HiGHS MIP
    problems = [random_case(seed) for seed in range(8)]
    serial = [solve(p, rel_gap=1e-7).objective for p in problems]
    with ThreadPoolExecutor(4) as pool:
        parallel = [s.objective for s in pool.map(lambda p: solve(p, rel_gap=1e-7), problems)]
    assert parallel == pytest.approx(serial, rel=1e-7)


def _solve_in_child(seed: int) -> float:
    solve_module._DP_WORK = 0  # the child's own copy: force the MIP path
    return solve(random_case(seed), rel_gap=1e-7).objective


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_process_pool_after_highs_ran_in_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiGHS' worker pool does not survive fork; without the at-fork reset a
    child's MIP would hang."""
    monkeypatch.setattr(solve_module, "_DP_WORK", 0)
    seeds = [s for s in range(30) if path_name(solve(random_case(s), rel_gap=1e-7).stats)
             == "mip"][:4]
    assert seeds
    expected = [solve(random_case(s), rel_gap=1e-7).objective for s in seeds]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pool = mp.get_context("fork").Pool(2)
    try:  # a hang shows up as a timeout, not as a stuck test run
        got = pool.map_async(_solve_in_child, seeds).get(timeout=60)
    finally:
        pool.terminate()
        pool.join()
    assert got == pytest.approx(expected, rel=1e-7)


def test_large_instance_is_solved_by_the_lagrangian_path() -> None:
    p = bench_problem(np.random.default_rng(3), 2048)
    sol = solve(p)
    check(p, sol)
    assert path_name(sol.stats) == "lagrangian" and sol.stats["direct_lp"] == 0.0
    for key in ("lp_s", "mip_s", "total_s", "fractional_jobs", "residual_jobs",
                "residual_cols", "dw_iters"):
        assert key in sol.stats
    assert sol.stats["total_s"] < 5.0  # generous: the target is well under 0.25 s
    assert close(sol.objective, solve_reference(p, "HIGHS").objective, 1e-4)


# -- instance generator ----------------------------------------------------------------------


def test_generator_is_deterministic_and_sia_shaped() -> None:
    a = random_problem(np.random.default_rng(5), 50, {"x": 32, "y": 16})
    b = random_problem(np.random.default_rng(5), 50, {"x": 32, "y": 16})
    for name in ("col_job", "col_type", "col_gpus", "col_value", "none_value", "capacity"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    ladder = {1, 2, 4, 8, 16, 24, 32}
    assert set(a.col_gpus.tolist()) <= ladder
    assert np.all(a.col_value < 0) and np.all(a.col_value >= -1.0 / np.sqrt(0.7) - 1e-12)
    assert np.all(a.none_value == -1.1)


# -- properties ------------------------------------------------------------------------------


@st.composite
def problems(draw):
    num_types = draw(st.integers(0, 3))
    capacity = draw(st.lists(st.integers(0, 12), min_size=num_types, max_size=num_types))
    num_jobs = draw(st.integers(0, 7))
    jobs = []
    for _ in range(num_jobs):
        k = draw(st.integers(0, 3)) if num_types else 0
        jobs.append([(draw(st.integers(0, num_types - 1)), draw(st.integers(1, 8)),
                      draw(st.floats(-2.0, 1.0, allow_nan=False))) for _ in range(k)])
    none = [draw(st.floats(-1.5, 0.0, allow_nan=False)) for _ in range(num_jobs)]
    p = make(jobs, capacity, none)
    start = np.asarray([draw(st.integers(-1, max(-1, p.num_cols - 1)))
                        for _ in range(num_jobs)], dtype=np.int64)
    return p, start


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_property_feasible_optimal_and_never_worse(case) -> None:
    p, start = case
    sol = solve(p, rel_gap=1e-9, start=start)
    assert p.is_feasible(sol.choice)
    assert sol.bound >= sol.objective - 1e-12
    assert sol.objective >= float(p.none_value.sum()) - 1e-12
    if p.is_feasible(start):
        assert sol.objective >= p.objective(start) - 1e-12
    exact = brute_force(p)
    assert exact is None or sol.objective == pytest.approx(exact, abs=1e-9)
