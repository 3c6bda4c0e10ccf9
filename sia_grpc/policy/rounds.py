"""What every policy shares after estimating: assemble the ILP, solve it, place
the chosen configurations on physical GPUs, and explain the outcome."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sia_grpc.policy.candidates import CandidateTable, current_index
from sia_grpc.policy.cluster import Config, GpuId
from sia_grpc.policy.placer import place
from sia_grpc.policy.problem import ChoiceProblem
from sia_grpc.policy.queue_rows import (
    QueueRows,
    SideRows,
    guarantee_caps,
    job_weights,
    min_runtime_holds,
    owed_bounds,
    per_queue_type,
    queue_index,
    queue_rows,
    queue_usage,
)
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.solvers import solve, solve_reference, solve_separable
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult, SiloHint, WarmStart

REFERENCE_SOLVERS = {"glpk_mi": "GLPK_MI", "cvxpy-highs": "HIGHS"}
# Whether a round with queues solves only the silos it needs (`_guaranteed_round`)
# and takes borrowing rows only where they can bind (`_lazy_borrowing`); False solves
# every silo up front and takes every row at once: the reference the tests hold the
# lazy rounds to.
LAZY_ROWS = True
SOLVERS = ("highs", *REFERENCE_SOLVERS)


def assemble(table: CandidateTable, values: np.ndarray, none_value: float | np.ndarray,
             current: np.ndarray, side: SideRows | None = None,
             capacity: np.ndarray | None = None, only: np.ndarray | None = None,
             ) -> tuple[ChoiceProblem, np.ndarray, np.ndarray]:
    """The ChoiceProblem over the table's rows whose value is finite (NaN = not
    an option); `none_value` is one value for every job or one per job; `side`:
    side rows over table rows (queues), mapped onto the columns; `capacity`: per
    type, instead of the cluster's; `only`: the jobs (a mask) of a smaller problem,
    numbered in order (no side rows then).

    Returns the problem, `rows` (column → row of the table) and `start`: each
    job's current configuration as a column (-1 where it has none or it is not
    an option), the solver's warm start.
    """
    cluster = table.cluster
    none_values = np.broadcast_to(np.asarray(none_value, dtype=np.float64),
                                  (table.num_jobs,)).copy()
    finite = np.isfinite(values)
    num_jobs, renumber = table.num_jobs, np.arange(table.num_jobs)
    if only is not None:
        finite &= only[table.job]
        num_jobs, none_values = int(only.sum()), none_values[only]
        renumber = np.cumsum(only) - 1
    rows = np.flatnonzero(finite)
    job = renumber[table.job[rows]]
    problem = ChoiceProblem(**_side_columns(side, rows, len(table)),
        num_jobs=num_jobs,
        col_job=job,
        col_type=table.types()[rows],
        col_gpus=table.gpus()[rows],
        col_value=values[rows].astype(np.float64),
        none_value=none_values,
        capacity=(np.array([cluster.capacity[t] for t in cluster.gpu_types], dtype=np.int64)
                  if capacity is None else np.asarray(capacity, dtype=np.int64)),
    )
    start = np.full(num_jobs, -1, dtype=np.int64)
    same = np.flatnonzero(table.config[rows] == current[table.job[rows]])
    start[job[same]] = same
    return problem, rows, start


def _side_columns(side: SideRows | None, rows: np.ndarray, n_rows: int) -> dict:
    """`side`'s rows in ChoiceProblem's terms: entries on table rows that are no
    column (no option) drop out."""
    if side is None or not len(side):
        return {}
    col_of = np.full(n_rows, -1, dtype=np.int64)
    col_of[rows] = np.arange(len(rows))
    col = col_of[side.row]
    keep = col >= 0
    entry_row = np.repeat(np.arange(len(side)), np.diff(side.ptr))[keep]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(entry_row, minlength=len(side)))])
    return dict(row_ptr=ptr.astype(np.int64), row_col=col[keep], row_coef=side.coef[keep],
                row_rhs=side.rhs.astype(np.float64), row_penalty=side.penalty.astype(np.float64))


def hold_current(table: CandidateTable, values: np.ndarray, none_value: np.ndarray,
                 current: np.ndarray, hold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Force each held job to keep its current configuration: its other rows
    become NaN (not an option) and leaving it out costs more than the whole rest
    of the objective can gain, so every optimum keeps it. The previous round's
    allocation fits, so the held jobs together always fit. A held job with no
    current configuration must get one of its rows, if any fits; one whose current
    configuration is not an option is left free.

    Returns new (values, none_value) arrays."""
    job = table.job
    finite = np.isfinite(values)
    cur_row = hold[job] & (current[job] >= 0) & (table.config == current[job]) & finite
    new_row = hold[job] & (current[job] < 0) & finite
    held = np.zeros(table.num_jobs, dtype=bool)
    held[job[cur_row]] = True
    if not np.any(held) and not np.any(new_row):
        return values, none_value
    scale = float(np.max(np.abs(values[finite]))) + float(np.max(np.abs(none_value))) + 1.0
    big = (table.num_jobs + 1) * scale
    out = np.where(held[job] & ~cur_row, np.nan, values)
    none = none_value.astype(np.float64).copy()
    none[job[cur_row]] = values[cur_row] - big
    worst = np.full(table.num_jobs, np.inf)
    np.minimum.at(worst, job[new_row], values[new_row])
    placed = np.isfinite(worst)
    none[placed] = worst[placed] - big
    return out, none


