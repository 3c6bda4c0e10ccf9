"""The job model the policy calls (`JobGoodputModel`: goodput per GPU type and
configuration, the batch size chosen), and the scoring of many jobs at once
(`evaluate_jobs`), over Sia's bootstrapped throughput estimates (`estimator`).

Both go through the process-wide cache of grids and estimates (`estimate_cache`):
most jobs are unchanged between rounds, and the rest are scored in one stacked
numpy pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from sia_grpc.models.efficiency import GradParams
from sia_grpc.models.estimate_cache import CACHE, Entry
from sia_grpc.models.estimator import ThroughputEstimator, plan_time
from sia_grpc.models.goodput import (
    BatchGrid,
    GoodputEstimate,
    batch_grid,
    best_on_grid,
    fixed_batch,
)

__all__ = ["ThroughputEstimator", "JobGoodputModel", "evaluate_jobs", "evaluate_many"]

# (init_batch_size, max_batch_size, accumulation, sorted per-type local batch limits)
_BoundsKey = tuple[int, int, bool, tuple[tuple[str, tuple[int, int]], ...]]
# A job's rows' grid in the cache: ("rows", estimator uid, its version, bounds, row
# types, nodes' bytes, replicas' bytes).
_RowsKey = tuple[str, int, int, _BoundsKey, tuple[str, ...], bytes, bytes]
# A row of one type's plan: (mode, own params (7,), ref params (7,), lo, hi, known).
_PlanRow = tuple[int, npt.NDArray[np.float64], npt.NDArray[np.float64], float, float, bool]
# The last estimate a model keeps (`evaluate_jobs`): (row key, estimator uid, its
# version, gradient statistics, the packed (5, rows) estimate).
_Memo = tuple[Hashable, int, int, GradParams, npt.NDArray[np.float64]]

# Every row's plan, stacked: mode, own params (rows, 7), ref params (rows, 7), lo, hi, known.
_StackedPlans = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64],
                      npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]

_ONES7 = np.ones(7)
_PLACEHOLDER: _PlanRow = (0, _ONES7, _ONES7, 1.0, 1.0, False)  # a type with no estimate


@dataclass(frozen=True, eq=False)
class JobGoodputModel:
    """What the policy asks about one job: goodput per (GPU type, nodes, replicas).

    The estimator is shared, not copied: observations added to it are seen by every
    model built on it. Gradient statistics change as training goes on; `with_grad`
    makes the updated model.
    """

    estimator: ThroughputEstimator
    grad: GradParams
    init_batch_size: int
    max_batch_size: int
    local_bsz_limits: Mapping[str, tuple[int, int]]  # per type: (min, max) atomic batch
    accumulation: bool = True
    # Grids and estimates are cached process-wide (models.estimate_cache), keyed by
    # the estimator's uid and version and by this model's bounds, so `with_grad` and
    # pickled copies find them.
    _bounds_key: _BoundsKey = dataclasses.field(init=False, repr=False)  # (__post_init__'s)

    def __post_init__(self) -> None:
        if not 0 < self.init_batch_size <= self.max_batch_size:
            raise ValueError("need 0 < init_batch_size <= max_batch_size")
        limits = {str(t): (int(lo), int(hi)) for t, (lo, hi) in self.local_bsz_limits.items()}
        if any(not 1 <= lo <= hi for lo, hi in limits.values()):
            raise ValueError("local batch limits need 1 <= lo <= hi")
        object.__setattr__(self, "local_bsz_limits", limits)
        object.__setattr__(self, "_bounds_key", (
            self.init_batch_size, self.max_batch_size, self.accumulation,
            tuple(sorted(limits.items()))))

    def __getstate__(self) -> dict[str, object]:
        # The last estimate (`evaluate_jobs`' memo) stays in this process: a pickled
        # copy finds it in the receiving process's cache, by content, or makes it.
        state = self.__dict__.copy()
        state.pop("_memo", None)
        return state

    def with_grad(self, grad: GradParams) -> JobGoodputModel:
        return dataclasses.replace(self, grad=grad)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """Types this model can estimate (profiled, with local batch limits)."""
        return tuple(t for t in self.estimator.known_types if t in self.local_bsz_limits)

    def evaluate(self, gpu_type: str, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike, *,
                 fixed_batch_size: int | None = None) -> GoodputEstimate:
        """Best batch choice and its goodput per (num_nodes[i], num_replicas[i]).

        With `fixed_batch_size`, the batch is not chosen and goodput is the
        throughput at that batch (Sia's treatment of strong-scaling and rigid jobs).
        Zero entries: unknown type, or no feasible batch. Returned arrays are
        read-only (they may be cached).
        """
        hit = self._cached(gpu_type, num_nodes, num_replicas, fixed_batch_size)
        if hit is None:
            return _readonly(GoodputEstimate.zeros(np.size(num_replicas)))
        if isinstance(hit, GoodputEstimate):
            return hit
        return best_on_grid(hit, self.grad, self.init_batch_size)

    def grid(self, gpu_type: str, num_nodes: npt.ArrayLike,
             num_replicas: npt.ArrayLike) -> BatchGrid | None:
        """Throughput of each candidate batch size per configuration (see
        `goodput.batch_grid`): what `evaluate` picks from; None for a type the
        model cannot estimate. Independent of the gradient statistics, so cached
        across rounds until the estimator changes."""
        hit = self._cached(gpu_type, num_nodes, num_replicas, None)
        assert hit is None or isinstance(hit, BatchGrid)
        return hit

    def _rows_key(self, gpu_types: tuple[str, ...], nodes: np.ndarray,
                  reps: np.ndarray) -> _RowsKey:
        est = self.estimator
        return ("rows", est.uid, est.version, self._bounds_key, gpu_types, nodes.tobytes(),
                reps.tobytes())

    def _type_plan(self, gpu_type: str) -> _PlanRow:
        """A row of `gpu_type`'s plan: (mode, own params (7,), ref params (7,), lo, hi,
        known); a type it cannot estimate gets placeholder values and known=False."""
        limits = self.local_bsz_limits.get(gpu_type)
        plan = self.estimator.time_fn(gpu_type) if limits is not None else None
        return (_PLACEHOLDER if plan is None or limits is None else
                (plan.mode, plan.own, plan.ref, limits[0], limits[1], True))

    def grid_rows(self, gpu_types: tuple[str, ...], num_nodes: np.ndarray,
                  num_replicas: np.ndarray) -> BatchGrid:
        """`grid` for configurations of mixed types (`gpu_types[i]` per row), in
        row order; rows of types the model cannot estimate have zero throughput.
        Cached as a whole: a job's candidate set rarely changes between rounds."""
        return _grids_for([(self, gpu_types, num_nodes, num_replicas)])[0]

    def _cached(self, gpu_type: str, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                fixed_batch_size: int | None) -> BatchGrid | GoodputEstimate | None:
        nodes = np.asarray(num_nodes, dtype=np.int64)
        reps = np.asarray(num_replicas, dtype=np.int64)
        if nodes.shape != reps.shape:
            nodes, reps = np.broadcast_arrays(nodes, reps)
        limits = self.local_bsz_limits.get(gpu_type)
        fn = self.estimator.time_fn(gpu_type) if limits is not None else None
        if fn is None or limits is None:
            return None
        # The key covers everything the cached value depends on (not the gradient
        # statistics, which a grid does not depend on and a fixed batch ignores).
        est = self.estimator
        key = ("type", est.uid, est.version, self._bounds_key, gpu_type, fixed_batch_size,
               nodes.tobytes(), reps.tobytes())
        entry = CACHE.get(key)
        if entry is None:
            hit: BatchGrid | GoodputEstimate
            if fixed_batch_size is not None:
                hit = _readonly(fixed_batch(fn, nodes, reps, fixed_batch_size,
                                            atomic_bsz_range=limits,
                                            accumulation=self.accumulation))
            else:
                hit = batch_grid(fn, self.init_batch_size, nodes, reps,
                                 max_batch_size=self.max_batch_size, atomic_bsz_range=limits,
                                 accumulation=self.accumulation)
            return CACHE.put(key, Entry(hit)).value
        found: BatchGrid | GoodputEstimate = entry.value  # (what this key is put with)
        return found


