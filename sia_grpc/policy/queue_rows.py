"""How queues (`sia_grpc.policy.queues`) enter Sia's ILP: priority weights on the
objective, holds for the minimum runtime, and side rows over the candidate table.

For queue q and GPU type t, let u_qt = Σ GPUs of the chosen configurations of q's
jobs on t, and W_qt what q is owed: given `silo` (the round's usual case,
`rounds.silo_use`), what q's jobs hold of t when q's guarantee is a private partition
(Sia on them alone), up to the guarantee; without it (`owed`), what its jobs could
hold together with their largest options, each job counted once, on one type.

    guarantee      u_qt ≥ W_qt                                          soft, penalty M
    units          Σ_t w_t·u_qt ≥ min(guarantee_units_q, D^u_q)        soft, penalty M
    borrowing      u_qt ≤ guarantee_qt + borrow_limit_qt               soft, penalty M
    restarts       Σ_{running jobs that can stay} (1 − x_keep) ≤ R     hard
                   x_keep: the job stays, or — a job of a queue holding less than it is
                   owed — it grows on its type. The budget bounds what a round imposes
                   on running jobs; a queue below its guarantee may grow its own jobs
                   into it besides (else, with a budget of 1, a reclaim that needs a
                   victim's preemption and the reclaimer's growth in one round could
                   never happen: preempting alone gains the reclaimer nothing yet)

M, per GPU short, exceeds what any job's whole term can be worth, so a guarantee
gives way only where no allocation can meet it (a guarantee larger than the
cluster, discrete shapes, held jobs). Rows are over table rows; `rounds.assemble`
maps them onto the problem's columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import PolicyJob

__all__ = ["QueueRows", "SideRows", "guarantee_caps", "job_weights", "min_runtime_holds", "owed",
           "owed_bounds", "per_queue_type", "queue_index", "queue_rows", "queue_usage"]


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

    def subset(self, keep: np.ndarray) -> SideRows:
        """The rows where `keep` (a mask over rows) is true, in their order."""
        at = np.flatnonzero(keep)
        lens = np.diff(self.ptr)[at]
        take = np.concatenate([np.arange(self.ptr[k], self.ptr[k + 1]) for k in at]) \
            if len(at) else np.zeros(0, dtype=np.int64)
        return SideRows(ptr=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                        row=self.row[take], coef=self.coef[take], rhs=self.rhs[at],
                        penalty=self.penalty[at], names=tuple(self.names[k] for k in at))

    def activity(self, picked: np.ndarray) -> np.ndarray:
        """Each row's Σ coef·x at a choice (`picked`: 1.0 on each chosen table row)."""
        if not len(self.row):
            return np.zeros(len(self))
        out = np.add.reduceat(self.coef * picked[self.row], self.ptr[:-1])
        return np.where(np.diff(self.ptr) > 0, out, 0.0)


def job_weights(jobs: Sequence[PolicyJob], queues: QueueSet) -> np.ndarray:
    """Each job's priority-class weight (the factor on its term in the objective)."""
    names = [j.priority for j in jobs]
    weight = {n: queues.weight(n) for n in dict.fromkeys(names)}  # (a lookup per class)
    return np.array([weight[n] for n in names], dtype=float)


def queue_index(jobs, queues: QueueSet) -> np.ndarray:
    """Each job's queue, as its index in `queues.queues` (FieldError naming `queue`
    for a queue the set does not have). A round computes it once and passes it on:
    the lookups, one per job in each of the round's steps, were ~5 % of a round with
    16 queues."""
    index = queues.index
    return np.array([index(j.queue) for j in jobs], dtype=np.int64)


def min_runtime_holds(jobs, current: np.ndarray, queues: QueueSet,
                      qix: np.ndarray) -> np.ndarray:
    """Running jobs younger on their allocation than their queue's minimum runtime:
    they keep it this round (bounded preemption). `qix`: `queue_index`."""
    least = np.array([queues.min_runtime(q.name) for q in queues.queues], dtype=float)
    stint = np.array([j.stint for j in jobs], dtype=float)
    return (np.asarray(current) >= 0) & (stint < least[qix])