# A second stage after the ILP, for GPUs it leaves idle: `grow(current, chosen)`
# gives each candidate's stage-2 value (NaN: not an option) from the chosen rows
# (-1: none), or None when there is nothing to grow into.
Grow = Callable[[np.ndarray, np.ndarray], np.ndarray | None]


def ilp_round(table: CandidateTable, jobs: Sequence[PolicyJob],
              previous: Mapping[str, JobAllocation],
              values: Callable[[np.ndarray], np.ndarray], none_value: float | np.ndarray,
              timings: dict[str, float], *, time_limit: float, rel_gap: float,
              solver: str, hold: np.ndarray | None = None,
              grow: Grow | None = None, queues: QueueSet | None = None,
              warm: WarmStart | None = None) -> RoundResult:
    """The rest of a round for an ILP policy: `values(current)` gives every
    candidate's value from each job's current configuration index (-1: none);
    `none_value` is leaving a job out, one value for all or one per job.
    Jobs where `hold` is true keep their current configuration (`hold_current`).
    With `grow`, jobs may then take GPUs the ILP left idle (`grow_into_idle`).
    With `queues`, priority weights, minimum-runtime holds and the queues' rows
    (`queue_rows`) join the program, the guarantees' only where they are needed
    (`_guaranteed_round`); `warm` (the previous round's `RoundResult.warm`) starts
    the solves."""
    t0 = time.perf_counter()
    current = current_index(table.cluster, jobs, previous)
    vals = values(current)
    none = np.broadcast_to(np.asarray(none_value, dtype=np.float64), (table.num_jobs,)).copy()
    hold = np.zeros(table.num_jobs, dtype=bool) if hold is None else np.asarray(hold, bool)
    qix = None if queues is None else queue_index(jobs, queues)
    if queues is not None:
        assert qix is not None  # (set with `queues`, as below)
        w = job_weights(jobs, queues)
        vals, none = vals * w[table.job], none * w
        young = min_runtime_holds(jobs, current, queues, qix)
        hold = hold | young
    worth = none.copy()  # (before holds: what sizes the queues' penalties)
    if np.any(hold):
        vals, none = hold_current(table, vals, none, current, hold)
    kw = dict(time_limit=time_limit, rel_gap=rel_gap, solver=solver)
    # (What the queues' rows share across this round's builds, found once.)
    builder = None if queues is None or qix is None else QueueRows(
        table, qix, vals, worth, current, queues, hold=hold)
    timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0

    def side_rows(silo: dict | None) -> SideRows | None:
        return None if builder is None else builder.rows(silo=silo)

    def shared(silo: dict | None, start_prices: WarmStart | None):
        """The shared round (stage 1, then growth) with the guarantee rows of the
        queues in `silo`: (choice, objective, stats, prices, side rows)."""
        t1 = time.perf_counter()
        side = side_rows(silo)
        timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t1
        chosen, objective, stats, prices = _lazy_borrowing(
            table, vals, none, current, side, start_prices, timings, kw)
        if grow is not None:
            stage2 = None if queues is None else functools.partial(
                _stage2_rows, table, qix, worth, current, queues, chosen, hold, silo)
            chosen = grow_into_idle(table, current, chosen, grow, timings, side=stage2,
                                    hold=hold, **kw)
        return chosen, objective, stats, prices, side

    hints: dict[str, SiloHint] = {}
    needed: frozenset[str] = frozenset()
    if queues is not None and any(q.guarantee for q in queues.queues):
        assert qix is not None
        chosen, objective, stats, prices, side, hints, needed = _guaranteed_round(
            shared, side_rows, table, jobs, qix, vals, none, current, hold, queues, timings,
            kw, warm)
    else:
        chosen, objective, stats, prices, side = shared(None, warm)
    placed = np.flatnonzero(chosen >= 0)
    by_job = dict(zip([jobs[i].job_id for i in placed.tolist()], chosen[placed].tolist(),
                      strict=True))
    # (The queues' minimum-runtime holds only: the paper's placer stays the paper's.)
    pinned = frozenset() if queues is None else frozenset(
        jobs[i].job_id for i in np.flatnonzero(young).tolist())
    result = finish_round(table, jobs, by_job, previous, objective=objective, timings=timings,
                          solver_stats=stats, pinned=pinned)
    T = len(table.cluster.gpu_types)
    own = tuple(prices[:T].tolist())
    if queues is None:
        return dataclasses.replace(result, warm=WarmStart(prices=own))
    assert qix is not None
    return dataclasses.replace(result, queues=queue_usage(table, chosen, queues, qix),
                               rows=_row_report(side, table, chosen),
                               warm=_warm(side, prices, T, hints, needed))


