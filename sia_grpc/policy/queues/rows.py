"""How queues (`queues.model`) enter Sia's ILP: priority weights on the objective,
holds for the minimum runtime, and side rows over the candidate table.

For queue q and GPU type t, let u_qt = Σ GPUs of the chosen configurations of q's
jobs on t, and W_qt what q is owed: given `silo` (the round's usual case,
`silos.silo_use`), what q's jobs hold of t when q's guarantee is a private partition
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
cluster, discrete shapes, held jobs). Rows are over table rows; `ilp.assemble`
maps them onto the problem's columns. The table and the jobs are read through
Protocols (`Table`, `QueuedJob`): `policy.types` names `QueueSet`, and the candidate
table imports `policy.types`, so importing either here would be a circle.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.queues.model import Queue, QueueSet

__all__ = ["UNITS", "QueueRows", "QueuedJob", "SideRows", "Table", "guarantee_caps",
           "job_weights", "min_runtime_holds", "owed", "owed_bounds", "per_queue_type",
           "queue_index", "queue_rows", "queue_usage", "row_binds"]

UNITS = "units"  # the "type" of a type-flexible guarantee row: "guarantee research/units"

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


class Table(Protocol):
    """What the rows read of a round's candidate table (`candidates.CandidateTable`):
    each row a job's candidate configuration."""

    @property
    def cluster(self) -> Cluster: ...
    @property
    def config(self) -> Ints: ...  # each row's index into cluster.configs
    @property
    def job(self) -> Ints: ...  # each row's job index
    @property
    def num_jobs(self) -> int: ...
    def __len__(self) -> int: ...
    def gpus(self) -> Ints: ...  # each row's GPU count
    def types(self) -> Ints: ...  # each row's type, an index into cluster.gpu_types


class QueuedJob(Protocol):
    """What the rows read of a job (`types.PolicyJob`)."""

    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> str: ...
    @property
    def stint(self) -> float: ...  # seconds on its current allocation


@dataclass(frozen=True, eq=False)
class SideRows:
    """Rows Σ coef·x ≤ rhs over table rows (CSR), each with a penalty per unit of
    excess (inf: hard) and a name for explanations and traces."""

    ptr: Ints  # [n + 1]
    row: Ints  # [nnz]: table row of each entry
    coef: Floats  # [nnz]
    rhs: Floats  # [n]
    penalty: Floats  # [n]
    names: tuple[str, ...]  # "guarantee research/rtx", "borrow research/rtx", ...

    def __len__(self) -> int:
        return len(self.rhs)

    def subset(self, keep: Bools) -> SideRows:
        """The rows where `keep` (a mask over rows) is true, in their order."""
        at = np.flatnonzero(keep)
        lens = np.diff(self.ptr)[at]
        take = np.concatenate([np.arange(self.ptr[k], self.ptr[k + 1]) for k in at]) \
            if len(at) else np.zeros(0, dtype=np.int64)
        return SideRows(ptr=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                        row=self.row[take], coef=self.coef[take], rhs=self.rhs[at],
                        penalty=self.penalty[at], names=tuple(self.names[k] for k in at))

    def activity(self, picked: Floats) -> Floats:
        """Each row's Σ coef·x at a choice (`picked`: 1.0 on each chosen table row)."""
        if not len(self.row):
            return np.zeros(len(self))
        out = np.add.reduceat(self.coef * picked[self.row], self.ptr[:-1])
        return np.where(np.diff(self.ptr) > 0, out, 0.0)


def row_binds(activity: float, bound: float) -> bool:
    """A side row Σ coef·x ≤ bound that binds: at its bound, or past it (a soft row
    paying its penalty), up to rounding."""
    return activity >= bound - 1e-6 * max(1.0, abs(bound))


def job_weights(jobs: Sequence[QueuedJob], queues: QueueSet) -> Floats:
    """Each job's priority-class weight (the factor on its term in the objective)."""
    names = [j.priority for j in jobs]
    weight = {n: queues.weight(n) for n in dict.fromkeys(names)}  # (a lookup per class)
    return np.array([weight[n] for n in names], dtype=float)


def queue_index(jobs: Sequence[QueuedJob], queues: QueueSet) -> Ints:
    """Each job's queue, as its index in `queues.queues` (FieldError naming `queue`
    for a queue the set does not have). A round computes it once and passes it on:
    the lookups, one per job in each of the round's steps, were ~5 % of a round with
    16 queues."""
    index = queues.index
    return np.array([index(j.queue) for j in jobs], dtype=np.int64)


def min_runtime_holds(jobs: Sequence[QueuedJob], current: Ints, queues: QueueSet,
                      qix: Ints) -> Bools:
    """Running jobs younger on their allocation than their queue's minimum runtime:
    they keep it this round (bounded preemption). `qix`: `queue_index`."""
    least = np.array([queues.min_runtime(q.name) for q in queues.queues], dtype=float)
    stint = np.array([j.stint for j in jobs], dtype=float)
    holds: Bools = (np.asarray(current) >= 0) & (stint < least[qix])
    return holds


