"""The queues' silos: what each queue's jobs would hold with its guarantee as a
private partition (`silo_use`), which is what the queue is owed in the shared
round, up to its guarantee; and the silos a round has solved so far (`SiloSolves`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.ilp import REFERENCE_SOLVERS, SolveOptions, assemble
from sia_grpc.policy.problem import ChoiceProblem, ChoiceSolution
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.queues.rows import queue_index
from sia_grpc.policy.solvers import solve_reference, solve_separable
from sia_grpc.policy.types import PolicyJob, SiloHint

# What each queue is owed per type (queue name -> GPU type -> GPUs).
Silo = dict[str, dict[str, int]]


def silo_use(table: CandidateTable, jobs: Sequence[PolicyJob], vals: np.ndarray,
             none: np.ndarray, current: np.ndarray, queues: QueueSet,
             timings: dict[str, float], kw: SolveOptions,
             hints: Mapping[str, SiloHint], only: Sequence[int] | None = None,
             qix: np.ndarray | None = None,
             ) -> tuple[Silo, dict[str, SiloHint], dict[str, float]]:
    """What each queue's jobs hold per type with the queue's guarantee as a private
    partition (Sia on its jobs alone, its guarantee of each type the capacity; same
    values and holds): what a queue is owed in the shared round, up to its
    guarantee. The silos are independent problems, solved as one with a block of
    types per queue (`solve_separable`: each to within the gap of its own optimum;
    one problem with a capacity row per queue and type in one Lagrangian was ~10x
    slower); sharing then gives every queue at least its silo and the rest where
    goodput is highest.

    The solve starts from `hints` (the last round's silos: their prices, which
    often prove a silo without an LP, and their choices as the start) and leaves
    its own for the next round. Returns what each queue's jobs hold per type, the
    hints for the next round and counts (`silo_solves`: silos solved,
    `silo_alone`: those the shared steps did not prove) for the round's stats.
    `only`: the indices of the queues whose silos to solve (default: all); `qix`: each
    job's queue (`queue_index`; computed when not given)."""
    types = table.cluster.gpu_types
    T = len(types)
    out = {q.name: dict.fromkeys(types, 0) for q in queues.queues}
    qix = queue_index(jobs, queues) if qix is None else qix
    wanted = range(len(queues.queues)) if only is None else only
    silos = [k for k in wanted if queues.queues[k].guarantee and np.any(qix == k)]
    if not silos:
        return out, {}, {}
    t0 = time.perf_counter()
    block = np.full(len(queues.queues), -1, dtype=np.int64)
    block[silos] = np.arange(len(silos))
    mine = block[qix] >= 0
    ids = [j.job_id for j in jobs]
    before, last, lam = _silo_starts(current, qix, queues, silos, hints, ids, T)
    problem, rows, start = assemble(table, vals, none, before, only=mine)
    start_last = np.full(problem.num_jobs, -1, dtype=np.int64)
    same = np.flatnonzero(table.config[rows] == last[table.job[rows]])
    start_last[problem.col_job[same]] = same
    job_block = block[qix[mine]]
    problem = dataclasses.replace(
        problem, col_type=job_block[problem.col_job] * T + problem.col_type,
        capacity=np.array([queues.queues[k].guarantee.get(t, 0) for k in silos
                           for t in types], dtype=np.int64))
    timings["build"] = timings.get("build", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = _solve_silos(problem, len(silos), T, start, start_last, lam, kw)
    timings["solve"] = timings.get("solve", 0.0) + time.perf_counter() - t0
    left = _read_silos(table, queues, silos, sol, rows, job_block, np.flatnonzero(mine), ids,
                       len(lam), out)
    return out, left, {"silo_solves": float(len(silos)),
                       "silo_alone": float(sol.stats.get("blocks_alone", len(silos)))}


def _silo_starts(current: np.ndarray, qix: np.ndarray, queues: QueueSet, silos: list[int],
                 hints: Mapping[str, SiloHint], ids: list[str],
                 T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The silos' starts: what each job holds now, else what it held in the last
    silo; the last silo (which fits where the queue now borrows); and its prices.
    Where the silo's optimum is tied, the first start wins: owed is then what the
    queue holds, which the shared round can keep without restarts."""
    before = current.copy()
    last = np.full(len(ids), -1, dtype=np.int64)
    lam = np.zeros(len(silos) * T)
    for b, k in enumerate(silos):
        hint = hints.get(queues.queues[k].name)
        if hint is not None and len(hint.prices) == T:
            lam[b * T:(b + 1) * T] = hint.prices
            for i in np.flatnonzero(qix == k).tolist():
                last[i] = hint.choice.get(ids[i], -1)
                if before[i] < 0:
                    before[i] = last[i]
    return before, last, lam


def _solve_silos(problem: ChoiceProblem, n_silos: int, T: int, start: np.ndarray,
                 start_last: np.ndarray, lam: np.ndarray, kw: SolveOptions) -> ChoiceSolution:
    """The silos' problem (a block of `T` types each) solved as one, from both starts."""
    if kw["solver"] == "highs":
        return solve_separable(problem, np.repeat(np.arange(n_silos), T),
                               start=np.stack([start, start_last]), prices=lam,
                               time_limit=kw["time_limit"], rel_gap=kw["rel_gap"])
    # (a reference solves the silos as one ILP: its optimum is each silo's)
    return solve_reference(problem, solver=REFERENCE_SOLVERS[kw["solver"]],
                           time_limit=kw["time_limit"])


def _read_silos(table: CandidateTable, queues: QueueSet, silos: list[int],
                sol: ChoiceSolution, rows: np.ndarray, job_block: np.ndarray,
                where: np.ndarray, ids: list[str], n_prices: int,
                out: Silo) -> dict[str, SiloHint]:
    """Each silo's answer: what its jobs hold per type into `out`; returns its hint
    for the next round. `where`: the job of each of the problem's jobs."""
    types = table.cluster.gpu_types
    T = len(types)
    gpus, typ = table.gpus(), table.types()
    chosen = np.full(len(job_block), -1, dtype=np.int64)
    chosen[sol.choice >= 0] = rows[sol.choice[sol.choice >= 0]]
    prices = sol.prices if len(sol.prices) == n_prices else np.zeros(n_prices)
    left = {}
    on = chosen >= 0
    # GPUs per (block, type) in one pass; each silo's choices as Python ints at once.
    held = np.bincount(job_block[on] * T + typ[chosen[on]], weights=gpus[chosen[on]],
                       minlength=len(silos) * T).astype(np.int64).reshape(len(silos), T)
    picked = np.flatnonzero(on)
    picked_block = job_block[picked].tolist()
    picked_id = [ids[i] for i in where[picked].tolist()]
    picked_config = table.config[chosen[picked]].tolist()
    choices: list[dict[str, int]] = [{} for _ in silos]
    for b, job_id, config in zip(picked_block, picked_id, picked_config, strict=True):
        choices[b][job_id] = config
    for b, k in enumerate(silos):
        name = queues.queues[k].name
        out[name] = dict(zip(types, held[b].tolist(), strict=True))
        left[name] = SiloHint(prices=tuple(prices[b * T:(b + 1) * T].tolist()),
                              choice=choices[b])
    return left


class SiloSolves:
    """The silos a round has solved so far (`solve` adds some): what each queue is
    owed (`silo`), the hints for the next round, which queues, and the counts for
    the round's stats."""

    def __init__(self, table: CandidateTable, jobs: Sequence[PolicyJob], vals: np.ndarray,
                 none: np.ndarray, current: np.ndarray, queues: QueueSet, qix: np.ndarray,
                 timings: dict[str, float], kw: SolveOptions,
                 hints: dict[str, SiloHint]) -> None:
        self.table, self.jobs, self.vals, self.none = table, jobs, vals, none
        self.current, self.queues, self.qix = current, queues, qix
        self.timings, self.kw, self.hints = timings, kw, hints
        self.silo: Silo = {}
        self.solved: set[int] = set()
        self.counts = {"silo_solves": 0.0, "silo_alone": 0.0, "queue_passes": 0.0}

    def solve(self, ks: list[int]) -> None:
        """Solve the silos of queues `ks` (indices)."""
        if not ks:
            return
        queues = self.queues
        part, left, c = silo_use(self.table, self.jobs, self.vals, self.none, self.current,
                                 queues, self.timings, self.kw, self.hints, only=ks,
                                 qix=self.qix)
        self.silo.update({queues.queues[k].name: part[queues.queues[k].name] for k in ks})
        self.hints.update(left)
        self.solved.update(ks)
        for key, v in c.items():
            self.counts[key] += v
