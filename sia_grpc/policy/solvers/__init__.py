"""Solvers for `ChoiceProblem`.

`solve` is the production path (its strategy, and why: `_solve.py`);
`solve_reference` the plain ILP in CVXPY (GLPK_MI, the paper's choice, or
HiGHS); `lp_interior` an interior-point LP for Gavel; `path_name` names the
path `solve` took from its stats. The private modules hold the parts:

  _solve.py       `solve`: orchestrates the steps below, path names
  _columns.py     reduced column form (`_Cols`, `_reduce`), pricing, options of a job subset
  _highs.py       HiGHS: silent fork-safe instances, bulk models, LP/MIP calls, `lp_interior`
  _lagrangian.py  Dantzig-Wolfe prices for the capacity rows, reduced-cost fixing
  _heuristics.py  incumbents: repair, greedy fill, per-type knapsack shifts, tied rounding
  _exact.py       the exact DP over the capacities that can bind
  _reference.py   the CVXPY reference (GLPK_MI or HiGHS)
  _separable.py   `solve_separable`: independent problems (blocks of types) at once
"""

from sia_grpc.policy.solvers._highs import lp_interior
from sia_grpc.policy.solvers._reference import solve_reference
from sia_grpc.policy.solvers._separable import solve_separable
from sia_grpc.policy.solvers._solve import PATHS, path_name, solve

__all__ = ["PATHS", "lp_interior", "path_name", "solve", "solve_reference", "solve_separable"]
