"""Sia's bootstrapped per-GPU-type throughput estimates, and the job model the policy calls.

A job is profiled on one GPU of each type over ~10 batch sizes; that fixes each
type's compute model. Communication is unknown until the job runs multi-GPU, so:

* before any multi-GPU run, N GPUs are assumed to give exactly N x the 1-GPU
  throughput (no network time at all);
* once the job has run multi-GPU on some type A, Pollux's full model is fitted
  for A, and a type B not yet run multi-GPU is estimated by scaling A's curve:
  xput_B(N) = xput_B(1) / xput_A(1) * xput_A(N)   (A: the type with the most
  distinct multi-GPU observations, ties broken by name);
* once the job has run multi-GPU on B itself, B gets its own full fit.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np

from sia_grpc.models.efficiency import GradParams
from sia_grpc.models.estimate_cache import CACHE, Entry
from sia_grpc.models.goodput import (
    BatchGrid,
    GoodputEstimate,
    batch_grid,
    best_on_grid,
    fixed_batch,
)
from sia_grpc.models.throughput import PerfParams, compute_time, fit_perf_params, step_time

__all__ = ["ThroughputEstimator", "JobGoodputModel", "evaluate_jobs", "evaluate_many"]

_Key = tuple[int, int, int]  # (num_nodes, num_replicas, atomic_bsz)


_ONES7 = np.ones(7)
_PLACEHOLDER = (0, _ONES7, _ONES7, 1.0, 1.0, False)  # a row of a type with no estimate

# How a type's iteration time is estimated (see TimePlan).
FITTED, COMPUTE_ONLY, PROJECTED = 0, 1, 2


@dataclass(frozen=True, eq=False)
class TimePlan:
    """How one type's iteration time is estimated, as plain parameters so that the
    plans of many jobs and types can be stacked and evaluated in one numpy pass.

    `own` is the type's Pollux model (7 values, `PerfParams` order); `ref` the
    reference type's full model (used when `mode` is PROJECTED; else = own).
    """

    mode: int
    own: np.ndarray
    ref: np.ndarray

    def __call__(self, nodes, reps, atomic, accum) -> np.ndarray:
        return plan_time(np.array(self.mode), self.own, self.ref,
                         nodes, reps, atomic, accum)


def plan_time(mode: np.ndarray, own: np.ndarray, ref: np.ndarray, nodes, reps, atomic,
              accum) -> np.ndarray:
    """Iteration time for stacked plans: `own`, `ref` are (7, rows, 1) parameter
    arrays and `mode` a (rows, 1) array (or all shaped for one plan).

    FITTED: Pollux's step time from the type's own full model. COMPUTE_ONLY (only
    1-GPU data anywhere): no network time at all, so N GPUs give exactly N× one.
    PROJECTED: the type's 1-GPU time scaled by the reference type's N-GPU / 1-GPU
    ratio at the same micro-batch and accumulation, i.e.
    xput_B(N) = xput_B(1) / xput_A(1) · xput_A(N) (equal samples per iteration).
    """
    own_p, ref_p = PerfParams(*own), PerfParams(*ref)
    own_1 = (np.asarray(accum) + 1) * compute_time(own_p, atomic)
    out = np.where(mode == COMPUTE_ONLY, own_1, 0.0)
    if np.any(mode == FITTED):
        out = np.where(mode == FITTED, step_time(own_p, nodes, reps, atomic, accum), out)
    if np.any(mode == PROJECTED):
        ratio = (step_time(ref_p, nodes, reps, atomic, accum)
                 / step_time(ref_p, 1, 1, atomic, accum))
        out = np.where(mode == PROJECTED, own_1 * ratio, out)
    return out


class ThroughputEstimator:
    """Per-job, per-GPU-type throughput estimates from profiles and observations.

    Measurements follow the artifact's convention: `step_time` is the time of the
    micro-batch that ends in the all-reduce, `sync_time` the all-reduce part of it,
    so a non-syncing micro-batch takes step_time - sync_time. Repeated measurements
    of one (num_nodes, num_replicas, atomic_bsz) are averaged. Fits are cached per
    type and redone lazily when that type's data changes.
    """

    def __init__(self) -> None:
        # type -> key -> [count, sum(step_time), sum(sync_time)]
        self._data: dict[str, dict[_Key, list[float]]] = {}
        self._fits: dict[str, PerfParams] = {}
        self._plans: dict[str, object] = {}
        self._version = 0
        self._type_versions: dict[str, int] = {}  # per type: bumped when its data changes
        self._uid = _new_uid()
        self._copied = False
        # The last changes, (version after, points): a process holding this estimator
        # at an earlier version is sent them instead of the whole (`changes_since`).
        self._journal: list[tuple[int, tuple]] = []

    def __deepcopy__(self, memo: dict) -> ThroughputEstimator:
        # A deep copy is a new estimator (a job's own, made from a profile template):
        # it gets a uid of its own at once, unlike the same estimator pickled elsewhere.
        new = ThroughputEstimator.__new__(ThroughputEstimator)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        new._uid, new._copied, new._journal = _new_uid(), False, []
        return new

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_journal"}

    def __setstate__(self, state: dict) -> None:
        # A pickled copy keeps the original's uid and version, so the
        # estimate cache of the process it lands in knows it; the first change to
        # the copy gives it a uid of its own (the original may change as well).
        self.__dict__.update(state)
        self._copied = True
        self._journal = []

    # -- input ---------------------------------------------------------------------------

    def _add(self, gpu_type: str, nodes, reps, bsz, step, sync) -> None:
        points = _points(gpu_type, nodes, reps, bsz, step, sync)
        self._accumulate(points)
        self._journal.append((self._version, points))
        del self._journal[:-_JOURNAL_KEPT]
        if self._copied:
            self._uid, self._copied = _new_uid(), False

    def _accumulate(self, points: tuple) -> None:
        gpu_type, nodes, reps, bsz, step, sync = points
        table = self._data.setdefault(gpu_type, {})
        for n, r, b, s, y in zip(nodes, reps, bsz, step, sync, strict=True):
            acc = table.setdefault((n, r, b), [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += s
            acc[2] += y
        self._fits.pop(gpu_type, None)
        self._plans.clear()  # other types' projections may depend on this one
        self._version += 1
        self._type_versions[gpu_type] = self._type_versions.get(gpu_type, 0) + 1

    def changes_since(self, version: int) -> tuple | None:
        """The changes that bring a copy of this estimator at `version` to this one's
        (`replay`), or None where they are no longer kept (the last few are)."""
        changes = tuple(points for after, points in self._journal if after > version)
        if len(changes) != self._version - version:
            return None
        return changes

    def replay(self, changes: tuple, version: int) -> None:
        """Bring this copy to the original's `version` by the original's `changes`
        (`changes_since`): the same data to the bit, the same uid and per-type
        versions, so caches keyed by them hold for both. ValueError if it ends
        anywhere else (this copy was not at the version the changes start from)."""
        if self._version + len(changes) != version:
            raise ValueError(f"changes from version {version - len(changes)} given to a "
                             f"copy at version {self._version}")
        for points in changes:
            self._accumulate(points)

    def add_profile(self, gpu_type: str, local_bsz, step_time, sync_time) -> None:
        """1-GPU profile point(s) of `gpu_type` (arrays broadcast)."""
        self._add(gpu_type, 1, 1, local_bsz, step_time, sync_time)

    def add_observation(self, gpu_type: str, num_nodes, num_replicas, atomic_bsz,
                        accum_steps, step_time, sync_time) -> None:
        """Measurement(s) from the job's own runs (arrays broadcast).

        `accum_steps` does not change the meaning of the times (see the class doc);
        it is checked only.
        """
        if np.any(np.asarray(accum_steps) < 0):
            raise ValueError("accum_steps must be >= 0")
        self._add(gpu_type, num_nodes, num_replicas, atomic_bsz, step_time, sync_time)

    # -- queries -------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Bumped on every change; lets callers cache derived results."""
        return self._version

    @property
    def uid(self) -> int:
        """This estimator's name in caches, kept by copies until they change: with
        `version`, it says what the estimates are derived from."""
        return self._uid

    @property
    def known_types(self) -> tuple[str, ...]:
        return tuple(sorted(t for t, d in self._data.items() if d))

    def num_multi_gpu(self, gpu_type: str) -> int:
        """Distinct multi-GPU configurations the job has been measured on."""
        return sum(1 for (_, r, _) in self._data.get(gpu_type, {}) if r > 1)

    @property
    def reference_type(self) -> str | None:
        """The type whose full model projects onto types without multi-GPU data."""
        counts = [(-self.num_multi_gpu(t), t) for t in self.known_types]
        counts = [c for c in counts if c[0] < 0]
        return min(counts)[1] if counts else None

    def perf_params(self, gpu_type: str) -> PerfParams | None:
        """Pollux's model fitted to this type's own data (None if it has none)."""
        if gpu_type in self._fits:
            return self._fits[gpu_type]
        table = self._data.get(gpu_type)
        if not table:
            return None
        # Also kept process-wide by (estimator, type, that type's data): the controller
        # ships copies without the fits its solver process made; a running job's
        # telemetry changes one type's data, and only that type is fitted again.
        key = (self._uid, gpu_type, self._type_versions.get(gpu_type, 0))
        params = _FITS.get(key)
        if params is None:
            keys = np.array(list(table.keys()), dtype=np.int64)
            sums = np.array(list(table.values()), dtype=float)
            step = sums[:, 1] / sums[:, 0]
            sync = sums[:, 2] / sums[:, 0]
            params = fit_perf_params(keys[:, 0], keys[:, 1], keys[:, 2], step - sync, step)
            if len(_FITS) >= _MAX_FITS:
                _FITS.clear()
            _FITS[key] = params
        self._fits[gpu_type] = params
        return params

    def time_fn(self, gpu_type: str):
        """Iteration-time function `f(num_nodes, num_replicas, atomic_bsz, accum_steps)`
        for `gpu_type`, or None if the type is unknown. Cached until data changes."""
        plan = self._plans.get(gpu_type)
        if plan is not None:
            return plan
        own = self.perf_params(gpu_type)
        if own is None:
            return None
        mine = own.as_array()
        if self.num_multi_gpu(gpu_type) > 0:
            plan = TimePlan(FITTED, mine, mine)
        else:
            ref = self.reference_type
            ref_params = self.perf_params(ref) if ref is not None else None
            plan = (TimePlan(COMPUTE_ONLY, mine, mine) if ref_params is None
                    else TimePlan(PROJECTED, mine, ref_params.as_array()))
        self._plans[gpu_type] = plan
        return plan

    def step_time(self, gpu_type: str, num_nodes, num_replicas, atomic_bsz,
                  accum_steps=0) -> np.ndarray:
        """Estimated seconds per iteration; inf for an unknown type."""
        fn = self.time_fn(gpu_type)
        shape = np.broadcast(np.asarray(num_nodes), np.asarray(num_replicas),
                             np.asarray(atomic_bsz), np.asarray(accum_steps)).shape
        if fn is None:
            return np.full(shape, np.inf)
        return np.broadcast_to(fn(np.asarray(num_nodes), np.asarray(num_replicas),
                                  np.asarray(atomic_bsz), np.asarray(accum_steps)), shape)

    def throughput(self, gpu_type: str, num_nodes, num_replicas, atomic_bsz,
                   accum_steps=0) -> np.ndarray:
        """Estimated samples per second; 0 for an unknown type."""
        t = self.step_time(gpu_type, num_nodes, num_replicas, atomic_bsz, accum_steps)
        samples = (np.asarray(num_replicas) * np.asarray(atomic_bsz)
                   * (np.asarray(accum_steps) + 1))
        return samples / t



