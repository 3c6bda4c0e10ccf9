"""The solver with queue rows: random queues over a `ChoiceProblem` (per-type
guarantees as soft ≥ rows, borrowing limits and a restart budget as hard ≤ rows,
a type-flexible guarantee per queue as a soft ≥ row), Sia's rounds at scale
with such queues, and `run`: how long `solve` takes on them beside the same
instances without the rows."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.problem import ChoiceProblem


@dataclass(frozen=True)
class QueueShape:
    """How `draw_queues` draws queues (shares are of each type's capacity)."""

    num_queues: int = 16
    guarantee_share: tuple[float, float] = (0.3, 0.9)  # of capacity, over all queues
    guarantee_penalty: float = 1.0  # per GPU short of a guarantee
    borrow_prob: float = 0.5  # chance that a queue has borrowing limits
    borrow_share: tuple[float, float] = (0.0, 0.3)  # B as a share of capacity
    # Per GPU over g + B (inf: a hard row). The policy's borrowing rows are soft
    # at more than any job's whole term can change (values here are in [-2, 0]).
    borrow_penalty: float = 5.0
    units_share: tuple[float, float] = (0.5, 1.0)  # U as a share of the weighted guarantees
    units_penalty: float = 0.5  # per unit short of the type-flexible guarantee
    restart_share: float | None = 0.05  # budget as a share of the jobs (None: no row)
    # The budget over the running jobs that do not keep their configuration (as
    # the policy's), or over those that move to another one.
    count_preemptions: bool = True
    # Guarantees in proportion to each queue's share of the jobs (as an operator
    # would set them), or drawn apart from it (queues guaranteed far more or
    # less than their jobs could use: many rows bind).
    proportional: bool = True


@dataclass(frozen=True)
class Queues:
    """Queues over a set of jobs and GPU types."""

    queue: np.ndarray  # int64[num_jobs]: each job's queue
    guarantee: np.ndarray  # float64[Q, T]: g (0: none)
    borrow: np.ndarray  # float64[Q, T]: B (inf: no borrowing limit)
    weight: np.ndarray  # float64[T]: w_t of the type-flexible guarantee
    units: np.ndarray  # float64[Q]: U (0: none)
    restart_budget: float | None  # R (None: no restart row)
    guarantee_penalty: float
    units_penalty: float
    borrow_penalty: float = np.inf


def draw_queues(rng: np.random.Generator, num_jobs: int, capacity: np.ndarray,
                shape: QueueShape = QueueShape()) -> Queues:
    """Random queues: jobs spread over them unevenly, guarantees adding up to a
    share of each type's capacity, borrowing limits for some queues."""
    Q, T = shape.num_queues, len(capacity)
    cap = np.asarray(capacity, dtype=np.float64)
    jobs_share = rng.dirichlet(np.full(Q, 2.0 if shape.proportional else 1.0))
    split = (jobs_share[:, None] * rng.uniform(0.7, 1.3, size=(Q, T)) if shape.proportional
             else rng.dirichlet(np.ones(Q), size=T).T)
    g = np.floor(rng.uniform(*shape.guarantee_share, size=T) * cap * split)
    b = np.where(rng.random(Q)[:, None] < shape.borrow_prob,
                 np.floor(rng.uniform(*shape.borrow_share, size=(Q, 1)) * cap), np.inf)
    weight = rng.uniform(0.5, 1.5, size=T)
    units = np.floor(rng.uniform(*shape.units_share, size=Q) * (g @ weight))
    budget = None if shape.restart_share is None else np.floor(shape.restart_share * num_jobs)
    return Queues(queue=rng.choice(Q, size=num_jobs, p=jobs_share),
                  guarantee=g, borrow=b, weight=weight, units=units, restart_budget=budget,
                  guarantee_penalty=shape.guarantee_penalty, units_penalty=shape.units_penalty,
                  borrow_penalty=shape.borrow_penalty)


def queue_rows(p: ChoiceProblem, qs: Queues, current: np.ndarray | None = None,
               count_preemptions: bool = False) -> ChoiceProblem:
    """`p` with the queues' rows: per queue and type Σ GPUs ≥ g (soft; g capped
    at what the queue's jobs could hold, so that an unusable guarantee costs
    nothing) and Σ GPUs ≤ g + B (hard, or soft at `borrow_penalty`); per queue
    Σ_t w_t · GPUs ≥ U (soft, capped the same way); and, given each job's
    current column (-1: not running), a restart budget (hard): at most R
    running jobs move to another column, or with `count_preemptions` at most R
    running jobs do not keep their current column (stopping counts too: a ≥
    row, −Σ x_current ≤ R − running, as the policy builds it)."""
    Q, T = qs.guarantee.shape
    cq = qs.queue[p.col_job]
    gpus = p.col_gpus.astype(np.float64)
    # The most GPUs of each type, and weighted units, each queue could hold.
    most = np.zeros((p.num_jobs, T))
    np.maximum.at(most, (p.col_job, p.col_type), gpus)
    usable = np.zeros((Q, T))
    np.add.at(usable, qs.queue, most)
    units_usable = np.zeros(Q)
    np.add.at(units_usable, qs.queue, (most * qs.weight).max(axis=1))
    rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []  # cols, coefs, rhs, penalty
    for q in range(Q):
        for t in range(T):
            cols = np.flatnonzero((cq == q) & (p.col_type == t))
            g = min(qs.guarantee[q, t], usable[q, t])
            if g > 0:
                rows.append((cols, -gpus[cols], -g, qs.guarantee_penalty))
            if np.isfinite(qs.borrow[q, t]):
                rows.append((cols, gpus[cols], qs.guarantee[q, t] + qs.borrow[q, t],
                             qs.borrow_penalty))
        u = min(qs.units[q], units_usable[q])
        if u > 0:
            cols = np.flatnonzero(cq == q)
            rows.append((cols, -qs.weight[p.col_type[cols]] * gpus[cols], -u, qs.units_penalty))
    if qs.restart_budget is not None and current is not None:
        stay = current[current >= 0]
        if count_preemptions:
            rows.append((stay, -np.ones(len(stay)), qs.restart_budget - len(stay), np.inf))
        else:
            cur = current[p.col_job]
            cols = np.flatnonzero((cur >= 0) & (cur != np.arange(p.num_cols)))
            rows.append((cols, np.ones(len(cols)), qs.restart_budget, np.inf))
    return add_rows(p, rows)


def add_rows(p: ChoiceProblem, rows) -> ChoiceProblem:
    """`p` with side rows given as (columns, coefficients, rhs, penalty) each."""
    def cat(k: int, dt) -> np.ndarray:
        return np.concatenate([r[k] for r in rows]).astype(dt) if rows else np.zeros(0, dt)

    return ChoiceProblem(
        p.num_jobs, p.col_job, p.col_type, p.col_gpus, p.col_value, p.none_value, p.capacity,
        row_ptr=np.concatenate([[0], np.cumsum([len(r[0]) for r in rows])]).astype(np.int64),
        row_col=cat(0, np.int64), row_coef=cat(1, np.float64),
        row_rhs=np.asarray([r[2] for r in rows], dtype=np.float64),
        row_penalty=np.asarray([r[3] for r in rows], dtype=np.float64))


def queue_rounds(rounds: int, *, scale: int = 32, num_jobs: int = 2000, seed: int = 0,
                 shape: QueueShape = QueueShape(), warmup: int = 1, solve_kw=None):
    """Sia's rounds on the paper's cluster scaled `scale`× (32: 2,048 GPUs) with
    queues: each round's ILP is built as `SiaPolicy` builds it, given the
    queues' rows and solved, and its answer placed and fed back (so the current
    configurations are the last round's answer under the same queues). Yields
    (problem without rows, with rows, start) for the rounds after `warmup`."""
    from sia_grpc.bench.scenarios import sample_jobs
    from sia_grpc.policy.candidates import build_candidates, current_index
    from sia_grpc.policy.cluster import paper_hetero_cluster
    from sia_grpc.policy.ilp import assemble
    from sia_grpc.policy.result import finish_round
    from sia_grpc.policy.sia import SiaPolicy
    from sia_grpc.policy.solvers import solve

    rng = np.random.default_rng(seed)
    cluster = paper_hetero_cluster(scale)
    jobs = sample_jobs(rng, num_jobs, cluster)
    policy = SiaPolicy()
    cfg = policy.config
    capacity = np.array([cluster.capacity[t] for t in cluster.gpu_types], dtype=np.int64)
    qs = draw_queues(rng, num_jobs, capacity, shape)
    previous: dict = {}
    for k in range(warmup + rounds):
        table = build_candidates(cluster, jobs, previous, max_scale_up=cfg.max_scale_up)
        current = current_index(cluster, jobs, previous)
        vals = policy.values(table, jobs, current)
        plain, rows, start = assemble(table, vals, -cfg.lambda_, current)
        cur = current[plain.col_job]
        stay = np.flatnonzero((cur >= 0) & (table.config[rows] == cur))
        cur_col = np.full(plain.num_jobs, -1, dtype=np.int64)
        cur_col[plain.col_job[stay]] = stay
        q = queue_rows(plain, qs, cur_col, shape.count_preemptions)
        sol = solve(q, start=start, **(solve_kw or {}))
        if k >= warmup:
            yield plain, q, start
        on = np.flatnonzero(sol.choice >= 0)
        by_job = {jobs[i].job_id: int(rows[sol.choice[i]]) for i in on}
        result = finish_round(table, jobs, by_job, previous, objective=sol.objective,
                              timings={})
        previous = dict(result.allocations)
        jobs = [dataclasses.replace(j, age=j.age + policy.round_duration,
                                    num_restarts=j.num_restarts + (j.job_id in result.restarted))
                for j in jobs]


def _pct(xs: list[float]) -> dict[str, float]:
    return {"p50": float(np.percentile(xs, 50)), "p95": float(np.percentile(xs, 95))}


def run(rounds: int = 20, *, scale: int = 32, num_jobs: int = 2000, seed: int = 0,
        shape: QueueShape = QueueShape()) -> dict:
    """`solve` on each round of `queue_rounds`, with the queues' rows and on the
    same instance without them (each with the round's start). Returns the
    seconds (p50, p95) of both, and the paths and gaps taken with the rows."""
    from sia_grpc.policy.solvers import path_name, solve

    plain_s, rows_s, paths, gaps, nrows = [], [], [], [], []
    for plain, q, start in queue_rounds(rounds, scale=scale, num_jobs=num_jobs, seed=seed,
                                        shape=shape):
        t0 = time.perf_counter()
        solve(plain, start=start)
        plain_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sol = solve(q, start=start)
        rows_s.append(time.perf_counter() - t0)
        paths.append(path_name(sol.stats))
        gaps.append(sol.gap)
        nrows.append(q.num_rows)
    return {"rounds": rounds, "gpus": int(64 * scale), "jobs": num_jobs,
            "rows": int(np.median(nrows)), "plain_s": _pct(plain_s), "rows_s": _pct(rows_s),
            "ratio_p95": _pct(rows_s)["p95"] / _pct(plain_s)["p95"],
            "paths": {k: paths.count(k) for k in sorted(set(paths))},
            "max_gap": float(max(gaps))}


def policy_queues(rng: np.random.Generator, cluster, num_queues: int = 16,
                  share: float = 0.7, restart_share: float | None = 0.05,
                  num_jobs: int = 2000):
    """A QueueSet as an operator would set it: `share` of each type guaranteed
    over `num_queues` queues in uneven shares, half of them with borrowing
    limits, every fourth with a type-flexible guarantee, a restart budget of
    `restart_share` of the jobs a round (None: none); and each queue's share of
    the jobs (to assign them)."""
    from sia_grpc.policy.queues import Queue, QueueSet

    split = rng.dirichlet(np.full(num_queues, 2.0))
    queues = []
    for k in range(num_queues):
        g = {t: int(share * cluster.capacity[t] * split[k]) for t in cluster.gpu_types}
        limit = ({t: int(0.2 * cluster.capacity[t]) for t in cluster.gpu_types}
                 if k % 2 else {})
        queues.append(Queue(f"q{k}", guarantee=g, borrow_limit=limit,
                            guarantee_units=float(sum(g.values())) / 4 if k % 4 == 0 else 0.0))
    budget = None if restart_share is None else int(restart_share * num_jobs)
    return QueueSet(queues=tuple(queues), max_restarts_per_round=budget), split


def run_policy(rounds: int = 10, *, scale: int = 32, num_jobs: int = 2000,
               num_queues: int = 16, seed: int = 0, warmup: int = 1,
               restart_share: float | None = 0.05) -> dict:
    """The whole Sia policy call with `num_queues` queues (`policy_queues`, with
    `restart_share`) round after round, and without queues on each round's same
    jobs and previous allocations: seconds (p50, p95) of both and of their solves."""
    from sia_grpc.bench.scenarios import sample_jobs
    from sia_grpc.policy.cluster import paper_hetero_cluster
    from sia_grpc.policy.sia import SiaPolicy
    from sia_grpc.policy.types import warm_arg

    rng = np.random.default_rng(seed)
    cluster = paper_hetero_cluster(scale)
    qs, split = policy_queues(rng, cluster, num_queues, num_jobs=num_jobs,
                              restart_share=restart_share)
    names = [q.name for q in qs.queues]
    jobs = [dataclasses.replace(j, queue=names[int(k)]) for j, k in
            zip(sample_jobs(rng, num_jobs, cluster), rng.choice(num_queues, size=num_jobs,
                                                                 p=split), strict=True)]
    policy = SiaPolicy()
    out: dict[str, list[float]] = {"queues": [], "plain": [], "queues_solve": [],
                                   "plain_solve": []}
    silos: list[float] = []  # silos solved a round (of the queues with guarantees)
    passes: list[float] = []  # shared solves a round (`lazy_rows.guaranteed_round`)
    previous: dict = {}
    # Each call starts from the last of its kind, as the controller's and simulator's
    # rounds do (without queues: the last round's capacity prices).
    warm = plain_warm = None
    for k in range(warmup + rounds):
        t0 = time.perf_counter()
        res = policy.optimize(cluster, jobs, previous, queues=qs, warm=warm)
        warm = res.warm
        t_q = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = policy.optimize(cluster, jobs, previous, **warm_arg(policy, plain_warm))
        plain_warm = plain.warm
        t_p = time.perf_counter() - t0
        if k >= warmup:
            out["queues"].append(t_q)
            out["plain"].append(t_p)
            out["queues_solve"].append(res.timings.get("solve", 0.0))
            out["plain_solve"].append(plain.timings.get("solve", 0.0))
            silos.append(res.solver_stats.get("silo_solves", 0.0))
            passes.append(res.solver_stats.get("queue_passes", 1.0))
        previous = dict(res.allocations)
        jobs = [dataclasses.replace(j, age=j.age + policy.round_duration,
                                    num_restarts=j.num_restarts + (j.job_id in res.restarted),
                                    stint=(j.stint + policy.round_duration
                                           if j.job_id in previous
                                           and j.job_id not in res.restarted else 0.0))
                for j in jobs]
    stats = {k: _pct(v) for k, v in out.items()}
    return {"rounds": rounds, "gpus": int(64 * scale), "jobs": num_jobs, "num_queues": num_queues,
            "restart_budget": qs.max_restarts_per_round,
            **stats, "ratio_p95": stats["queues"]["p95"] / stats["plain"]["p95"],
            "silos_solved": {"p50": float(np.median(silos)), "max": float(max(silos))},
            "passes": {"p50": float(np.median(passes)), "max": float(max(passes))}}