def queue_usage(table: CandidateTable, chosen: np.ndarray, queues: QueueSet,
                qix: np.ndarray) -> dict[str, dict[str, int]]:
    """GPUs each queue holds per type in a round's choice (each job's table row, -1:
    none); `qix`: `queue_index`."""
    types = table.cluster.gpu_types
    held = per_queue_type(table, qix, len(queues.queues), _picked_rows(table, chosen))
    return {qu.name: dict(zip(types, held[k].astype(np.int64).tolist(), strict=True))
            for k, qu in enumerate(queues.queues)}


def _picked_rows(table: CandidateTable, chosen: np.ndarray) -> np.ndarray:
    rows = np.zeros(len(table), dtype=bool)
    rows[chosen[chosen >= 0]] = True
    return rows


def queue_rows(table: CandidateTable, qix: np.ndarray, values: np.ndarray,
               none_value: np.ndarray, current: np.ndarray, queues: QueueSet, *,
               restarts_used: int = 0, hold: np.ndarray | None = None,
               silo: dict[str, dict[str, int]] | None = None) -> SideRows:
    """The side rows of one round (`qix`: each job's queue, `queue_index`). `values` are
    the final ones (holds applied: NaN where a row is no option); `none_value` the jobs'
    values of nothing (before holds, to size the penalty); `restarts_used`: restarts an
    earlier stage of the round has spent of the budget; `hold`: the jobs kept where they
    are this round (what they hold of a type is owed to no other queue); `silo`: what
    each queue's jobs hold per type when each queue's guarantee is a private partition
    (`rounds.silo_use`): a queue is owed that, up to its guarantee — what its jobs would
    get were its guaranteed GPUs its own, not their largest shapes. (A round that
    builds them more than once, for different silos, keeps one `QueueRows`.)"""
    return QueueRows(table, qix, values, none_value, current, queues, hold=hold).rows(
        silo=silo, restarts_used=restarts_used)