def _lazy_borrowing(table: CandidateTable, vals: np.ndarray, none: np.ndarray,
                    current: np.ndarray, side: SideRows | None, start: WarmStart | None,
                    timings: dict[str, float], kw: dict):
    """Stage 1 with `side`'s borrowing rows only where they can bind: those a queue is
    at or over now, then any the answer goes over, solved again until it goes over
    none (constraint generation, as for the guarantees: an optimum that meets the
    rows left out is an optimum with them). Returns (choice, objective, stats,
    prices over all of `side`'s rows: 0 for those left out)."""
    T = len(table.cluster.gpu_types)
    active = None
    if side is not None and LAZY_ROWS:
        lazy = np.array([n.startswith("borrow ") for n in side.names], dtype=bool)
        if lazy.any():
            at = np.flatnonzero((current[table.job] >= 0) & (table.config == current[table.job]))
            now = side.activity(_picked(table, at))
            active = ~lazy | (now >= side.rhs - 1e-9)
    passes = 0
    while True:
        t0 = time.perf_counter()
        rows_now = side if active is None or side is None else side.subset(active)
        problem, rows, first = assemble(table, vals, none, current, rows_now)
        timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
        chosen, objective, stats, prices = choose(problem, rows, first, timings, **kw,
                                                  prices=_warm_prices(start, rows_now))
        passes += 1
        if active is None or active.all():
            break
        assert side is not None  # (`active` is only set with side rows)
        over = ~active & (side.activity(_picked(table, chosen)) > side.rhs + 1e-9)
        if not over.any():
            break
        active |= over
        start = _warm(rows_now, prices, T, {})
    if rows_now is not side:  # (prices of the rows left out: 0)
        assert rows_now is not None and side is not None
        by_name = dict(zip(rows_now.names, prices[T:].tolist(), strict=True))
        prices = np.concatenate([prices[:T], [by_name.get(n, 0.0) for n in side.names]])
    return chosen, objective, {**stats, "borrow_passes": float(passes)}, prices


def _warm(side: SideRows | None, prices: np.ndarray, T: int,
          silos: Mapping[str, SiloHint], needed: frozenset[str] = frozenset()) -> WarmStart:
    """A solve's prices (capacities, then its side rows) as a warm start."""
    names = () if side is None else side.names
    return WarmStart(silos=dict(silos), prices=tuple(prices[:T].tolist()),
                     row_prices=dict(zip(names, prices[T:].tolist(), strict=True)),
                     needed=needed)


