"""What every policy shares after estimating: assemble the ILP, solve it, place
the chosen configurations on physical GPUs, and explain the outcome."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from sia_grpc.policy.candidates import Candidates
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.placer import place
from sia_grpc.policy.problem import ChoiceProblem
from sia_grpc.policy.solvers import solve, solve_reference
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult


def finish_round(cluster: Cluster, chosen: Mapping[str, tuple[Candidates, int]],
                 previous: Mapping[str, JobAllocation], *, objective: float,
                 timings: dict[str, float], solver_stats: Mapping[str, float] | None = None,
                 reasons: Mapping[str, str] | None = None) -> RoundResult:
    """`chosen` maps job id → (its candidates, index of the chosen one)."""
    t0 = time.perf_counter()
    configs = {j: cands.configs[k] for j, (cands, k) in chosen.items()}
    placed = place(cluster, configs, {j: a.gpus for j, a in previous.items() if a.gpus})
    allocations = {
        j: JobAllocation(
            config=cands.configs[k],
            gpus=placed.placements[j],
            num_replicas=int(cands.replicas[k]),
            batch_size=int(cands.batch_size[k]),
            atomic_bsz=int(cands.atomic_bsz[k]),
            accum_steps=int(cands.accum_steps[k]),
            goodput=float(cands.goodput[k]),
        )
        for j, (cands, k) in chosen.items()
    }
    # A job restarts when it held GPUs and now holds different ones (or none).
    restarted = frozenset(
        j for j, prev in previous.items()
        if prev.gpus and (j not in allocations or allocations[j].gpus != tuple(prev.gpus))
    )
    timings["place"] = time.perf_counter() - t0
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    return RoundResult(allocations=allocations, restarted=restarted, objective=objective,
                       timings=dict(timings), solver_stats=dict(solver_stats or {}),
                       reasons=dict(reasons or {}))


REFERENCE_SOLVERS = {"glpk_mi": "GLPK_MI", "cvxpy-highs": "HIGHS"}


def assemble(cluster: Cluster, jobs: Sequence[PolicyJob], cands: Sequence[Candidates],
             values: Sequence[np.ndarray], none_value: float,
             previous: Mapping[str, JobAllocation],
             ) -> tuple[ChoiceProblem, np.ndarray, np.ndarray]:
    """Build the ChoiceProblem from each job's candidate values (NaN = not an option).

    Returns the problem, `col_owner` (column → index into its job's candidates)
    and `start`: last round's configuration as a column per job, -1 where it has
    none, for the solver's warm start.
    """
    type_index = {t: k for k, t in enumerate(cluster.gpu_types)}
    owner_parts: list[np.ndarray] = []
    job_parts: list[np.ndarray] = []
    start = np.full(len(jobs), -1, dtype=np.int64)
    n_cols = 0
    for i, (job, c, val) in enumerate(zip(jobs, cands, values, strict=True)):
        keep = np.flatnonzero(np.isfinite(val))
        cur = previous.get(job.job_id)
        if cur is not None:
            for pos, k in enumerate(keep):
                if c.configs[k] == cur.config:
                    start[i] = n_cols + pos
                    break
        owner_parts.append(keep)
        job_parts.append(np.full(len(keep), i, dtype=np.int64))
        n_cols += len(keep)
    owner = np.concatenate(owner_parts) if owner_parts else np.zeros(0, dtype=np.int64)
    col_job = np.concatenate(job_parts) if job_parts else np.zeros(0, dtype=np.int64)
    confs = [cands[i].configs[k] for i, k in zip(col_job, owner, strict=True)]
    problem = ChoiceProblem(
        num_jobs=len(jobs),
        col_job=col_job,
        col_type=np.array([type_index[c.gpu_type] for c in confs], dtype=np.int64),
        col_gpus=np.array([c.num_gpus for c in confs], dtype=np.int64),
        col_value=(np.concatenate([v[np.isfinite(v)] for v in values]).astype(np.float64)
                   if values else np.zeros(0)),
        none_value=np.full(len(jobs), float(none_value)),
        capacity=np.array([cluster.capacity[t] for t in cluster.gpu_types], dtype=np.int64),
    )
    return problem, owner, start


def solve_and_finish(cluster: Cluster, jobs: Sequence[PolicyJob], cands: Sequence[Candidates],
                     problem: ChoiceProblem, col_owner: np.ndarray, start: np.ndarray,
                     previous: Mapping[str, JobAllocation], timings: dict[str, float], *,
                     time_limit: float, rel_gap: float, solver: str = "highs") -> RoundResult:
    """Solve the problem, place the winners, and explain each job's outcome.

    `solver` is "highs" (the production path) or a reference path, "glpk_mi" or
    "cvxpy-highs" (the same ILP through CVXPY), for comparison and benchmarks.
    """
    t0 = time.perf_counter()
    if solver == "highs":
        sol = solve(problem, time_limit=time_limit, rel_gap=rel_gap, start=start)
    elif solver in REFERENCE_SOLVERS:
        sol = solve_reference(problem, solver=REFERENCE_SOLVERS[solver], time_limit=time_limit)
    else:
        raise ValueError(f"solver: unknown {solver!r}; choose highs, {', '.join(REFERENCE_SOLVERS)}")
    timings["solve"] = time.perf_counter() - t0
    chosen: dict[str, tuple[Candidates, int]] = {}
    for i, job in enumerate(jobs):
        if sol.choice[i] >= 0:
            chosen[job.job_id] = (cands[i], int(col_owner[sol.choice[i]]))
    return finish_round(cluster, chosen, previous, objective=sol.objective, timings=timings,
                        solver_stats={**sol.stats, "gap": sol.gap},
                        reasons=explain(jobs, cands, chosen, previous))


def explain(jobs: Sequence[PolicyJob], cands: Sequence[Candidates],
            chosen: Mapping[str, tuple[Candidates, int]],
            previous: Mapping[str, JobAllocation]) -> dict[str, str]:
    """A human-readable reason for each job's outcome this round."""
    reasons: dict[str, str] = {}
    for job, c in zip(jobs, cands, strict=True):
        prev = previous.get(job.job_id)
        if job.job_id not in chosen:
            if len(c) == 0:
                reasons[job.job_id] = "waiting: no allowed GPU type can run it (no estimate)"
            elif prev is not None:
                reasons[job.job_id] = "preempted: its GPUs are worth more to other jobs"
            else:
                reasons[job.job_id] = "waiting: no GPUs free for it this round"
            continue
        cands_i, k = chosen[job.job_id]
        conf = cands_i.configs[k]
        now = f"{conf.num_gpus} {conf.gpu_type}"
        batch = int(cands_i.batch_size[k])
        if prev is None:
            reasons[job.job_id] = f"started on {now}, batch {batch}"
        elif prev.config == conf:
            reasons[job.job_id] = f"kept {now}, batch {batch}"
        else:
            gain = (cands_i.goodput[k] / prev.goodput - 1) * 100 if prev.goodput > 0 else None
            verb = "scaled" if prev.config.gpu_type == conf.gpu_type else "moved"
            tail = f": goodput {gain:+.0f}%" if gain is not None else ""
            reasons[job.job_id] = (f"{verb} {prev.config.num_gpus} {prev.config.gpu_type}"
                                   f"→{now}, batch {batch}{tail}")
    return reasons
