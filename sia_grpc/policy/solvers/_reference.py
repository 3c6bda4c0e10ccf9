"""The reference path: the plain ILP in CVXPY, solved by GLPK_MI (the paper's
choice) or CVXPY's HiGHS. Slow at scale; the tests and `sia bench policy`
check the production path against it."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np

from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.problem import ChoiceProblem, ChoiceSolution

if TYPE_CHECKING:
    import cvxpy as cp


def solve_reference(problem: ChoiceProblem, solver: str = "GLPK_MI",
                    time_limit: float | None = None) -> ChoiceSolution:
    """The plain ILP in CVXPY -- a binary variable per column, a <= 1 row per
    job, a capacity row per type, each side row (a soft one with a slack
    variable s >= 0 that costs its penalty per unit), none as
    none_value * (1 - sum x) -- solved by GLPK_MI (the paper's choice, via
    cvxopt) or CVXPY's HIGHS. Hard side rows that no choice keeps raise the
    same FieldError as `solve`."""
    import cvxpy as cp

    if solver not in ("GLPK_MI", "HIGHS"):
        raise ValueError(f"solver: expected 'GLPK_MI' or 'HIGHS', got {solver!r}")
    t0 = time.perf_counter()
    p = problem
    n = p.num_jobs
    choice = np.full(n, -1, dtype=np.int64)
    # Columns wider than their type are 0 in every solution; GLPK's presolver
    # aborts the process (glp_add_cols: ncs = 0) when that empties the model.
    cols = np.flatnonzero(p.col_gpus <= p.capacity[p.col_type]) if p.num_cols else np.zeros(0, int)
    m = len(cols)
    status = "optimal"
    if m:
        x, prob = _model(p, cols)
        opts: dict[str, float] = {}
        if solver == "GLPK_MI" and time_limit is not None:
            opts["tm_lim"] = int(time_limit * 1000)
        if solver == "HIGHS":
            opts["mip_rel_gap"] = 1e-7
            if time_limit is not None:
                opts["time_limit"] = float(time_limit)
        prob.solve(solver=solver, **opts)  # type: ignore[no-untyped-call]  # (cvxpy's: unannotated)
        if prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            raise FieldError("row_rhs", "no choice keeps every hard side row")
        if x.value is None:
            raise RuntimeError(f"{solver}: no solution ({prob.status})")
        sel = cols[np.flatnonzero(np.asarray(x.value) > 0.5)]
        choice[p.col_job[sel]] = sel
        status = "optimal" if prob.status == cp.OPTIMAL else str(prob.status)
    elif not p.is_feasible(choice):  # nothing fits, and none breaks a hard row
        raise FieldError("row_rhs", "no choice keeps every hard side row")
    obj = p.objective(choice)
    return ChoiceSolution(choice, obj, obj if status == "optimal" else math.inf, status,
                          {"total_s": time.perf_counter() - t0}, p.row_excess(choice))


def _model(p: ChoiceProblem, cols: np.ndarray) -> tuple[cp.Variable, cp.Problem]:
    """The ILP over columns `cols` in CVXPY: (its binary variable, the problem)."""
    import cvxpy as cp
    import scipy.sparse as sp

    n, m = p.num_jobs, len(cols)
    x = cp.Variable(m, boolean=True)
    idx = np.arange(m)
    a_job = sp.csr_matrix((np.ones(m), (p.col_job[cols], idx)), shape=(n, m))
    a_typ = sp.csr_matrix((p.col_gpus[cols].astype(float), (p.col_type[cols], idx)),
                          shape=(p.num_types, m))
    objective = p.col_value[cols] @ x + p.none_value @ (1 - a_job @ x)
    constraints = [a_job @ x <= 1, a_typ @ x <= p.capacity]
    if p.num_rows:
        a = sp.csr_matrix((p.row_coef, p.row_col, p.row_ptr),
                          shape=(p.num_rows, p.num_cols)).tocsc()[:, cols]
        soft = np.flatnonzero(p.soft)
        hard = np.flatnonzero(~p.soft)
        if len(hard):
            constraints.append(a[hard] @ x <= p.row_rhs[hard])
        if len(soft):
            s = cp.Variable(len(soft), nonneg=True)
            constraints.append(a[soft] @ x - s <= p.row_rhs[soft])
            objective = objective - p.row_penalty[soft] @ s
    return x, cp.Problem(cp.Maximize(objective), constraints)