def _guaranteed_round(shared, side_rows, table: CandidateTable, jobs, qix: np.ndarray,
                      vals: np.ndarray, none: np.ndarray, current: np.ndarray,
                      hold: np.ndarray, queues: QueueSet, timings: dict[str, float], kw: dict,
                      warm: WarmStart | None):
    """The shared round with the queues' guarantees, their silos solved lazily.

    A queue is owed its silo (`silo_use`), which is never more than `owed_bounds`
    (its guarantee as the round can give it, or what its jobs' options could use).
    The guarantee rows of a queue that holds at least that bound in the answer are
    met whatever its silo, so they are left out and its silo is not solved: the
    round first solves with the rows of the queues it must know (those whose silo
    the last round needed and, with a restart budget, those holding less than the
    bound now: the budget's row depends on who is below what it is owed), then
    solves the silos of the queues the answer leaves below their bound and, where
    the answer does not already give them their silo, solves again with their
    rows, until no queue is left below. Constraint generation: an optimum of
    the problem with fewer rows that meets the others is an optimum with all of
    them, so the answer is within the gap as with every row. (On `sia bench
    policy --queues 16`, 3 of the 16 silos are solved in a median round, at most 4,
    in at most 2 passes.) The rows reported for a queue whose silo was not solved carry
    its bound: at least what it is owed, and what it holds.

    Returns (choice, objective, stats, prices, side rows, silo hints, the queues
    to solve the silos of first next round)."""
    cap, now = guarantee_caps(table, qix, current, queues, hold)
    bound = owed_bounds(table, qix, vals, cap)
    present = np.bincount(qix, minlength=len(queues.queues)) > 0
    owing = [k for k, q in enumerate(queues.queues) if q.guarantee and present[k]]
    last = set() if warm is None else set(warm.needed)
    need = {k for k in owing if queues.queues[k].name in last or not LAZY_ROWS}
    if queues.max_restarts_per_round is not None:
        need |= {k for k in owing if np.any(now[k] < bound[k])}
    hints = {} if warm is None else dict(warm.silos)
    silo: dict[str, dict[str, int]] = {}
    solved: set[int] = set()
    counts = {"silo_solves": 0.0, "silo_alone": 0.0, "queue_passes": 0.0}
    types = table.cluster.gpu_types
    T = len(types)

    def solve_silos(ks: list[int]) -> None:
        if not ks:
            return
        part, left, c = silo_use(table, jobs, vals, none, current, queues, timings, kw,
                                 hints, only=ks, qix=qix)
        silo.update({queues.queues[k].name: part[queues.queues[k].name] for k in ks})
        hints.update(left)
        solved.update(ks)
        for key, v in c.items():
            counts[key] += v

    solve_silos(sorted(need))
    start = warm
    while True:
        chosen, objective, stats, prices, side = shared(silo, start)
        counts["queue_passes"] += 1
        start = _warm(side, prices, T, hints)
        held = per_queue_type(table, qix, len(queues.queues), _picked(table, chosen) > 0)
        short = sorted(k for k in owing
                       if k not in solved and np.any(held[k] < bound[k] - 1e-9))
        if not short:
            break
        solve_silos(short)
        if _meets(held, cap, silo, queues, short, types):
            side = None  # (the answer gives them their silo already: it stands)
            break
        # Solving again moves up to their shortfall of each type to them, perhaps from
        # queues holding less than that above their bound: those join at once rather
        # than each in a further pass. (Only the passes depend on it, not the answer.)
        short_by = np.maximum(bound[short] - held[short], 0.0).sum(axis=0)
        solve_silos(sorted(k for k in owing if k not in solved
                           and np.any((held[k] - bound[k] < short_by + 1e-9) & (cap[k] > 0))))
    # Every queue's guarantee rows are reported, those of a queue whose silo was not
    # solved with the bound it holds as its bound: what it is owed, or more. (Price
    # 0: the rows left out did not shape the answer.)
    upper = {queues.queues[k].name: dict(zip(types, bound[k].tolist(), strict=True))
             for k in owing if k not in solved}
    if upper or side is None:  # (None: rows were added that the last solve did not have)
        side = side_rows({**upper, **silo})
        prices = np.concatenate([prices[:T], [start.row_prices.get(n, 0.0)
                                              for n in side.names]])
    # For the next round: the queues whose silos this one solved and that hold no
    # more than their bound of some type (their rows may bind again; a queue holding
    # more of every type drops out).
    tight = (held <= bound + 1e-9) & (cap > 0)
    return chosen, objective, {**stats, **counts}, prices, side, hints, frozenset(
        queues.queues[k].name for k in sorted(solved) if np.any(tight[k]))


