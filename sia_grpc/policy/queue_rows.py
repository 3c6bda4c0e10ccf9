"""How queues (`sia_grpc.policy.queues`) enter Sia's ILP: priority weights on the
objective, holds for the minimum runtime, and side rows over the candidate table.

For queue q and GPU type t, let u_qt = Σ GPUs of the chosen configurations of q's
jobs on t, and D_qt = Σ over q's jobs of the most GPUs of t it could take this
round (its largest option on t: what "could use" means, with Sia's at-most-2×
growth per round and holds included).

    guarantee      u_qt ≥ min(guarantee_qt, D_qt)                     soft, penalty M
    units          Σ_t w_t·u_qt ≥ min(guarantee_units_q, D^u_q)        soft, penalty M
    borrowing      u_qt ≤ guarantee_qt + borrow_limit_qt               soft, penalty M
    restarts       Σ_{running jobs that can stay} (1 − x_stay) ≤ R     hard

M, per GPU short, exceeds what any job's whole term can be worth, so a guarantee
gives way only where no allocation can meet it (a guarantee larger than the
cluster, discrete shapes, held jobs). Rows are over table rows; `rounds.assemble`
maps them onto the problem's columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import PolicyJob

__all__ = ["SideRows", "job_weights", "min_runtime_holds", "queue_rows", "queue_usage"]


@dataclass(frozen=True, eq=False)
class SideRows:
    """Rows Σ coef·x ≤ rhs over table rows (CSR), each with a penalty per unit of
    excess (inf: hard) and a name for explanations and traces."""

    ptr: np.ndarray  # int64[n + 1]
    row: np.ndarray  # int64[nnz]: table row of each entry
    coef: np.ndarray  # float64[nnz]
    rhs: np.ndarray  # float64[n]
    penalty: np.ndarray  # float64[n]
    names: tuple[str, ...]  # "guarantee research/rtx", "borrow research/rtx", ...

    def __len__(self) -> int:
        return len(self.rhs)


def job_weights(jobs: list[PolicyJob] | tuple[PolicyJob, ...], queues: QueueSet) -> np.ndarray:
    """Each job's priority-class weight (the factor on its term in the objective)."""
    return np.array([queues.weight(j.priority) for j in jobs], dtype=float)


def min_runtime_holds(jobs, current: np.ndarray, queues: QueueSet) -> np.ndarray:
    """Running jobs younger on their allocation than their queue's minimum runtime:
    they keep it this round (bounded preemption)."""
    return np.array([current[i] >= 0 and j.stint < queues.min_runtime(j.queue)
                     for i, j in enumerate(jobs)], dtype=bool)


def queue_usage(table: CandidateTable, jobs, chosen: dict[str, int],
                queues: QueueSet) -> dict[str, dict[str, int]]:
    """GPUs each queue holds per type in a round's choice (job id -> table row)."""
    types = table.cluster.gpu_types
    out = {q.name: dict.fromkeys(types, 0) for q in queues.queues}
    index = {j.job_id: j for j in jobs}
    gpus, typ = table.gpus(), table.types()
    for job_id, row in chosen.items():
        job = index.get(job_id)
        if job is not None:
            out[queues.queue(job.queue).name][types[typ[row]]] += int(gpus[row])
    return out


def queue_rows(table: CandidateTable, jobs, values: np.ndarray, none_value: np.ndarray,
               current: np.ndarray, queues: QueueSet, *, restarts_used: int = 0) -> SideRows:
    """The side rows of one round. `values` are the final ones (holds applied: NaN
    where a row is no option); `none_value` the jobs' values of nothing (before holds,
    to size the penalty); `restarts_used`: restarts an earlier stage of the round has
    spent of the budget."""
    types = table.cluster.gpu_types
    job = table.job
    finite = np.isfinite(values)
    gpus = table.gpus().astype(float)
    typ = table.types()
    qix = np.array([_queue_index(queues, j.queue) for j in jobs], dtype=np.int64)
    row_q = qix[job]
    worth = float(np.max(np.abs(values[finite]))) if np.any(finite) else 0.0
    worth += float(np.max(np.abs(none_value))) if len(none_value) else 0.0
    big = 2.0 * worth + 1.0  # per GPU short: more than any job's whole term can change
    entries: list[tuple[np.ndarray, np.ndarray]] = []
    rhs, penalty, names = [], [], []

    def add(rows: np.ndarray, coef: np.ndarray, bound: float, cost: float, name: str) -> None:
        entries.append((rows, coef))
        rhs.append(bound)
        penalty.append(cost)
        names.append(name)

    for k, q in enumerate(queues.queues):
        mine = finite & (row_q == k)
        for t, g in sorted(q.guarantee.items()):
            if t not in types or g <= 0:
                continue
            on_t = mine & (typ == types.index(t))
            demand = _most_per_job(job[on_t], gpus[on_t])
            want = min(g, demand)
            if want > 0:
                rows = np.flatnonzero(on_t)
                add(rows, -gpus[rows], -float(want), big, f"guarantee {q.name}/{t}")
        if q.guarantee_units > 0:
            w = np.array([queues.unit_weight(t) for t in types])[typ]
            units = gpus * w
            demand = _most_per_job(job[mine], units[mine])
            want = min(q.guarantee_units, demand)
            if want > 0:
                rows = np.flatnonzero(mine)
                add(rows, -units[rows], -float(want), big, f"guarantee {q.name}/units")
        for t in sorted(q.borrow_limit):
            if t not in types:
                continue
            rows = np.flatnonzero(mine & (typ == types.index(t)))
            if len(rows):
                add(rows, gpus[rows], float(q.cap(t)), big, f"borrow {q.name}/{t}")
    if queues.max_restarts_per_round is not None:
        stay = np.flatnonzero(finite & (current[job] >= 0) & (table.config == current[job]))
        if len(stay):  # (−Σ x_stay ≤ R − N: the jobs that can stay, at most R leave it)
            budget = max(queues.max_restarts_per_round - restarts_used, 0)
            add(stay, -np.ones(len(stay)), float(budget - len(stay)), np.inf, "restarts")
    ptr = np.concatenate([[0], np.cumsum([len(r) for r, _ in entries])]).astype(np.int64)
    row = np.concatenate([r for r, _ in entries]).astype(np.int64) if entries \
        else np.zeros(0, dtype=np.int64)
    coef = np.concatenate([c for _, c in entries]).astype(float) if entries else np.zeros(0)
    return SideRows(ptr=ptr, row=row, coef=coef, rhs=np.array(rhs, dtype=float),
                    penalty=np.array(penalty, dtype=float), names=tuple(names))


def _most_per_job(job: np.ndarray, amount: np.ndarray) -> float:
    """Σ over jobs of each job's largest `amount` (rows grouped by job, as the
    candidate table keeps them)."""
    if len(job) == 0:
        return 0.0
    starts = np.flatnonzero(np.concatenate([[True], job[1:] != job[:-1]]))
    return float(np.maximum.reduceat(amount, starts).sum())


def _queue_index(queues: QueueSet, name: str) -> int:
    q = queues.queue(name)
    return next(k for k, x in enumerate(queues.queues) if x is q)