Rows = tuple[tuple[str, ...], np.ndarray, np.ndarray]  # GPU type, nodes, replicas per row
_Item = tuple[JobGoodputModel, tuple[str, ...], np.ndarray, np.ndarray]  # a job and its Rows


def evaluate_many(items: list[_Item]) -> GoodputEstimate:
    """Best batch choice and goodput for many jobs' configurations at once.

    Each item is (model, GPU type per configuration, nodes, replicas); the result
    is the concatenation, in item order, of what `model.evaluate` gives for each
    configuration (all fields as floats; the integer ones are exact). See
    `evaluate_jobs`, which this is without row keys.
    """
    return evaluate_jobs([m for m, *_ in items], None, lambda k: items[k][1:])


def evaluate_jobs(models: list[JobGoodputModel], row_keys: list[Hashable] | None,
                  rows_of: Callable[[int], Rows]) -> GoodputEstimate:
    """`evaluate_many` of job k's rows `rows_of(k)`, asked for only where needed.

    The scheduler scores thousands of jobs a round, most of them unchanged since the
    last: a job whose grid and gradient statistics are those of a cached estimate
    takes it; the rest are scored in one numpy pass over their stacked batch grids,
    each row with its own job's gradient statistics. Estimates are cached packed,
    one (5, rows) array per job, so that putting a round together is one
    concatenation.

    `row_keys[k]`, where given, is a compact value equal between two calls exactly
    when job k's rows are (the policy's candidate rows as one bytes object). The
    model object then keeps its last estimate with it (`_memo`), and a job whose
    rows, estimator version and gradient statistics match takes it without its
    rows or the cache's key being built: at 20,000 jobs, building, hashing and
    comparing those nested keys, scattered in memory, was most of a steady round's
    estimate. (A model pickled to another process leaves its memo behind; there the
    cache, keyed by content, serves it.)
    """
    CACHE.new_round()
    if not models:
        return GoodputEstimate(*np.zeros((len(_EST_FIELDS), 0)))
    packed, asked = _from_memos(models, row_keys)
    items: dict[int, _Item] = {k: (models[k], *rows_of(k)) for k in asked}
    keys = {k: m._rows_key(types, nodes, reps) for k, (m, types, nodes, reps) in items.items()}
    est_keys = {k: (keys[k], float(models[k].grad.sqr), float(models[k].grad.var))
                for k in asked}
    for k, e in zip(asked, CACHE.get_many(list(est_keys.values())), strict=True):
        packed[k] = None if e is None else e.value
    stale = [k for k in asked if packed[k] is None]
    CACHE.found += len(models) - len(stale)
    CACHE.made += len(stale)
    if stale:
        fresh = _score([items[k] for k in stale], [keys[k] for k in stale])
        for k, estimate in zip(stale, fresh, strict=True):
            packed[k] = CACHE.put(est_keys[k], Entry(estimate)).value
    done = cast(list[npt.NDArray[np.float64]], packed)  # (each job's, by now)
    if row_keys is not None:
        _remember(models, row_keys, asked, done)
    return GoodputEstimate(*np.concatenate(done, axis=1))