def _meets(held: np.ndarray, cap: np.ndarray, silo: Mapping[str, Mapping[str, int]],
           queues: QueueSet, ks, types: Sequence[str]) -> bool:
    """Whether queues `ks` hold what they are owed: min(cap, silo) of each type."""
    for k in ks:
        mine = silo[queues.queues[k].name]
        for i, t in enumerate(types):
            if cap[k, i] > 0 and held[k, i] < min(cap[k, i], mine.get(t, 0)):
                return False
    return True


def _warm_prices(warm: WarmStart | None, side: SideRows | None) -> np.ndarray | None:
    """The last round's prices for this round's coupling rows: its capacity prices,
    then each side row's by name (0 for a row it did not have). The solver takes
    them only where they fit."""
    if warm is None or warm.prices is None:
        return None
    if side is None or not len(side):
        return np.asarray(warm.prices, dtype=np.float64)
    rows = warm.row_prices
    return np.concatenate([warm.prices, [rows.get(n, 0.0) for n in side.names]])


def silo_use(table: CandidateTable, jobs, vals: np.ndarray, none: np.ndarray,
             current: np.ndarray, queues: QueueSet, timings: dict[str, float], kw: dict,
             hints: Mapping[str, SiloHint], only: Sequence[int] | None = None,
             qix: np.ndarray | None = None,
             ) -> tuple[dict[str, dict[str, int]], dict[str, SiloHint], dict[str, float]]:
    """What each queue's jobs hold per type with the queue's guarantee as a private
    partition (Sia on its jobs alone, its guarantee of each type the capacity; same
    values and holds): what a queue is owed in the shared round, up to its
    guarantee. The silos are independent problems, solved as one with a block of
    types per queue (`solve_separable`: each to within the gap of its own optimum;
    one problem with a capacity row per queue and type in one Lagrangian was ~10x
    slower); sharing then gives every queue at least its silo and the rest where
    goodput is highest.

    The solve starts from `hints` (the last round's silos: their prices, which
    often prove a silo without an LP, and their choices as the start) and leaves
    its own for the next round. Returns what each queue's jobs hold per type, the
    hints for the next round and counts (`silo_solves`: silos solved,
    `silo_alone`: those the shared steps did not prove) for the round's stats.
    `only`: the indices of the queues whose silos to solve (default: all); `qix`: each
    job's queue (`queue_index`; computed when not given)."""
    types = table.cluster.gpu_types
    T = len(types)
    out = {q.name: dict.fromkeys(types, 0) for q in queues.queues}
    qix = queue_index(jobs, queues) if qix is None else qix
    wanted = range(len(queues.queues)) if only is None else only
    silos = [k for k in wanted if queues.queues[k].guarantee and np.any(qix == k)]
    if not silos:
        return out, {}, {}
    t0 = time.perf_counter()
    block = np.full(len(queues.queues), -1, dtype=np.int64)
    block[silos] = np.arange(len(silos))
    mine = block[qix] >= 0
    ids = [j.job_id for j in jobs]
    # The starts: what each job holds now, else what it held in the last silo; and
    # the last silo (which fits where the queue now borrows). Where the silo's
    # optimum is tied, the first start wins: owed is then what the queue holds,
    # which the shared round can keep without restarts.
    before = current.copy()
    last = np.full(len(jobs), -1, dtype=np.int64)
    lam = np.zeros(len(silos) * T)
    for b, k in enumerate(silos):
        hint = hints.get(queues.queues[k].name)
        if hint is not None and len(hint.prices) == T:
            lam[b * T:(b + 1) * T] = hint.prices
            for i in np.flatnonzero(qix == k).tolist():
                last[i] = hint.choice.get(ids[i], -1)
                if before[i] < 0:
                    before[i] = last[i]
    problem, rows, start = assemble(table, vals, none, before, only=mine)
    start_last = np.full(problem.num_jobs, -1, dtype=np.int64)
    same = np.flatnonzero(table.config[rows] == last[table.job[rows]])
    start_last[problem.col_job[same]] = same
    job_block = block[qix[mine]]
    problem = dataclasses.replace(
        problem, col_type=job_block[problem.col_job] * T + problem.col_type,
        capacity=np.array([queues.queues[k].guarantee.get(t, 0) for k in silos
                           for t in types], dtype=np.int64))
    timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    if kw["solver"] == "highs":
        sol = solve_separable(problem, np.repeat(np.arange(len(silos)), T),
                              start=np.stack([start, start_last]), prices=lam,
                              time_limit=kw["time_limit"], rel_gap=kw["rel_gap"])
    else:  # (a reference solves the silos as one ILP: its optimum is each silo's)
        sol = solve_reference(problem, solver=REFERENCE_SOLVERS[kw["solver"]],
                              time_limit=kw["time_limit"])
    timings["solve"] = timings.get("solve", 0.0) + time.perf_counter() - t0
    gpus, typ = table.gpus(), table.types()
    chosen = np.full(problem.num_jobs, -1, dtype=np.int64)
    chosen[sol.choice >= 0] = rows[sol.choice[sol.choice >= 0]]
    where = np.flatnonzero(mine)  # problem job -> job
    prices = sol.prices if len(sol.prices) == len(lam) else np.zeros(len(lam))
    left = {}
    on = chosen >= 0
    # GPUs per (block, type) in one pass; each silo's choices as Python ints at once.
    held = np.bincount(job_block[on] * T + typ[chosen[on]], weights=gpus[chosen[on]],
                       minlength=len(silos) * T).astype(np.int64).reshape(len(silos), T)
    picked = np.flatnonzero(on)
    picked_block = job_block[picked].tolist()
    picked_id = [ids[i] for i in where[picked].tolist()]
    picked_config = table.config[chosen[picked]].tolist()
    choices: list[dict[str, int]] = [{} for _ in silos]
    for b, job_id, config in zip(picked_block, picked_id, picked_config, strict=True):
        choices[b][job_id] = config
    for b, k in enumerate(silos):
        name = queues.queues[k].name
        out[name] = dict(zip(types, held[b].tolist(), strict=True))
        left[name] = SiloHint(prices=tuple(prices[b * T:(b + 1) * T].tolist()),
                              choice=choices[b])
    return out, left, {"silo_solves": float(len(silos)),
                       "silo_alone": float(sol.stats.get("blocks_alone", len(silos)))}


