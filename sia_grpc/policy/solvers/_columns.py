"""The reduced column form of a `ChoiceProblem` and pricing at the coupling
rows' prices.

`_reduce` applies the exact reductions (columns that cannot fit their type, that
are no better than none, or that another column of the same job and type
dominates) and sorts what is left by (job, type, GPUs), so that per-job
operations are segmented numpy reductions. `_Side` holds the side rows over the
reduced columns. `_Opts` is the options of a subset of jobs (none included)
that the LP, MIP and DP solve over.

The coupling rows are the capacity rows (one per type) and then the side rows;
a price vector has one entry per coupling row, capacity prices first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sia_grpc.policy.problem import ROW_TOL, ChoiceProblem

if TYPE_CHECKING:
    from scipy import sparse


def _cat(*parts: npt.ArrayLike) -> np.ndarray:
    """np.concatenate of arrays and scalars (np.r_ costs ~15 µs a call)."""
    return np.concatenate([np.atleast_1d(x) for x in parts])


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The indices of the concatenated ranges starts[k]:stops[k]."""
    lens = stops - starts
    total = int(lens.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(total)


@dataclass
class _Side:
    """Side rows over the reduced columns, by row (CSR) and by column (CSC)."""

    row_ptr: np.ndarray
    row_col: np.ndarray
    row_coef: np.ndarray
    col_ptr: np.ndarray
    col_row: np.ndarray
    col_coef: np.ndarray
    rhs: npt.NDArray[np.float64]  # [R]
    pen: npt.NDArray[np.float64]  # [R]: inf for a hard row
    m: int  # reduced columns

    @property
    def R(self) -> int:  # noqa: N802
        return len(self.rhs)

    @property
    def soft(self) -> np.ndarray:
        return np.isfinite(self.pen)

    def activity(self, choice: np.ndarray) -> np.ndarray:
        """A·x per side row for a (reduced) choice."""
        cols = choice[choice >= 0]
        e = _ranges(self.col_ptr[cols], self.col_ptr[cols + 1])
        return np.bincount(self.col_row[e], weights=self.col_coef[e], minlength=self.R)

    def shift(self, mu: np.ndarray) -> np.ndarray:
        """Σ_r μ_r · a_rc per column."""
        shift: np.ndarray = self.by_col @ mu  # (scipy's product: an ndarray)
        return shift

    @cached_property
    def by_col(self) -> sparse.csr_matrix:
        """The rows as a scipy CSR matrix of columns × rows (its product with
        prices is one pass over the entries)."""
        import scipy.sparse as sp

        return sp.csr_matrix((self.col_coef, self.col_row, self.col_ptr), shape=(self.m, self.R))

    def excess(self, act: np.ndarray) -> np.ndarray:
        """By how much each row is exceeded (hard rows included)."""
        return np.maximum(0.0, act - self.rhs)

    def penalty(self, act: np.ndarray) -> float:
        """The soft rows' cost at activity `act`."""
        soft = self.soft
        return float(self.pen[soft] @ self.excess(act)[soft])

    def hard_ok(self, act: np.ndarray) -> bool:
        over = act - self.rhs
        return bool(np.all(self.soft | (over <= ROW_TOL * np.maximum(1.0, np.abs(self.rhs)))))


def _side(p: ChoiceProblem, orig: np.ndarray) -> _Side | None:
    """The side rows of `p` over the reduced columns `orig` (dropped columns are
    0 in every solution, so their entries go), duplicate entries summed."""
    if not p.num_rows:
        return None
    import scipy.sparse as sp

    m = len(orig)
    pos = np.full(p.num_cols, -1, dtype=np.int64)
    pos[orig] = np.arange(m)
    col = pos[np.asarray(p.row_col, dtype=np.int64)]
    keep = col >= 0
    row = np.repeat(np.arange(p.num_rows), np.diff(p.row_ptr))[keep]
    ptr = _cat(0, np.cumsum(np.bincount(row, minlength=p.num_rows))).astype(np.int64)
    a = sp.csr_matrix((np.asarray(p.row_coef, dtype=np.float64)[keep], col[keep], ptr),
                      shape=(p.num_rows, m))
    a.sum_duplicates()
    b = a.tocsc()
    b.sort_indices()
    return _Side(row_ptr=a.indptr.astype(np.int64), row_col=a.indices.astype(np.int64),
                 row_coef=a.data, col_ptr=b.indptr.astype(np.int64),
                 col_row=b.indices.astype(np.int64), col_coef=b.data,
                 rhs=np.asarray(p.row_rhs, dtype=np.float64),
                 pen=np.asarray(p.row_penalty, dtype=np.float64), m=m)


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
    side: _Side | None = None  # the side rows, if any

    @property
    def n(self) -> int:
        return len(self.none)

    @property
    def m(self) -> int:
        return len(self.val)

    @property
    def T(self) -> int:  # noqa: N802
        return len(self.cap)

    @property
    def K(self) -> int:  # noqa: N802
        """Coupling rows: capacities, then side rows."""
        return self.T + (self.side.R if self.side is not None else 0)

    @property
    def rhs(self) -> np.ndarray:
        """The coupling rows' right-hand sides (the capacities alone without side rows)."""
        return self.cap if self.side is None else _cat(self.cap.astype(np.float64),
                                                       self.side.rhs)

    def usage(self, choice: np.ndarray) -> np.ndarray:
        cols = choice[choice >= 0]
        return np.bincount(self.typ[cols], weights=self.gpus[cols],
                           minlength=self.T).astype(np.int64)

    def use(self, choice: np.ndarray) -> np.ndarray:
        """Activity of every coupling row (the usage alone without side rows)."""
        u = self.usage(choice)
        return u if self.side is None else _cat(u.astype(np.float64),
                                                self.side.activity(choice))

    def value(self, choice: np.ndarray) -> float:
        """The columns' and nones' values (no soft-row penalty: see `score`)."""
        on = choice >= 0
        return float(self.none[~on].sum() + self.val[choice[on]].sum())

    def score(self, choice: np.ndarray) -> float:
        """The objective: value less the soft rows' penalties."""
        v = self.value(choice)
        return v if self.side is None else v - self.side.penalty(self.side.activity(choice))

    def feasible(self, choice: np.ndarray) -> bool:
        """Within the capacities and the hard side rows."""
        if not np.all(self.usage(choice) <= self.cap):
            return False
        return self.side is None or self.side.hard_ok(self.side.activity(choice))

    @cached_property
    def job_cols(self) -> tuple[np.ndarray, np.ndarray]:
        """Each job's columns as a range: (first, one past the last), empty if none."""
        start = np.zeros(self.n, dtype=np.int64)
        stop = np.zeros(self.n, dtype=np.int64)
        start[self.ne_jobs] = self.ne_starts
        stop[self.ne_jobs] = _cat(self.ne_starts[1:], self.m)
        return start, stop

    def cols_of(self, jobs: np.ndarray) -> np.ndarray:
        """The columns of `jobs`, job by job."""
        start, stop = self.job_cols
        return _ranges(start[jobs], stop[jobs])

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
    useful = val > none[job]
    in_rows = None
    if p.num_rows:
        # None has no activity, so it dominates a column no better than none
        # only if the column has no negative coefficient (none of a ≥ row's).
        # A column in some side row neither dominates nor is dominated within
        # its (job, type): its row entries differ from the others'.
        rcol = np.asarray(p.row_col, dtype=np.int64)
        in_rows = np.bincount(rcol, minlength=len(job)) > 0
        useful |= np.bincount(rcol[np.asarray(p.row_coef) < 0], minlength=len(job)) > 0
    keep = np.flatnonzero((gpus <= cap[typ]) & useful) if len(job) else job
    # Order by (job, type, GPUs, -value); builders usually emit that order already,
    # and an integer key sorts far faster than a float lexsort.
    key = (job[keep] * max(1, len(cap)) + typ[keep]) * (int(gpus.max(initial=0)) + 1) + gpus[keep]
    if np.any(key[1:] < key[:-1]):
        order = np.argsort(key, kind="stable")
        keep, key = keep[order], key[order]
    if np.any(key[1:] == key[:-1]):  # duplicate (job, type, GPUs): best value first
        order = np.lexsort((-val[keep], key))
        keep, key = keep[order], key[order]
    idx = keep
    if len(idx):
        # Dominated: an earlier column of the same (job, type) -- no more GPUs --
        # has at least the value (a segmented prefix max, by doubling).
        cut = (job[idx][1:] != job[idx][:-1]) | (typ[idx][1:] != typ[idx][:-1])
        if in_rows is not None:
            cut |= in_rows[idx][1:] | in_rows[idx][:-1]
        group = np.cumsum(_cat(True, cut))
        v = val[idx]
        prefix = v.copy()
        step = 1
        while step < len(v) and np.any(group[step:] == group[:-step]):
            prefix[step:] = np.maximum(prefix[step:], np.where(group[step:] == group[:-step],
                                                               prefix[:-step], -np.inf))
            step *= 2
        prev = _cat(-np.inf, np.where(group[1:] == group[:-1], prefix[:-1], -np.inf))
        idx = idx[prev < v]
    j = job[idx]
    first = _cat(True, j[1:] != j[:-1]) if len(j) else np.zeros(0, dtype=bool)
    orig = idx.astype(np.int64)
    return _Cols(orig=orig, job=j, typ=typ[idx], gpus=gpus[idx],
                 gf=gpus[idx].astype(np.float64), val=val[idx], none=none.copy(), cap=cap,
                 ne_jobs=j[first], ne_starts=np.flatnonzero(first), side=_side(p, orig))


def _price(c: _Cols, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced values value − λ·(the column's coupling-row entries) per column,
    and each job's best (≥ none). `lam` holds the capacity prices and, when it
    is longer, the side rows' prices."""
    rc = c.val - lam[c.typ] * c.gf
    if len(lam) > c.T:
        assert c.side is not None  # (prices beyond the capacities are the side rows')
        rc -= c.side.shift(lam[c.T:])
    best = c.none.copy()
    if c.m:
        seg = np.maximum.reduceat(rc, c.ne_starts)
        best[c.ne_jobs] = np.maximum(best[c.ne_jobs], seg)
    return rc, best


def _argmax(c: _Cols, rc: np.ndarray, best: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """Each job's best option at the prices behind `rc`. Options within `tol` of
    the best count as tied, and ties go to none, then to the fewest GPUs: at LP
    prices many options tie (up to rounding), and the leanest keeps the choice
    feasible for `_fill` to build on."""
    choice = np.full(c.n, -1, dtype=np.int64)
    hit = np.flatnonzero(rc >= best[c.job] - tol)
    if len(hit):
        j = c.job[hit]
        starts = np.flatnonzero(_cat(True, j[1:] != j[:-1]))
        if tol > 0:  # fewest GPUs among the tied, then the first
            g = c.gpus[hit]
            least = np.minimum.reduceat(g, starts)
            hit = hit[g == np.repeat(least, np.diff(_cat(starts, len(hit))))]
            j = c.job[hit]
            starts = np.flatnonzero(_cat(True, j[1:] != j[:-1]))
        choice[j[starts]] = hit[starts]
    choice[best <= c.none + tol] = -1
    return choice


@dataclass
class _Opts:
    """Options (columns, and none as column -1) of a subset of jobs."""

    jobs: np.ndarray  # job indices
    col: npt.NDArray[np.int64]  # reduced column per option, -1 = none; job-major
    ptr: npt.NDArray[np.int64]  # options of jobs[r] are ptr[r]:ptr[r+1]
    typ: np.ndarray
    gpus: np.ndarray
    val: np.ndarray

    @property
    def local_job(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.jobs)), np.diff(self.ptr))

    def choice(self, pick: np.ndarray) -> np.ndarray:
        """Columns for option indices `pick` (one per job, relative to ptr)."""
        cols: npt.NDArray[np.int64] = self.col[self.ptr[:-1] + pick]  # (numpy's stubs: Any)
        return cols


def _options(c: _Cols, jobs: np.ndarray, keep: np.ndarray, none_ok: np.ndarray) -> _Opts:
    """The kept columns and allowed nones of `jobs` (ascending), none first
    within a job."""
    sel = np.zeros(c.n, dtype=bool)
    sel[jobs] = True
    cols = np.flatnonzero(keep & sel[c.job])
    nj = jobs[none_ok[jobs]]
    opt_job = _cat(nj, c.job[cols])
    opt_col = _cat(np.full(len(nj), -1, dtype=np.int64), cols)
    order = np.lexsort((opt_col, opt_job))
    opt_job, opt_col = opt_job[order], opt_col[order]
    ptr = _cat(0, np.cumsum(np.bincount(opt_job, minlength=c.n)[jobs])).astype(np.int64)
    on = opt_col >= 0
    typ = np.zeros(len(opt_col), dtype=c.typ.dtype)
    gpus = np.zeros(len(opt_col), dtype=np.int64)
    val = c.none[opt_job]
    typ[on], gpus[on], val[on] = c.typ[opt_col[on]], c.gpus[opt_col[on]], c.val[opt_col[on]]
    return _Opts(jobs=jobs, col=opt_col, ptr=ptr, typ=typ, gpus=gpus, val=val)
