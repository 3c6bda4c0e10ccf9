"""Incumbents: make a choice fit (`_repair`), improve it greedily (`_fill`) and
by per-type knapsack moves (`_shift`), and round the LP over tied options
(`_round_tied`)."""

from __future__ import annotations

import numpy as np

from sia_grpc.policy.solvers._columns import _cat, _Cols
from sia_grpc.policy.solvers._highs import _lp


def _repair(c: _Cols, choice: np.ndarray) -> np.ndarray:
    """Make `choice` fit by moving jobs off over-full types, cheapest loss per
    freed GPU first."""
    choice = choice.copy()
    slack = c.cap - c.usage(choice)
    while (slack < 0).any():
        t = int(np.argmin(slack))
        on = np.flatnonzero(choice >= 0)
        jobs_t = on[c.typ[choice[on]] == t]
        in_t = np.zeros(c.n, dtype=bool)
        in_t[jobs_t] = True
        cols = np.flatnonzero(in_t[c.job])
        cur = choice[c.job[cols]]
        freed = c.gpus[cur] - np.where(c.typ[cols] == t, c.gpus[cols], 0)
        room = np.maximum(slack, 0)[c.typ[cols]]
        ok = (freed > 0) & ((c.typ[cols] == t) | (c.gpus[cols] <= room))
        cols, cur, freed = cols[ok], cur[ok], freed[ok]
        jobs_t = jobs_t[c.gpus[choice[jobs_t]] > 0]  # to none frees GPUs
        cand_job = _cat(c.job[cols], jobs_t)
        cand_col = _cat(cols, np.full(len(jobs_t), -1))
        cand_freed = _cat(freed, c.gpus[choice[jobs_t]]).astype(np.float64)
        cand_loss = _cat(c.val[cur] - c.val[cols], c.val[choice[jobs_t]] - c.none[jobs_t])
        order = np.argsort(cand_loss / cand_freed, kind="stable")
        moved = np.zeros(c.n, dtype=bool)
        for k in order.tolist():
            j, col = int(cand_job[k]), int(cand_col[k])
            if moved[j]:
                continue
            old = int(choice[j])
            if col >= 0 and c.typ[col] != t and c.gpus[col] > slack[c.typ[col]]:
                continue
            slack[t] += c.gpus[old]
            if col >= 0:
                slack[c.typ[col]] -= c.gpus[col]
            choice[j], moved[j] = col, True
            if slack[t] >= 0:
                break
        if not moved.any():  # cannot happen with positive GPUs; never loop forever
            choice[jobs_t] = -1
            slack = c.cap - c.usage(choice)
            if slack[t] < 0:
                raise RuntimeError("solve: internal error, cannot repair")
    return choice


def _fill(c: _Cols, choice: np.ndarray, lam: np.ndarray | None = None,
          rounds: int = 20) -> np.ndarray:
    """Greedy improvement of a feasible choice by single-job moves that fit the
    slack. Moves are taken in order of their change in λ-reduced value, then of
    gain: at the LP prices many moves gain about equally (ties, degenerate LPs),
    and the ones the LP itself would make fill capacity without wasting it."""
    choice = choice.copy()
    for _ in range(rounds):
        on = choice >= 0
        cur_val = c.none.copy()
        cur_val[on] = c.val[choice[on]]
        cur_t = np.full(c.n, -1, dtype=np.intp)
        cur_t[on] = c.typ[choice[on]]
        cur_g = np.zeros(c.n, dtype=np.int64)
        cur_g[on] = c.gpus[choice[on]]
        slack = c.cap - c.usage(choice)
        need = c.gpus - np.where(cur_t[c.job] == c.typ, cur_g[c.job], 0)
        gain = c.val - cur_val[c.job]
        cand = np.flatnonzero((gain > 1e-12) & (need <= slack[c.typ]))
        if not len(cand):
            break
        if lam is None:
            cand = cand[np.argsort(-gain[cand], kind="stable")]
        else:
            cur_price = np.where(cur_t >= 0, lam[np.maximum(cur_t, 0)], 0.0) * cur_g
            score = gain[cand] - lam[c.typ[cand]] * c.gf[cand] + cur_price[c.job[cand]]
            cand = cand[np.lexsort((-gain[cand], -np.round(score, 12)))]
        moved = np.zeros(c.n, dtype=bool)
        any_moved = False
        least = int(need[cand].min())
        for k in cand.tolist():
            j, t = int(c.job[k]), int(c.typ[k])
            if moved[j]:
                continue
            if slack.max() < least:  # nothing left can fit
                break
            need_k = int(c.gpus[k]) - (int(cur_g[j]) if cur_t[j] == t else 0)
            if need_k > slack[t]:
                continue
            if cur_t[j] >= 0 and cur_t[j] != t:
                slack[cur_t[j]] += cur_g[j]
            slack[t] -= need_k
            choice[j], moved[j], any_moved = k, True, True
        if not any_moved:
            break
    return choice