def queue_usage(table: Table, chosen: Ints, queues: QueueSet,
                qix: Ints) -> dict[str, dict[str, int]]:
    """GPUs each queue holds per type in a round's choice (each job's table row, -1:
    none); `qix`: `queue_index`."""
    types = table.cluster.gpu_types
    held = per_queue_type(table, qix, len(queues.queues), _picked_rows(table, chosen))
    return {qu.name: dict(zip(types, held[k].astype(np.int64).tolist(), strict=True))
            for k, qu in enumerate(queues.queues)}


def _picked_rows(table: Table, chosen: Ints) -> Bools:
    rows = np.zeros(len(table), dtype=bool)
    rows[chosen[chosen >= 0]] = True
    return rows


def queue_rows(table: Table, qix: Ints, values: Floats, none_value: Floats, current: Ints,
               queues: QueueSet, *, restarts_used: int = 0, hold: Bools | None = None,
               silo: Mapping[str, Mapping[str, int]] | None = None) -> SideRows:
    """The side rows of one round (`qix`: each job's queue, `queue_index`). `values` are
    the final ones (holds applied: NaN where a row is no option); `none_value` the jobs'
    values of nothing (before holds, to size the penalty); `restarts_used`: restarts an
    earlier stage of the round has spent of the budget; `hold`: the jobs kept where they
    are this round (what they hold of a type is owed to no other queue); `silo`: what
    each queue's jobs hold per type when each queue's guarantee is a private partition
    (`silos.silo_use`): a queue is owed that, up to its guarantee — what its jobs would
    get were its guaranteed GPUs its own, not their largest shapes. (A round that
    builds them more than once, for different silos, keeps one `QueueRows`.)"""
    return QueueRows(table, qix, values, none_value, current, queues, hold=hold).rows(
        silo=silo, restarts_used=restarts_used)


# A row before it joins the others: (table rows, coefficients, rhs, name).
_Row = tuple[Ints, Floats, float, str]


