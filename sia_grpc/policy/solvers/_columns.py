"""The reduced column form of a `ChoiceProblem` and pricing at capacity prices.

`_reduce` applies the exact reductions (columns that cannot fit their type, that
are no better than none, or that another column of the same job and type
dominates) and sorts what is left by (job, type, GPUs), so that per-job
operations are segmented numpy reductions. `_Opts` is the options of a subset of
jobs (none included) that the LP, MIP and DP solve over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sia_grpc.policy.problem import ChoiceProblem


def _cat(*parts) -> np.ndarray:
    """np.concatenate of arrays and scalars (np.r_ costs ~15 µs a call)."""
    return np.concatenate([np.atleast_1d(x) for x in parts])


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

    @property
    def n(self) -> int:
        return len(self.none)

    @property
    def m(self) -> int:
        return len(self.val)

    @property
    def T(self) -> int:  # noqa: N802
        return len(self.cap)

    def usage(self, choice: np.ndarray) -> np.ndarray:
        cols = choice[choice >= 0]
        return np.bincount(self.typ[cols], weights=self.gpus[cols],
                           minlength=self.T).astype(np.int64)

    def value(self, choice: np.ndarray) -> float:
        on = choice >= 0
        return float(self.none[~on].sum() + self.val[choice[on]].sum())

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
    keep = np.flatnonzero((gpus <= cap[typ]) & (val > none[job])) if len(job) else job
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
        group = np.cumsum(_cat(True, (job[idx][1:] != job[idx][:-1])
                                | (typ[idx][1:] != typ[idx][:-1])))
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
    return _Cols(orig=idx.astype(np.int64), job=j, typ=typ[idx], gpus=gpus[idx],
                 gf=gpus[idx].astype(np.float64), val=val[idx], none=none.copy(), cap=cap,
                 ne_jobs=j[first], ne_starts=np.flatnonzero(first))


def _price(c: _Cols, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced values value − λ·gpus per column, and each job's best (≥ none)."""
    rc = c.val - lam[c.typ] * c.gf
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
    col: np.ndarray  # reduced column per option, -1 = none; job-major
    ptr: np.ndarray  # options of jobs[r] are ptr[r]:ptr[r+1]
    typ: np.ndarray
    gpus: np.ndarray
    val: np.ndarray

    @property
    def local_job(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.jobs)), np.diff(self.ptr))

    def choice(self, pick: np.ndarray) -> np.ndarray:
        """Columns for option indices `pick` (one per job, relative to ptr)."""
        return self.col[self.ptr[:-1] + pick]


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