def _stage2_rows(table, qix, worth, current, queues, first, hold, silo, vals) -> SideRows:
    """The queues' rows for the growth stage: restarts stage 1 spent count."""
    job = table.job
    stay = np.isfinite(vals) & (current[job] >= 0) & (table.config == current[job])
    could = np.zeros(table.num_jobs, dtype=bool)
    could[job[(current[job] >= 0) & (table.config == current[job])]] = True
    kept = np.zeros(table.num_jobs, dtype=bool)
    kept[job[stay]] = True
    used = int(np.sum(could & ~kept & (current >= 0)))
    return queue_rows(table, qix, vals, worth, current, queues, restarts_used=used,
                      hold=hold, silo=silo)


def _picked(table: CandidateTable, chosen: np.ndarray) -> np.ndarray:
    """1.0 on each table row in `chosen` (each job's row, -1: none), else 0."""
    picked = np.zeros(len(table))
    picked[chosen[chosen >= 0]] = 1.0
    return picked


def _row_report(side: SideRows | None, table: CandidateTable,
                chosen: np.ndarray) -> dict[str, tuple[float, float]]:
    """Each side row's activity and bound at the choice: name -> (Σ coef·x, rhs)."""
    if side is None:
        return {}
    activity = side.activity(_picked(table, chosen))
    return {n: (float(a), float(b)) for n, a, b in zip(side.names, activity, side.rhs,
                                                       strict=True)}