class QueueRows:
    """`queue_rows` for one round's table, values and holds, built for any silos:
    what does not depend on them (each queue's table rows by type, the units and
    borrowing rows, who can stay) is found once. A round with guarantees builds its
    rows two or three times (`lazy_rows.guaranteed_round`); each build was ~2.7 ms at
    2,000 jobs with 16 queues, most of it this shared part."""

    def __init__(self, table: Table, qix: Ints, values: Floats, none_value: Floats,
                 current: Ints, queues: QueueSet, *, hold: Bools | None = None) -> None:
        types = table.cluster.gpu_types
        self.table, self.queues, self.types = table, queues, types
        finite = np.isfinite(values)
        self.gpus: Floats = table.gpus().astype(float)
        self.typ = table.types()
        self._row_q = qix[table.job]
        worth = float(np.max(np.abs(values[finite]))) if np.any(finite) else 0.0
        worth += float(np.max(np.abs(none_value))) if len(none_value) else 0.0
        self.big = 2.0 * worth + 1.0  # per GPU short: more than any job's whole term can change
        # Entries cover all of a queue's table rows (those that are no option this round
        # drop out as columns, `ilp._side_columns`), so the activity reported at the
        # round's final choice counts rows a later stage took; demand counts options only.
        self.cap, self.now = guarantee_caps(table, qix, current, queues, hold)
        self._unit_w = np.array([queues.unit_weight(t) for t in types])
        self._units = self.gpus * self._unit_w[self.typ]
        # Each (queue, type)'s table rows, ascending: one stable sort, not a mask over
        # the whole table per queue and type.
        T = len(types)
        key = self._row_q * T + self.typ
        order = np.argsort(key, kind="stable")
        edge = np.searchsorted(key[order], np.arange(len(queues.queues) * T + 1))
        self._rows_of = [[order[edge[k * T + t]:edge[k * T + t + 1]] for t in range(T)]
                         for k in range(len(queues.queues))]
        self._options: list[Ints] = []  # each queue's rows that are options
        # Per queue, its rows after the per-type guarantees: units, then borrowing; and
        # whether it holds less than its units guarantee now.
        self._fixed: list[list[_Row]] = []
        self._units_below = np.zeros(len(queues.queues), dtype=bool)
        for k, q in enumerate(queues.queues):
            ours = np.sort(order[edge[k * T]:edge[(k + 1) * T]])  # (all its types)
            self._options.append(ours[finite[ours]])
            self._fixed.append(self._units_row(k, q, ours) + self._borrow_rows(k, q))
        if queues.max_restarts_per_round is not None:
            self._stays, self._grows = _keep_rows(table, current, finite)

    def _units_row(self, k: int, q: Queue, ours: Ints) -> list[_Row]:
        """Queue `k`'s type-flexible guarantee row (none without one); notes whether
        it holds less than that now. `ours`: its table rows."""
        if q.guarantee_units <= 0:
            return []
        units, mine = self._units, self._options[k]
        want = min(q.guarantee_units, _most_per_job(self.table.job[mine], units[mine]))
        if want <= 0:
            return []
        self._units_below[k] = float(self.now[k] @ self._unit_w) < want
        return [(ours, -units[ours], -float(want), f"guarantee {q.name}/{UNITS}")]

    def _borrow_rows(self, k: int, q: Queue) -> list[_Row]:
        """Queue `k`'s borrowing rows, by type name, for the types the table has."""
        out: list[_Row] = []
        for t in sorted(q.borrow_limit):
            if t in self.types:
                rows = self._rows_of[k][self.types.index(t)]
                if len(rows):
                    cap = q.cap(t)
                    assert cap is not None  # (t has a borrow limit)
                    out.append((rows, self.gpus[rows], float(cap), f"borrow {q.name}/{t}"))
        return out

    def rows(self, *, silo: Mapping[str, Mapping[str, int]] | None = None,
             restarts_used: int = 0) -> SideRows:
        """The round's side rows with these silos (`queue_rows`)."""
        types, queues, table = self.types, self.queues, self.table
        job, gpus, typ = table.job, self.gpus, self.typ
        entries: list[tuple[Ints, Floats]] = []
        rhs: list[float] = []
        penalty: list[float] = []
        names: list[str] = []

        def add(rows: Ints, coef: Floats, bound: float, cost: float, name: str) -> None:
            entries.append((rows, coef))
            rhs.append(bound)
            penalty.append(cost)
            names.append(name)

        big = self.big
        below = self._units_below.copy()  # holds less than it is owed
        for k, q in enumerate(queues.queues):
            guaranteed = {i: float(self.cap[k, i]) for t, g in q.guarantee.items()
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


def _keep_rows(table: Table, current: Ints, finite: Bools) -> tuple[Bools, Bools]:
    """For the restart budget's row: the table rows on which a job stays (its current
    one, where that is an option), and those on which it grows on its type (counted
    as staying for a queue below what it is owed)."""
    job, gpus, typ = table.job, table.gpus(), table.types()
    at_current = (current[job] >= 0) & (table.config == current[job])
    cur_type = np.full(table.num_jobs, -1)
    cur_gpus = np.zeros(table.num_jobs)
    cur_type[job[at_current]] = typ[at_current]
    cur_gpus[job[at_current]] = gpus[at_current]
    stays = finite & at_current & np.isin(job, job[at_current & finite])
    grows = finite & (typ == cur_type[job]) & (gpus > cur_gpus[job])
    return stays, grows


def guarantee_caps(table: Table, qix: Ints, current: Ints, queues: QueueSet,
                   hold: Bools | None) -> tuple[Floats, Floats]:
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


def owed_bounds(table: Table, qix: Ints, values: Floats, cap: Floats) -> Floats:
    """Per (queue, type index), at least what the queue can be owed of the type with
    its silo (`silos.silo_use`): its `cap`, or less where its jobs' options could
    not use that many (Σ over its jobs of each one's largest option of the type —
    each job counted on every type, so a bound, not a packing)."""
    T = len(table.cluster.gpu_types)
    finite = np.flatnonzero(np.isfinite(values))
    largest = np.zeros(table.num_jobs * T)
    np.maximum.at(largest, table.job[finite] * T + table.types()[finite],
                  table.gpus()[finite].astype(float))
    demand = np.zeros_like(cap)
    np.add.at(demand, qix, largest.reshape(table.num_jobs, T))
    bounds: Floats = np.minimum(cap, demand)
    return bounds


def owed(job: Ints, typ: Ints, amount: Floats,
         guarantee: Mapping[int, float]) -> dict[int, float]:
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


def _held(hold: Bools | None, job: Ints) -> Bools:
    return np.zeros(len(job), dtype=bool) if hold is None else hold[job]


def per_queue_type(table: Table, qix: Ints, n_queues: int, rows: Bools) -> Floats:
    """GPUs per (queue, type) over the table rows where `rows` is true."""
    out = np.zeros((n_queues, len(table.cluster.gpu_types)))
    at = np.flatnonzero(rows)
    np.add.at(out, (qix[table.job[at]], table.types()[at]), table.gpus()[at])
    return out


def _most_per_job(job: Ints, amount: Floats) -> float:
    """Σ over jobs of each job's largest `amount` (rows grouped by job, as the
    candidate table keeps them)."""
    if len(job) == 0:
        return 0.0
    starts = np.flatnonzero(np.concatenate([[True], job[1:] != job[:-1]]))
    return float(np.maximum.reduceat(amount, starts).sum())