def _from_memos(models: list[JobGoodputModel], row_keys: list[Hashable] | None,
                ) -> tuple[list[npt.NDArray[np.float64] | None], list[int]]:
    """Each job's packed estimate where its model's memo (`_remember`) serves it, None
    elsewhere; and the jobs it did not serve. No memo is looked for without row keys."""
    packed: list[npt.NDArray[np.float64] | None] = [None] * len(models)
    asked: list[int] = []
    for k, m in enumerate(models):
        memo: _Memo | None = m.__dict__.get("_memo") if row_keys is not None else None
        if memo is not None:
            assert row_keys is not None  # (a memo is only looked for with them)
            est = m.estimator  # (its attributes, not its properties: 20,000 calls a round)
            if (memo[0] == row_keys[k] and memo[1] == est._uid and memo[2] == est._version
                    and (memo[3] is m.grad or memo[3] == m.grad)):
                packed[k] = memo[4]
                continue
        asked.append(k)
    return packed, asked


def _remember(models: list[JobGoodputModel], row_keys: list[Hashable], asked: list[int],
              done: list[npt.NDArray[np.float64]]) -> None:
    """Keep with each asked job's model its estimate and what it was made from."""
    for k in asked:
        m = models[k]
        # A copy, not a view: a view would keep the whole round's array alive.
        memo: _Memo = (row_keys[k], m.estimator._uid, m.estimator._version, m.grad,
                       _frozen_copy(done[k]))
        object.__setattr__(m, "_memo", memo)


def _score(items: list[_Item], keys: list[_RowsKey]) -> list[npt.NDArray[np.float64]]:
    """The packed estimates, (5, rows) each, of jobs no cache served: one numpy pass
    over their stacked batch grids, each row with its own job's gradient statistics."""
    grids = _grids_for(items, keys)
    sizes = [g.total.shape[0] for g in grids]
    per_job = np.array([(float(m.grad.sqr), float(m.grad.var), float(m.init_batch_size))
                        for m, *_ in items])
    rows = np.repeat(per_job, sizes, axis=0)
    # (one job's statistics per row: columns, which `efficiency` broadcasts)
    grad = GradParams(sqr=cast(float, rows[:, 0:1]), var=cast(float, rows[:, 1:2]))
    best = best_on_grid(BatchGrid.stack(grids), grad, rows[:, 2:3])
    fresh = np.array([getattr(best, f) for f in _EST_FIELDS], dtype=float)
    fresh.setflags(write=False)
    return [fresh[:, a:b] for a, b in _spans(sizes)]


