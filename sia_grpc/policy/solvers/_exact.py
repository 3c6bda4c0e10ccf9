"""The exact DP over the capacities that can still bind, for residual problems
small enough (HiGHS MIP takes the others)."""

from __future__ import annotations

import math

import numpy as np

from sia_grpc.policy.solvers._columns import _Opts

_DP_STATES = 4e6


def _dp(o: _Opts, cap: np.ndarray, work: float,
        ) -> tuple[np.ndarray | None, float] | None:
    """Exact DP over the capacities that can bind, every job taking one of its
    options. Returns (option index per job, value), (None, -inf) if infeasible,
    or None when it would take more than `work` state updates."""
    opt_typ, opt_gpus, opt_val, opt_ptr = o.typ, o.gpus, o.val, o.ptr
    nj = len(opt_ptr) - 1
    T = len(cap)
    demand = np.zeros(T, dtype=np.int64)
    for t in range(T):
        gpus_t = np.where(opt_typ == t, opt_gpus, 0)
        demand[t] = np.maximum.reduceat(gpus_t, opt_ptr[:-1]).sum() if nj else 0
    binding = [t for t in range(T) if demand[t] > cap[t]]
    axis = {t: a for a, t in enumerate(binding)}
    # A (1,)-shaped state when nothing binds keeps the slicing below uniform.
    dims = tuple(int(cap[t]) + 1 for t in binding) or (1,)
    states = math.prod(dims)
    if states > _DP_STATES or states * len(opt_val) > work:
        return None
    f = np.zeros(dims)
    args = []
    full = tuple(slice(None) for _ in dims)
    for j in range(nj):
        new = np.full(dims, -np.inf)
        arg = np.full(dims, -1, dtype=np.int16 if opt_ptr[j + 1] - opt_ptr[j] < 32000 else np.int32)
        for k in range(opt_ptr[j], opt_ptr[j + 1]):
            t, g, v = int(opt_typ[k]), int(opt_gpus[k]), float(opt_val[k])
            if t in axis and g > 0:
                a = axis[t]
                if g >= dims[a]:
                    continue
                src = full[:a] + (slice(0, dims[a] - g),) + full[a + 1:]
                dst = full[:a] + (slice(g, None),) + full[a + 1:]
            else:
                src = dst = full
            cand = f[src] + v
            view, aview = new[dst], arg[dst]
            better = cand > view
            np.copyto(view, cand, where=better)
            np.copyto(aview, k - opt_ptr[j], where=better)
        f = new
        args.append(arg)
    at = [int(cap[t]) for t in binding] or [0]
    value = float(f[tuple(at)])
    if not np.isfinite(value):
        return None, -np.inf
    pick = np.zeros(nj, dtype=np.int64)
    for j in range(nj - 1, -1, -1):
        k = int(args[j][tuple(at)])
        pick[j] = k
        i = opt_ptr[j] + k
        if int(opt_typ[i]) in axis:
            at[axis[int(opt_typ[i])]] -= int(opt_gpus[i])
    return pick, value