class QueueRows:
    """`queue_rows` for one round's table, values and holds, built for any silos:
    what does not depend on them (each queue's table rows by type, the units and
    borrowing rows, who can stay) is found once. A round with guarantees builds its
    rows two or three times (`rounds._guaranteed_round`); each build was ~2.7 ms at
    2,000 jobs with 16 queues, most of it this shared part."""

    def __init__(self, table: CandidateTable, qix: np.ndarray, values: np.ndarray,
                 none_value: np.ndarray, current: np.ndarray, queues: QueueSet, *,
                 hold: np.ndarray | None = None) -> None:
        types = table.cluster.gpu_types
        T = len(types)
        job = table.job
        self.table, self.queues, self.types = table, queues, types
        finite = np.isfinite(values)
        self.gpus = gpus = table.gpus().astype(float)
        self.typ = typ = table.types()
        row_q = qix[job]
        worth = float(np.max(np.abs(values[finite]))) if np.any(finite) else 0.0
        worth += float(np.max(np.abs(none_value))) if len(none_value) else 0.0
        self.big = 2.0 * worth + 1.0  # per GPU short: more than any job's whole term can change
        # Entries cover all of a queue's table rows (those that are no option this round
        # drop out as columns, `rounds._side_columns`), so the activity reported at the
        # round's final choice counts rows a later stage took; demand counts options only.
        at_current = (current[job] >= 0) & (table.config == current[job])
        self.cap, self.now = guarantee_caps(table, qix, current, queues, hold)
        unit_w = np.array([queues.unit_weight(t) for t in types])
        units = gpus * unit_w[typ]
        # Each (queue, type)'s table rows, ascending: one stable sort, not a mask over
        # the whole table per queue and type.
        key = row_q * T + typ
        order = np.argsort(key, kind="stable")
        edge = np.searchsorted(key[order], np.arange(len(queues.queues) * T + 1))
        self._rows_of = [[order[edge[k * T + t]:edge[k * T + t + 1]] for t in range(T)]
                         for k in range(len(queues.queues))]
        self._options: list[np.ndarray] = []  # each queue's rows that are options
        # Per queue, its rows after the per-type guarantees: units, then borrowing
        # (table rows, coefficients, rhs, name); and whether it holds less than its
        # units guarantee now.
        self._fixed: list[list[tuple[np.ndarray, np.ndarray, float, str]]] = []
        self._units_below = np.zeros(len(queues.queues), dtype=bool)
        for k, q in enumerate(queues.queues):
            ours = np.sort(order[edge[k * T]:edge[(k + 1) * T]])  # (all its types)
            mine = ours[finite[ours]]
            self._options.append(mine)
            fixed = []
            if q.guarantee_units > 0:
                want = min(q.guarantee_units, _most_per_job(job[mine], units[mine]))
                if want > 0:
                    fixed.append((ours, -units[ours], -float(want), f"guarantee {q.name}/units"))
                    self._units_below[k] = float(self.now[k] @ unit_w) < want
            for t in sorted(q.borrow_limit):
                if t in types:
                    rows = self._rows_of[k][types.index(t)]
                    if len(rows):
                        cap = q.cap(t)
                        assert cap is not None  # (t has a borrow limit)
                        fixed.append((rows, gpus[rows], float(cap), f"borrow {q.name}/{t}"))
            self._fixed.append(fixed)
        self._row_q = row_q
        if queues.max_restarts_per_round is not None:
            cur_type = np.full(table.num_jobs, -1)
            cur_gpus = np.zeros(table.num_jobs)
            cur_type[job[at_current]] = typ[at_current]
            cur_gpus[job[at_current]] = gpus[at_current]
            # Rows on which a job stays (its current one, where that is an option), and
            # on which it grows on its type (counted as staying for a queue below what it
            # is owed).
            self._stays = finite & at_current & np.isin(job, job[at_current & finite])
            self._grows = finite & (typ == cur_type[job]) & (gpus > cur_gpus[job])

    def rows(self, *, silo: dict[str, dict[str, int]] | None = None,
             restarts_used: int = 0) -> SideRows:
        """The round's side rows with these silos (`queue_rows`)."""
        types, queues, table = self.types, self.queues, self.table
        job, gpus, typ = table.job, self.gpus, self.typ
        entries: list[tuple[np.ndarray, np.ndarray]] = []
        rhs, penalty, names = [], [], []

        def add(rows: np.ndarray, coef: np.ndarray, bound: float, cost: float, name: str) -> None:
            entries.append((rows, coef))
            rhs.append(bound)
            penalty.append(cost)
            names.append(name)

        big = self.big
        below = self._units_below.copy()  # holds less than it is owed
        for k, q in enumerate(queues.queues):
            guaranteed = {i: self.cap[k, i] for t, g in q.guarantee.items()
                          if t in types and g > 0 for i in [types.index(t)]}
            # (A queue not in `silo` gets no guarantee rows: `rounds.ilp_round` leaves out
            # the rows of queues that hold at least what they could be owed.)
            if silo is None:
                mine = self._options[k]
                wants = owed(job[mine], typ[mine], gpus[mine], guaranteed)
            else:
                held = silo.get(q.name, {})
                wants = {i: min(g, held.get(types[i], 0)) for i, g in guaranteed.items()}
            for t, want in wants.items():
                if want > 0:
                    rows = self._rows_of[k][t]
                    add(rows, -gpus[rows], -float(want), big, f"guarantee {q.name}/{types[t]}")
                    below[k] |= self.now[k, t] < want
            for rows, coef, bound, name in self._fixed[k]:
                add(rows, coef, bound, big, name)
        if queues.max_restarts_per_round is not None:
            stay = np.flatnonzero(self._stays | (below[self._row_q] & self._grows))
            if len(stay):  # (−Σ x_keep ≤ R − N: of the N jobs that can stay, at most R don't)
                budget = max(queues.max_restarts_per_round - restarts_used, 0)
                counted = np.zeros(table.num_jobs, dtype=bool)
                counted[job[stay]] = True
                n = int(counted.sum())
                add(stay, -np.ones(len(stay)), float(budget - n), np.inf, "restarts")
        ptr = np.concatenate([[0], np.cumsum([len(r) for r, _ in entries])]).astype(np.int64)
        row = np.concatenate([r for r, _ in entries]).astype(np.int64) if entries \
            else np.zeros(0, dtype=np.int64)
        coef = np.concatenate([c for _, c in entries]).astype(float) if entries else np.zeros(0)
        return SideRows(ptr=ptr, row=row, coef=coef, rhs=np.array(rhs, dtype=float),
                        penalty=np.array(penalty, dtype=float), names=tuple(names))