def choose(problem: ChoiceProblem, rows: np.ndarray, start: np.ndarray,
           timings: dict[str, float], *, time_limit: float, rel_gap: float,
           solver: str = "highs", prices: np.ndarray | None = None,
           ) -> tuple[np.ndarray, float, dict[str, float], np.ndarray]:
    """Solve the problem: each job's chosen row of the table (-1: none), the
    objective, the solver's statistics and the capacity prices behind its bound
    (a warm start for a like problem; `prices` are such a start, `solve`'s).

    `solver` is "highs" (the production path) or a reference path, "glpk_mi" or
    "cvxpy-highs" (the same ILP through CVXPY), for comparison and benchmarks.
    """
    t0 = time.perf_counter()
    if solver == "highs":
        sol = solve(problem, time_limit=time_limit, rel_gap=rel_gap, start=start,
                    prices=prices)
    elif solver in REFERENCE_SOLVERS:
        sol = solve_reference(problem, solver=REFERENCE_SOLVERS[solver], time_limit=time_limit)
    else:
        raise ValueError(f"solver: unknown {solver!r}; choose one of {', '.join(SOLVERS)}")
    timings["solve"] = timings.get("solve", 0.0) + time.perf_counter() - t0
    chosen = np.full(len(sol.choice), -1, dtype=np.int64)
    picked = sol.choice >= 0
    chosen[picked] = rows[sol.choice[picked]]
    return chosen, float(sol.objective), {**sol.stats, "gap": sol.gap}, sol.prices


def grow_into_idle(table: CandidateTable, current: np.ndarray, chosen: np.ndarray,
                   grow: Grow, timings: dict[str, float],
                   side: Callable[[np.ndarray], SideRows] | None = None,
                   hold: np.ndarray | None = None, **solve_kw) -> np.ndarray:
    """Stage 2: every job keeps its stage-1 row or takes one of the larger rows of
    the same type `grow` allows; the capacity is the cluster's, so what jobs take
    is what stage 1 left idle. Jobs where `hold` is true (held by the policy or
    by their queue's minimum runtime) keep their stage-1 row. Nothing to grow
    into: stage 1's answer."""
    t0 = time.perf_counter()
    vals = grow(current, chosen)
    if vals is None:
        return chosen
    keep = np.zeros(len(table), dtype=bool)
    keep[chosen[chosen >= 0]] = True
    if hold is not None and np.any(hold):
        vals = np.where(hold[table.job] & ~keep, np.nan, vals)
    finite = np.isfinite(vals)
    # Leaving a job out (or below its stage-1 row) costs more than anything gains.
    scale = float(np.max(np.abs(vals[finite]))) + 1.0 if np.any(finite) else 1.0
    none = np.full(table.num_jobs, -(table.num_jobs + 1) * scale)
    none[chosen < 0] = 0.0  # (not an option to them: they have no rows)
    vals = np.where(finite, vals, np.nan)
    problem, rows, start = assemble(table, vals, none, current,
                                    None if side is None else side(vals))
    start = np.full(table.num_jobs, -1, dtype=np.int64)
    at = {int(r): k for k, r in enumerate(rows)}
    for i in np.flatnonzero(chosen >= 0):
        start[i] = at.get(int(chosen[i]), -1)
    timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
    grown, _, _, _ = choose(problem, rows, start, timings, **solve_kw)
    # A job whose stage-1 row was not an option to stage 2 keeps it.
    return np.where(keep[np.maximum(chosen, 0)] & (grown < 0), chosen, grown)