_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def _points(gpu_type: str, nodes, reps, bsz, step, sync) -> tuple:
    """Measurement(s) as the estimator journals them: (type, nodes, replicas, batch
    sizes, step times, sync times), each a list, arrays broadcast; ValueError naming
    the rule a point breaks. One point of plain numbers (a running job's report, the
    controller's every telemetry sample) skips numpy: the same lists, ~20x faster."""
    if (isinstance(nodes, _INTS) and isinstance(reps, _INTS) and isinstance(bsz, _REALS)
            and isinstance(step, _REALS) and isinstance(sync, _REALS)
            and not any(isinstance(x, bool) for x in (nodes, reps, bsz))):
        if not math.isfinite(bsz) or bsz != round(bsz) or bsz < 1:
            raise ValueError("batch sizes must be positive integers")
        if nodes < 1 or reps < nodes:
            raise ValueError("need 1 <= num_nodes <= num_replicas")
        step, sync = float(step), float(sync)
        if not (sync >= 0 and step > sync):
            raise ValueError("need 0 <= sync_time < step_time")
        return gpu_type, [int(nodes)], [int(reps)], [int(bsz)], [step], [sync]
    nodes, reps, bsz, step, sync = np.broadcast_arrays(
        np.asarray(nodes, dtype=np.int64), np.asarray(reps, dtype=np.int64),
        np.asarray(bsz), np.asarray(step, dtype=float), np.asarray(sync, dtype=float))
    if not np.all(np.isfinite(bsz)) or np.any(bsz != np.round(bsz)) or np.any(bsz < 1):
        raise ValueError("batch sizes must be positive integers")
    if np.any(nodes < 1) or np.any(reps < nodes):
        raise ValueError("need 1 <= num_nodes <= num_replicas")
    if not (np.all(sync >= 0) and np.all(step > sync)):
        raise ValueError("need 0 <= sync_time < step_time")
    return (gpu_type, nodes.ravel().tolist(), reps.ravel().tolist(),
            bsz.ravel().astype(np.int64).tolist(), step.ravel().tolist(), sync.ravel().tolist())

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
    _bounds_key: tuple = dataclasses.field(init=False, repr=False)  # (__post_init__'s)

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

    def __getstate__(self) -> dict:
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

    def evaluate(self, gpu_type: str, num_nodes, num_replicas, *,
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

    def grid(self, gpu_type: str, num_nodes, num_replicas) -> BatchGrid | None:
        """Throughput of each candidate batch size per configuration (see
        `goodput.batch_grid`): what `evaluate` picks from; None for a type the
        model cannot estimate. Independent of the gradient statistics, so cached
        across rounds until the estimator changes."""
        hit = self._cached(gpu_type, num_nodes, num_replicas, None)
        assert hit is None or isinstance(hit, BatchGrid)
        return hit

    def _rows_key(self, gpu_types: tuple[str, ...], nodes: np.ndarray,
                  reps: np.ndarray) -> tuple:
        est = self.estimator
        return ("rows", est.uid, est.version, self._bounds_key, gpu_types, nodes.tobytes(),
                reps.tobytes())

    def _type_plan(self, gpu_type: str) -> tuple:
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

    def _cached(self, gpu_type: str, num_nodes, num_replicas,
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
            entry = CACHE.put(key, Entry(hit))
        return entry.value


Rows = tuple[tuple[str, ...], np.ndarray, np.ndarray]  # GPU type, nodes, replicas per row


def evaluate_many(items: list[tuple[JobGoodputModel, tuple[str, ...], np.ndarray, np.ndarray]],
                  ) -> GoodputEstimate:
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
    packed: list[np.ndarray | None] = [None] * len(models)
    asked: list[int] = []  # jobs their model's memo did not serve
    for k, m in enumerate(models):
        memo = m.__dict__.get("_memo") if row_keys is not None else None
        if memo is not None:
            assert row_keys is not None  # (a memo is only looked for with them)
            est = m.estimator  # (its attributes, not its properties: 20,000 calls a round)
            if (memo[0] == row_keys[k] and memo[1] == est._uid and memo[2] == est._version
                    and (memo[3] is m.grad or memo[3] == m.grad)):
                packed[k] = memo[4]
                continue
        asked.append(k)
    items = {k: (models[k], *rows_of(k)) for k in asked}
    keys = {k: m._rows_key(types, nodes, reps) for k, (m, types, nodes, reps) in items.items()}
    est_keys = {k: (keys[k], float(models[k].grad.sqr), float(models[k].grad.var))
                for k in asked}
    for k, e in zip(asked, CACHE.get_many(list(est_keys.values())), strict=True):
        packed[k] = None if e is None else e.value
    stale = [k for k in asked if packed[k] is None]
    CACHE.found += len(models) - len(stale)
    CACHE.made += len(stale)
    if stale:
        grids = _grids_for([items[k] for k in stale], [keys[k] for k in stale])
        sizes = [g.total.shape[0] for g in grids]
        per_job = np.array([est_keys[k][1:] + (float(models[k].init_batch_size),)
                            for k in stale])
        rows = np.repeat(per_job, sizes, axis=0)
        # (one job's statistics per row: columns, which `efficiency` broadcasts)
        grad = GradParams(sqr=cast(float, rows[:, 0:1]), var=cast(float, rows[:, 1:2]))
        best = best_on_grid(BatchGrid.stack(grids), grad, rows[:, 2:3])
        fresh = np.array([getattr(best, f) for f in _EST_FIELDS], dtype=float)
        fresh.setflags(write=False)
        for k, (a, b) in zip(stale, _spans(sizes), strict=True):
            packed[k] = CACHE.put(est_keys[k], Entry(fresh[:, a:b])).value
    done = cast(list[np.ndarray], packed)  # (each job's, by now)
    if row_keys is not None:
        for k in asked:
            m = models[k]
            # A copy, not a view: a view would keep the whole round's array alive.
            object.__setattr__(m, "_memo", (row_keys[k], m.estimator._uid,
                                            m.estimator._version, m.grad,
                                            _frozen_copy(done[k])))
    return GoodputEstimate(*np.concatenate(done, axis=1))


_EST_FIELDS = tuple(f.name for f in dataclasses.fields(GoodputEstimate))


def _frozen_copy(a: np.ndarray) -> np.ndarray:
    out = np.array(a)
    out.setflags(write=False)
    return out


def _grids_for(items, keys=None) -> list[BatchGrid]:
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

        def time_fn(n, r, a, c, own3=own3, ref3=ref3, mode2=mode2):
            return plan_time(mode2, own3, ref3, n, r, a, c)

        grid = batch_grid(time_fn, init, nodes, reps, max_batch_size=max_bs,
                          atomic_bsz_range=(lo, hi), accumulation=accumulation)
        # Unknown types: throughput 0 (their batch stays positive, keeping the
        # efficiency arithmetic finite).
        grid.throughput[~known] = 0.0
        cols = [getattr(grid, f) for f in ("total", "atomic", "accum", "throughput")]
        for k, (a, b) in zip(ks, _spans(sizes), strict=True):
            grids[k] = CACHE.put(keys[k], Entry(BatchGrid(*(c[a:b] for c in cols)))).value
    return grids  # type: ignore[return-value]


def _stacked_plans(parts: list[tuple[JobGoodputModel, tuple[str, ...]]]
                   ) -> tuple[np.ndarray, ...]:
    """The rows' plans (`_type_plan`) of every (model, row types) part, stacked in
    order: per row, (mode, own params (7,), ref params (7,), lo, hi, known). One entry per
    (part, type) and one index per row, so that the arrays are built once for all
    parts: per part, six small arrays cost more than its rows' plans."""
    entries: list[tuple] = []
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


# Fitted throughput models by (estimator uid, GPU type, version of that type's data).
_JOURNAL_KEPT = 16  # changes an estimator keeps for `changes_since`
_FITS: dict[tuple[int, str, int], PerfParams] = {}
_MAX_FITS = 200_000


def _new_uid() -> int:
    # Not `random`: a test that seeds it twice must not get two estimators one name.
    return int.from_bytes(os.urandom(8), "little")