def _shift(c: _Cols, choice: np.ndarray, allowed: np.ndarray, none_ok: np.ndarray,
           max_jobs: int = 400) -> np.ndarray:
    """Improve a feasible choice type by type: the best set of moves within the
    type (or to/from none), at most one per job, whose net GPUs fit the type's
    slack -- an exact multiple-choice knapsack DP over the net change, so that
    rounding one job up can be paid for by moving others down. Only `allowed`
    columns (and none where `none_ok`) are considered; the jobs with the most
    allowed moves come first when there are more than `max_jobs`."""
    choice = choice.copy()
    for t in range(c.T):
        on = choice >= 0
        cur_t = np.full(c.n, -1, dtype=np.intp)
        cur_t[on] = c.typ[choice[on]]
        cur_g = np.zeros(c.n, dtype=np.int64)
        cur_g[on] = c.gpus[choice[on]]
        cur_v = c.none.copy()
        cur_v[on] = c.val[choice[on]]
        mine = (cur_t == t) | (cur_t < 0)
        cols = np.flatnonzero(allowed & (c.typ == t) & mine[c.job])
        cols = cols[cols != choice[c.job[cols]]]
        down = np.flatnonzero((cur_t == t) & none_ok)
        opt_job = _cat(c.job[cols], down)
        opt_col = _cat(cols, np.full(len(down), -1))
        if not len(opt_job):
            continue
        opt_dg = _cat(c.gpus[cols], np.zeros(len(down), np.int64)) - cur_g[opt_job]
        opt_gain = _cat(c.val[cols], c.none[down]) - cur_v[opt_job]
        slack = int(c.cap[t] - c.usage(choice)[t])
        reach = int(np.abs(opt_dg).max()) * 2
        ok = opt_dg <= slack + reach
        order = np.lexsort((opt_col[ok], opt_job[ok]))
        opt_job, opt_col = opt_job[ok][order], opt_col[ok][order]
        opt_dg, opt_gain = opt_dg[ok][order], opt_gain[ok][order]
        jobs, starts, counts = np.unique(opt_job, return_index=True, return_counts=True)
        if len(jobs) > max_jobs:
            keep = np.sort(np.argsort(-counts, kind="stable")[:max_jobs])
            jobs, starts, counts = jobs[keep], starts[keep], counts[keep]
        # Net change u in [-reach, slack + reach] at index u + reach.
        width = slack + 2 * reach + 1
        f = np.full(width, -np.inf)
        f[reach] = 0.0
        pos = np.arange(width)
        args = []
        for s0, k in zip(starts.tolist(), counts.tolist(), strict=True):
            src = pos[None, :] - opt_dg[s0:s0 + k, None]
            valid = (src >= 0) & (src < width)
            cand = np.where(valid, f[np.clip(src, 0, width - 1)], -np.inf)
            cand += opt_gain[s0:s0 + k, None]
            top = cand.max(axis=0)
            better = top > f + 1e-12
            args.append(np.where(better, cand.argmax(axis=0) + 1, 0))
            f = np.where(better, top, f)
        u = int(np.argmax(f[:reach + slack + 1]))
        if f[u] <= 1e-12:
            continue
        for r in range(len(jobs) - 1, -1, -1):
            k = int(args[r][u])
            if k:
                o = starts[r] + k - 1
                choice[jobs[r]] = opt_col[o]
                u -= int(opt_dg[o])
    return choice


def _round_tied(c: _Cols, rc: np.ndarray, best: np.ndarray, tie: float,
                max_jobs: int = 1500) -> np.ndarray | None:
    """Jobs with one tight option at λ take it; the LP over the tight options
    of the rest (if few) picks among them, rounded down. None if that fails."""
    tight = best[c.job] - rc <= tie
    none_tight = best - c.none <= tie
    n_tight = np.bincount(c.job[tight], minlength=c.n) + none_tight
    tied = np.flatnonzero(n_tight > 1)
    if len(tied) > max_jobs:
        return None
    choice = np.full(c.n, -1, dtype=np.int64)
    single = np.flatnonzero(tight & (n_tight[c.job] == 1))
    choice[c.job[single]] = single
    rcap = c.cap - c.usage(choice)
    if (rcap < 0).any():
        return None
    if len(tied):
        out = _lp(c, tied, tight, rcap, True)
        if out is None:
            return None
        choice[tied] = out[1]
    return _repair(c, choice)  # a job split across types may overfill when rounded