def finish_round(table: CandidateTable, jobs: Sequence[PolicyJob], chosen: Mapping[str, int],
                 previous: Mapping[str, JobAllocation], *, objective: float,
                 timings: dict[str, float],
                 solver_stats: Mapping[str, float] | None = None,
                 placed: Mapping[str, tuple[Config, tuple[GpuId, ...]]] | None = None,
                 pinned: frozenset[str] = frozenset(),
                 ) -> RoundResult:
    """Place the chosen rows (job id → row of `table`) and assemble the result.

    `placed` (job id → its shape and GPUs) replaces Sia's placer for a policy
    that places jobs its own way (Gavel). `pinned` jobs are moved to make room
    only where nothing else does (`placer.place`)."""
    t0 = time.perf_counter()
    names, rows = list(chosen), np.fromiter(chosen.values(), dtype=np.int64, count=len(chosen))
    if placed is None:
        all_configs = table.cluster.configs
        configs = [all_configs[k] for k in table.config[rows].tolist()]
        gpus = place(table.cluster, dict(zip(names, configs, strict=True)),
                     {j: a.gpus for j, a in previous.items() if a.gpus}, pinned).placements
    else:
        configs = [placed[j][0] for j in names]
        gpus = {j: g for j, (_, g) in placed.items()}
    # Whole columns to Python numbers at once: one numpy scalar per job and field
    # cost more than the placer at 20,000 jobs.
    columns = zip(names, configs, table.replicas[rows].tolist(),
                  table.batch_size[rows].tolist(), table.atomic_bsz[rows].tolist(),
                  table.accum_steps[rows].tolist(), table.goodput[rows].tolist(), strict=True)
    make = JobAllocation.of
    allocations = {j: make(config, gpus[j], reps, bsz, atomic, accum, goodput)
                   for j, config, reps, bsz, atomic, accum, goodput in columns}
    reasons, restarted = outcomes(table, jobs, allocations, previous)
    # ("place": the placement and the result assembled from it, reasons included)
    timings["place"] = time.perf_counter() - t0
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    return RoundResult(allocations=allocations, restarted=restarted, objective=objective,
                       timings=dict(timings), solver_stats=dict(solver_stats or {}),
                       reasons=reasons)


def outcomes(table: CandidateTable, jobs: Sequence[PolicyJob],
             allocations: Mapping[str, JobAllocation],
             previous: Mapping[str, JobAllocation]) -> tuple[dict[str, str], frozenset[str]]:
    """A human-readable reason for each job's outcome this round, and the jobs it
    restarts (in one pass: at 20,000 jobs each pass's lookups are most of its cost).

    The verb says what happens to the job's GPUs (started, kept, scaled 2→4, moved
    to another type or other GPUs, repacked onto fewer nodes); a change names the
    goodput it expects against staying where it is, both estimated now (the goodput
    stored with the old allocation came from an older estimate).

    An active job restarts when it held GPUs and now holds different ones (or none);
    `previous` may still list jobs that have finished since (not in `jobs`)."""
    reasons: dict[str, str] = {}
    restarted: list[str] = []
    for i, job in enumerate(jobs):
        prev, now = previous.get(job.job_id), allocations.get(job.job_id)
        if prev is not None and prev.gpus and (now is None or now.gpus != tuple(prev.gpus)):
            restarted.append(job.job_id)
        if now is None:
            if table.count(i) == 0:
                reasons[job.job_id] = "waiting: no allowed GPU type can run it (no estimate)"
            elif prev is not None:
                reasons[job.job_id] = "preempted: its GPUs are worth more to other jobs"
            else:
                reasons[job.job_id] = "waiting: no GPUs free for it this round"
            continue
        n, t = now.config.num_gpus, now.config.gpu_type
        batch = f"batch {now.batch_size}"
        if prev is None:
            reasons[job.job_id] = f"started on {n} {t}, {batch}"
            continue
        if prev.gpus == now.gpus or sorted(prev.gpus) == sorted(now.gpus):
            if prev.batch_size != now.batch_size:
                batch = f"batch {prev.batch_size}→{now.batch_size}"
            reasons[job.job_id] = f"kept {n} {t}, {batch}"
            continue
        pn, pt = prev.config.num_gpus, prev.config.gpu_type
        if pt != t:
            what = f"moved {pn} {pt}→{n} {t}"
        elif pn != n:
            what = f"scaled {pn}→{n} {t}"
        elif prev.config == now.config:
            what = f"moved to other {n} {t}"
        else:
            nodes = now.config.num_nodes
            what = f"repacked {n} {t} onto {nodes} node{'s' if nodes > 1 else ''}"
        reasons[job.job_id] = f"{what}, {batch}{_gain(table, i, prev, now)}"
    return reasons, frozenset(restarted)


def _gain(table: CandidateTable, i: int, prev: JobAllocation, now: JobAllocation) -> str:
    """": goodput +35%" against keeping `prev`'s shape, both as estimated this round."""
    for row in range(int(table.offsets[i]), int(table.offsets[i + 1])):
        if table.config_of(row) == prev.config:
            stay = float(table.goodput[row])
            change = (now.goodput / stay - 1) * 100 if stay > 0 else 0.0
            return f": goodput {change:+.0f}%" if abs(change) >= 0.5 else ""
    return ""