def guarantee_caps(table: CandidateTable, qix: np.ndarray, current: np.ndarray,
                   queues: QueueSet, hold: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(cap, now) per (queue, type index): the queue's guarantee of the type as far as
    the round can give it (what jobs of other queues held where they are leave of
    the type: `hold`), 0 where it has none; and the GPUs its jobs hold now. `qix`:
    each job's queue index."""
    types = table.cluster.gpu_types
    job = table.job
    at_current = (current[job] >= 0) & (table.config == current[job])
    kept = per_queue_type(table, qix, len(queues.queues), at_current & _held(hold, job))
    now = per_queue_type(table, qix, len(queues.queues), at_current)
    free = np.array([table.cluster.capacity[t] for t in types], dtype=float) - kept.sum(axis=0)
    cap = np.zeros_like(now)
    for k, q in enumerate(queues.queues):
        for t, g in q.guarantee.items():
            if t in types and g > 0:
                i = types.index(t)
                cap[k, i] = min(g, free[i] + kept[k, i])
    return cap, now


def owed_bounds(table: CandidateTable, qix: np.ndarray, values: np.ndarray,
                cap: np.ndarray) -> np.ndarray:
    """Per (queue, type index), at least what the queue can be owed of the type with
    its silo (`rounds.silo_use`): its `cap`, or less where its jobs' options could
    not use that many (Σ over its jobs of each one's largest option of the type —
    each job counted on every type, so a bound, not a packing)."""
    T = len(table.cluster.gpu_types)
    finite = np.flatnonzero(np.isfinite(values))
    largest = np.zeros(table.num_jobs * T)
    np.maximum.at(largest, table.job[finite] * T + table.types()[finite],
                  table.gpus()[finite].astype(float))
    demand = np.zeros_like(cap)
    np.add.at(demand, qix, largest.reshape(table.num_jobs, T))
    return np.minimum(cap, demand)


def owed(job: np.ndarray, typ: np.ndarray, amount: np.ndarray,
         guarantee: dict[int, float]) -> dict[int, float]:
    """How much of each guaranteed type (index -> GPUs) a queue's jobs could hold
    together this round, each job counted once, on one type, with its largest option
    there (rows `job`, `typ`, `amount`: the queue's options). Greedy: the jobs with the
    fewest guaranteed types they can use go first, larger ones first among equals;
    each covers the type with the most guarantee left. With one guaranteed type this
    is min(guarantee, Σ largest options), exactly."""
    if not guarantee or len(job) == 0:
        return dict.fromkeys(guarantee, 0.0)
    best: dict[int, dict[int, float]] = {}  # job -> type -> its largest option there
    for j, t, a in zip(job.tolist(), typ.tolist(), amount.tolist(), strict=True):
        if t in guarantee:
            per = best.setdefault(j, {})
            per[t] = max(per.get(t, 0.0), a)
    left = {t: float(g) for t, g in guarantee.items()}
    order = sorted(best, key=lambda j: (len(best[j]), -max(best[j].values()), j))
    for j in order:
        t = max(best[j], key=lambda t: (left[t], -t))
        left[t] -= min(best[j][t], left[t])
    return {t: float(guarantee[t]) - left[t] for t in guarantee}


def _held(hold: np.ndarray | None, job: np.ndarray) -> np.ndarray:
    return np.zeros(len(job), dtype=bool) if hold is None else hold[job]


def per_queue_type(table: CandidateTable, qix: np.ndarray, n_queues: int,
                    rows: np.ndarray) -> np.ndarray:
    """GPUs per (queue, type) over the table rows where `rows` is true."""
    out = np.zeros((n_queues, len(table.cluster.gpu_types)))
    at = np.flatnonzero(rows)
    np.add.at(out, (qix[table.job[at]], table.types()[at]), table.gpus()[at])
    return out


def _most_per_job(job: np.ndarray, amount: np.ndarray) -> float:
    """Σ over jobs of each job's largest `amount` (rows grouped by job, as the
    candidate table keeps them)."""
    if len(job) == 0:
        return 0.0
    starts = np.flatnonzero(np.concatenate([[True], job[1:] != job[:-1]]))
    return float(np.maximum.reduceat(amount, starts).sum())
