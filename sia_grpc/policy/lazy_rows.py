"""The queues' rows taken lazily (constraint generation: an optimum of the problem
with fewer rows that meets the others is an optimum with all of them): borrowing
rows only where they can bind (`lazy_borrowing`), guarantee rows and silos only for
the queues that need them (`guaranteed_round`). `LAZY_ROWS = False` takes every
row and solves every silo up front: the reference the tests hold the lazy rounds to."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.ilp import (
    SolveOptions,
    assemble,
    choose,
    picked_rows,
    warm_prices,
    warm_start,
)
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.queues.rows import (
    SideRows,
    guarantee_caps,
    owed_bounds,
    per_queue_type,
)
from sia_grpc.policy.silos import Silo, SiloSolves
from sia_grpc.policy.types import PolicyJob, SiloHint, WarmStart

# Whether a round with queues solves only the silos it needs (`guaranteed_round`)
# and takes borrowing rows only where they can bind (`lazy_borrowing`); False solves
# every silo up front and takes every row at once: the reference the tests hold the
# lazy rounds to.
LAZY_ROWS = True

# A shared round's answer: (choice, objective, stats, prices, side rows).
Shared = tuple[np.ndarray, float, dict[str, float], np.ndarray, SideRows | None]


class SharedRound(Protocol):
    """What `guaranteed_round` needs of the round (`rounds.ilp_round`'s)."""

    def side_rows(self, silo: Silo | None) -> SideRows | None:
        """The queues' rows, the guarantee rows of the queues in `silo` only."""
        ...

    def shared(self, silo: Silo | None, start: WarmStart | None) -> Shared:
        """The shared round (stage 1, then growth) with the guarantee rows of the
        queues in `silo`."""
        ...


def lazy_borrowing(table: CandidateTable, vals: np.ndarray, none: np.ndarray,
                   current: np.ndarray, side: SideRows | None, start: WarmStart | None,
                   timings: dict[str, float], kw: SolveOptions,
                   ) -> tuple[np.ndarray, float, dict[str, float], np.ndarray]:
    """Stage 1 with `side`'s borrowing rows only where they can bind: those a queue is
    at or over now, then any the answer goes over, solved again until it goes over
    none (constraint generation, as for the guarantees: an optimum that meets the
    rows left out is an optimum with them). Returns (choice, objective, stats,
    prices over all of `side`'s rows: 0 for those left out; empty from a reference
    solve, which has none)."""
    T = len(table.cluster.gpu_types)
    active = None
    if side is not None and LAZY_ROWS:
        lazy = np.array([n.startswith("borrow ") for n in side.names], dtype=bool)
        if lazy.any():
            at = np.flatnonzero((current[table.job] >= 0) & (table.config == current[table.job]))
            now = side.activity(picked_rows(table, at))
            active = ~lazy | (now >= side.rhs - 1e-9)
    passes = 0
    while True:
        t0 = time.perf_counter()
        rows_now = side if active is None or side is None else side.subset(active)
        problem, rows, first = assemble(table, vals, none, current, rows_now)
        timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
        chosen, objective, stats, prices = choose(problem, rows, first, timings, **kw,
                                                  prices=warm_prices(start, rows_now))
        passes += 1
        if active is None or active.all():
            break
        assert side is not None  # (`active` is only set with side rows)
        over = ~active & (side.activity(picked_rows(table, chosen)) > side.rhs + 1e-9)
        if not over.any():
            break
        active |= over
        start = warm_start(rows_now, prices, T, {})
    if rows_now is not side and len(prices):  # (prices of the rows left out: 0)
        assert rows_now is not None and side is not None
        by_name = dict(zip(rows_now.names, prices[T:].tolist(), strict=True))
        prices = np.concatenate([prices[:T], [by_name.get(n, 0.0) for n in side.names]])
    return chosen, objective, {**stats, "borrow_passes": float(passes)}, prices


def guaranteed_round(rnd: SharedRound, table: CandidateTable, jobs: Sequence[PolicyJob],
                     qix: np.ndarray, vals: np.ndarray, none: np.ndarray,
                     current: np.ndarray, hold: np.ndarray, queues: QueueSet,
                     timings: dict[str, float], kw: SolveOptions, warm: WarmStart | None,
                     ) -> tuple[np.ndarray, float, dict[str, float], np.ndarray,
                                SideRows | None, dict[str, SiloHint], frozenset[str]]:
    """The shared round with the queues' guarantees, their silos solved lazily.

    A queue is owed its silo (`silo_use`), which is never more than `owed_bounds`
    (its guarantee as the round can give it, or what its jobs' options could use).
    The guarantee rows of a queue that holds at least that bound in the answer are
    met whatever its silo, so they are left out and its silo is not solved: the
    round first solves with the rows of the queues it must know (those whose silo
    the last round needed and, with a restart budget, those holding less than the
    bound now: the budget's row depends on who is below what it is owed), then
    solves the silos of the queues the answer leaves below their bound and, where
    the answer does not already give them their silo, solves again with their
    rows, until no queue is left below. Constraint generation: an optimum of
    the problem with fewer rows that meets the others is an optimum with all of
    them, so the answer is within the gap as with every row. (On `sia bench
    policy --queues 16`, 3 of the 16 silos are solved in a median round, at most 4,
    in at most 2 passes.) The rows reported for a queue whose silo was not solved carry
    its bound: at least what it is owed, and what it holds.

    Returns (choice, objective, stats, prices, side rows, silo hints, the queues
    to solve the silos of first next round)."""
    cap, now = guarantee_caps(table, qix, current, queues, hold)
    bound = owed_bounds(table, qix, vals, cap)
    present = np.bincount(qix, minlength=len(queues.queues)) > 0
    owing = [k for k, q in enumerate(queues.queues) if q.guarantee and present[k]]
    last = set() if warm is None else set(warm.needed)
    need = {k for k in owing if queues.queues[k].name in last or not LAZY_ROWS}
    if queues.max_restarts_per_round is not None:
        need |= {k for k in owing if np.any(now[k] < bound[k])}
    silos = SiloSolves(table, jobs, vals, none, current, queues, qix, timings, kw,
                       {} if warm is None else dict(warm.silos))
    types = table.cluster.gpu_types
    T = len(types)
    silos.solve(sorted(need))
    chosen, objective, stats, prices, side, start, held = _passes(rnd, silos, owing, bound,
                                                                  cap, warm)
    # Every queue's guarantee rows are reported, those of a queue whose silo was not
    # solved with the bound it holds as its bound: what it is owed, or more. (Price
    # 0: the rows left out did not shape the answer.)
    upper = {queues.queues[k].name: dict(zip(types, bound[k].tolist(), strict=True))
             for k in owing if k not in silos.solved}
    if upper or side is None:  # (None: rows were added that the last solve did not have)
        side = rnd.side_rows({**upper, **silos.silo})
        assert side is not None  # (a round with queues has their rows)
        if len(prices):  # (a reference solve's: none)
            prices = np.concatenate([prices[:T], [start.row_prices.get(n, 0.0)
                                                  for n in side.names]])
    # For the next round: the queues whose silos this one solved and that hold no
    # more than their bound of some type (their rows may bind again; a queue holding
    # more of every type drops out).
    tight = (held <= bound + 1e-9) & (cap > 0)
    return chosen, objective, {**stats, **silos.counts}, prices, side, silos.hints, frozenset(
        queues.queues[k].name for k in sorted(silos.solved) if np.any(tight[k]))


def _passes(rnd: SharedRound, silos: SiloSolves, owing: list[int], bound: np.ndarray,
            cap: np.ndarray, warm: WarmStart | None,
            ) -> tuple[np.ndarray, float, dict[str, float], np.ndarray, SideRows | None,
                       WarmStart, np.ndarray]:
    """`guaranteed_round`'s passes: the shared round, then the silos of the queues
    it leaves below their bound and, unless the answer gives them their silo
    already, the shared round again with their rows. Returns the last pass's
    answer (its side rows None where they lack rows added since), its prices as a
    warm start, and what each queue holds per type."""
    table, queues = silos.table, silos.queues
    types = table.cluster.gpu_types
    T = len(types)
    start = warm
    while True:
        chosen, objective, stats, prices, side = rnd.shared(silos.silo, start)
        silos.counts["queue_passes"] += 1
        start = warm_start(side, prices, T, silos.hints)
        held = per_queue_type(table, silos.qix, len(queues.queues),
                              picked_rows(table, chosen) > 0)
        short = sorted(k for k in owing
                       if k not in silos.solved and np.any(held[k] < bound[k] - 1e-9))
        if not short:
            break
        silos.solve(short)
        if _meets(held, cap, silos.silo, queues, short, types):
            side = None  # (the answer gives them their silo already: it stands)
            break
        # Solving again moves up to their shortfall of each type to them, perhaps from
        # queues holding less than that above their bound: those join at once rather
        # than each in a further pass. (Only the passes depend on it, not the answer.)
        short_by = np.maximum(bound[short] - held[short], 0.0).sum(axis=0)
        silos.solve(sorted(k for k in owing if k not in silos.solved
                           and np.any((held[k] - bound[k] < short_by + 1e-9) & (cap[k] > 0))))
    return chosen, objective, stats, prices, side, start, held


def _meets(held: np.ndarray, cap: np.ndarray, silo: Mapping[str, Mapping[str, int]],
           queues: QueueSet, ks: list[int], types: Sequence[str]) -> bool:
    """Whether queues `ks` hold what they are owed: min(cap, silo) of each type."""
    for k in ks:
        mine = silo[queues.queues[k].name]
        for i, t in enumerate(types):
            if cap[k, i] > 0 and held[k, i] < min(cap[k, i], mine.get(t, 0)):
                return False
    return True