_EST_FIELDS = tuple(f.name for f in dataclasses.fields(GoodputEstimate))


def _frozen_copy(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out = np.array(a)
    out.setflags(write=False)
    return out


def _grids_for(items: Sequence[_Item], keys: list[_RowsKey] | None = None,
               ) -> list[BatchGrid]:
    """Each item's batch grid, from the cache or, for all misses together, from one
    stacked `batch_grid` call over every missing row's time plan."""
    if keys is None:
        keys = [model._rows_key(types, nodes, reps) for model, types, nodes, reps in items]
    grids: list[BatchGrid | None] = []
    misses: dict[bool, list[int]] = {}
    for k, entry in enumerate(CACHE.get_many(keys)):
        grids.append(None if entry is None else entry.value)
        if entry is None:
            misses.setdefault(items[k][0].accumulation, []).append(k)
    for accumulation, ks in misses.items():
        mode, own, ref, lo, hi, known = _stacked_plans([items[k][:2] for k in ks])
        sizes = [len(items[k][1]) for k in ks]
        init = np.repeat([float(items[k][0].init_batch_size) for k in ks], sizes)
        max_bs = np.repeat([float(items[k][0].max_batch_size) for k in ks], sizes)
        nodes = np.concatenate([items[k][2] for k in ks])
        reps = np.concatenate([items[k][3] for k in ks])
        own3, ref3, mode2 = own.T[:, :, None], ref.T[:, :, None], mode[:, None]

        def time_fn(n: np.ndarray, r: np.ndarray, a: np.ndarray, c: np.ndarray,
                    own3: npt.NDArray[np.float64] = own3, ref3: npt.NDArray[np.float64] = ref3,
                    mode2: npt.NDArray[np.int64] = mode2) -> npt.NDArray[np.float64]:
            return plan_time(mode2, own3, ref3, n, r, a, c)

        grid = batch_grid(time_fn, init, nodes, reps, max_batch_size=max_bs,
                          atomic_bsz_range=(lo, hi), accumulation=accumulation)
        # Unknown types: throughput 0 (their batch stays positive, keeping the
        # efficiency arithmetic finite).
        grid.throughput[~known] = 0.0
        cols = [getattr(grid, f) for f in ("total", "atomic", "accum", "throughput")]
        for k, (a, b) in zip(ks, _spans(sizes), strict=True):
            grids[k] = CACHE.put(keys[k], Entry(BatchGrid(*(c[a:b] for c in cols)))).value
    return cast(list[BatchGrid], grids)  # (each item's, by now)


def _stacked_plans(parts: list[tuple[JobGoodputModel, tuple[str, ...]]]) -> _StackedPlans:
    """The rows' plans (`_type_plan`) of every (model, row types) part, stacked in
    order: per row, (mode, own params (7,), ref params (7,), lo, hi, known). One entry per
    (part, type) and one index per row, so that the arrays are built once for all
    parts: per part, six small arrays cost more than its rows' plans."""
    entries: list[_PlanRow] = []
    index: list[int] = []
    for model, types in parts:
        local: dict[str, int] = {}
        for t in types:
            e = local.get(t)
            if e is None:
                e = local[t] = len(entries)
                entries.append(model._type_plan(t))
            index.append(e)
    if not entries:
        return (np.zeros(0, dtype=np.int64), np.zeros((0, 7)), np.zeros((0, 7)),
                np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool))
    at = np.array(index, dtype=np.int64)
    return (np.array([e[0] for e in entries], dtype=np.int64)[at],
            np.array([e[1] for e in entries])[at], np.array([e[2] for e in entries])[at],
            np.array([e[3] for e in entries], dtype=float)[at],
            np.array([e[4] for e in entries], dtype=float)[at],
            np.array([e[5] for e in entries], dtype=bool)[at])


def _spans(sizes: list[int]) -> list[tuple[int, int]]:
    """(start, end) of consecutive parts of the given sizes (np.split without its
    per-part overhead, which dominated a round of 20,000 jobs)."""
    ends = np.cumsum(sizes).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _readonly(est: GoodputEstimate) -> GoodputEstimate:
    for arr in (est.goodput, est.throughput, est.batch_size, est.atomic_bsz, est.accum_steps):
        arr.setflags(write=False)
    return est
