"""Goodput = throughput x statistical efficiency, and the batch-size choice behind it.

`choose_batch` and `fixed_batch` are written against any iteration-time function
`time_fn(num_nodes, num_replicas, atomic_bsz, accum_steps) -> seconds`, so the
same code serves a single fitted model (GoodputFunction) and Sia's bootstrapped
per-GPU-type estimates (bootstrap.JobGoodputModel).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sia_grpc.models.efficiency import GradParams, efficiency
from sia_grpc.models.throughput import PerfParams, step_time, throughput

__all__ = [
    "GoodputEstimate",
    "GoodputFunction",
    "BatchGrid",
    "batch_grid",
    "best_on_grid",
    "choose_batch",
    "fixed_batch",
    "split_local_batch",
    "NUM_BATCH_SAMPLES",
]

NUM_BATCH_SAMPLES = 50  # global batch sizes tried per configuration, as in Pollux
_EPS = 1e-8  # tolerance for ceil() of float batch sizes

TimeFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True, eq=False)
class GoodputEstimate:
    """Per-configuration estimates, equal-length 1-D arrays; all zero where infeasible."""

    goodput: np.ndarray  # samples/s x efficiency (throughput alone for fixed-batch jobs)
    throughput: np.ndarray  # samples/s
    batch_size: np.ndarray  # global batch = num_replicas * atomic_bsz * (accum_steps + 1)
    atomic_bsz: np.ndarray  # per-replica micro-batch
    accum_steps: np.ndarray  # extra micro-batches before each all-reduce

    def __len__(self) -> int:
        return len(self.goodput)

    @staticmethod
    def zeros(n: int) -> GoodputEstimate:
        z = np.zeros(n)
        zi = np.zeros(n, dtype=np.int64)
        return GoodputEstimate(z, z.copy(), zi, zi.copy(), zi.copy())


def split_local_batch(local_bsz: npt.ArrayLike, max_atomic_bsz: npt.ArrayLike,
                      accumulation: bool = True,
                      ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Split a per-replica batch into (atomic_bsz, accum_steps), the fewest micro-batches
    of at most `max_atomic_bsz` each (atomic rounded up, so the batch may grow a little)."""
    local = np.asarray(local_bsz, dtype=float)
    if accumulation:
        accum = np.maximum(np.ceil(local / max_atomic_bsz - _EPS) - 1, 0).astype(np.int64)
    else:
        accum = np.zeros(local.shape, dtype=np.int64)
    atomic = np.ceil(local / (accum + 1) - _EPS).astype(np.int64)
    return atomic, accum


def _flat_configs(num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    nodes = np.asarray(num_nodes, dtype=np.int64)
    reps = np.asarray(num_replicas, dtype=np.int64)
    if nodes.shape != reps.shape:
        nodes, reps = np.broadcast_arrays(nodes, reps)
    return nodes.ravel(), reps.ravel()


@functools.cache
def _unit_steps(num_samples: int) -> npt.NDArray[np.float64]:
    steps = np.linspace(0.0, 1.0, num_samples)
    steps.setflags(write=False)
    return steps


@dataclass(frozen=True, eq=False)
class BatchGrid:
    """Candidate batches for K configurations x `num_samples` global batch sizes.

    Independent of the gradient statistics, so it can be reused while only those
    change (they change every round; the throughput model only on new data).
    """

    total: np.ndarray  # (K, S) global batch actually run
    atomic: np.ndarray  # (K, S)
    accum: np.ndarray  # (K, S)
    throughput: np.ndarray  # (K, S) samples/s, 0 where infeasible

    @staticmethod
    def stack(grids: list[BatchGrid]) -> BatchGrid:
        return BatchGrid(*(np.concatenate([getattr(g, f) for g in grids])
                           for f in ("total", "atomic", "accum", "throughput")))


def batch_grid(time_fn: TimeFn, init_batch_size: npt.ArrayLike, num_nodes: npt.ArrayLike,
               num_replicas: npt.ArrayLike, *, max_batch_size: npt.ArrayLike,
               atomic_bsz_range: tuple[npt.ArrayLike, npt.ArrayLike],
               accumulation: bool = True,
               num_samples: int = NUM_BATCH_SAMPLES) -> BatchGrid:
    """Throughput of `num_samples` global batch sizes per configuration, spaced
    geometrically from the smallest the configuration can run (at least
    init_batch_size, at least lo per replica) to `max_batch_size`. Infeasible
    entries (smallest batch above the maximum; without accumulation, a local batch
    above hi) have throughput 0.

    `init_batch_size`, `max_batch_size` and the range bounds may be scalars or
    one value per configuration (many jobs' grids built in one pass); `time_fn`
    then sees (K, 1)-shaped nodes and replicas, rows aligned with them."""
    nodes, reps = _flat_configs(num_nodes, num_replicas)
    lo, hi = (np.asarray(v, dtype=float) for v in atomic_bsz_range)
    max_bs = np.asarray(max_batch_size, dtype=float)
    min_batch = np.maximum(np.asarray(init_batch_size, dtype=float), lo * reps)
    fits = min_batch <= max_bs * (1 + _EPS)
    steps = _unit_steps(num_samples)
    log_lo = np.log(min_batch)
    batch = np.exp(log_lo[:, None] + steps[None, :] * (np.log(max_bs) - log_lo)[:, None])
    reps2 = reps[:, None]
    lo2 = lo[:, None] if lo.ndim else lo
    hi2 = hi[:, None] if hi.ndim else hi
    atomic, accum = split_local_batch(batch / reps2, hi2, accumulation)
    valid = (atomic >= lo2) & (atomic <= hi2) & fits[:, None]
    t_iter = time_fn(nodes[:, None], reps2, atomic, accum)
    total = reps2 * atomic * (accum + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        xput = np.where(valid, total / t_iter, 0.0)
    xput = np.where(np.isfinite(xput), xput, 0.0)
    return BatchGrid(total=total, atomic=atomic, accum=accum, throughput=xput)


def best_on_grid(grid: BatchGrid, grad: GradParams,
                 init_batch_size: npt.ArrayLike) -> GoodputEstimate:
    """The goodput-maximising entry of each row of `grid` (zeros where none is feasible).

    `grad` fields and `init_batch_size` may be column vectors, one value per row,
    to score the stacked grids of many jobs in one pass."""
    n = grid.total.shape[0]
    if n == 0:
        return GoodputEstimate.zeros(0)
    good = grid.throughput * efficiency(grad, grid.total, init_batch_size)
    best = np.argmax(good, axis=1)
    rows = np.arange(n)
    g = good[rows, best]
    ok = g > 0
    return GoodputEstimate(
        goodput=g,
        throughput=np.where(ok, grid.throughput[rows, best], 0.0),
        batch_size=np.where(ok, grid.total[rows, best], 0),
        atomic_bsz=np.where(ok, grid.atomic[rows, best], 0),
        accum_steps=np.where(ok, grid.accum[rows, best], 0),
    )


def choose_batch(time_fn: TimeFn, grad: GradParams, init_batch_size: float,
                 num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike, *,
                 max_batch_size: float, atomic_bsz_range: tuple[float, float],
                 accumulation: bool = True,
                 num_samples: int = NUM_BATCH_SAMPLES) -> GoodputEstimate:
    """Goodput-maximising batch size per (num_nodes, num_replicas), as Pollux does it:
    the best of `batch_grid`'s candidates (see there)."""
    grid = batch_grid(time_fn, init_batch_size, num_nodes, num_replicas,
                      max_batch_size=max_batch_size, atomic_bsz_range=atomic_bsz_range,
                      accumulation=accumulation, num_samples=num_samples)
    return best_on_grid(grid, grad, init_batch_size)


def fixed_batch(time_fn: TimeFn, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                batch_size: float, *,
                atomic_bsz_range: tuple[int, int], accumulation: bool = True) -> GoodputEstimate:
    """Throughput at a fixed global batch size (strong-scaling and rigid jobs).

    goodput := throughput here, as Sia does for jobs whose batch size is fixed.
    Zero where the batch cannot be split into micro-batches within the range
    (e.g. batch_size < num_replicas * lo).
    """
    nodes, reps = _flat_configs(num_nodes, num_replicas)
    lo, hi = atomic_bsz_range
    if nodes.size == 0:
        return GoodputEstimate.zeros(0)
    atomic, accum = split_local_batch(float(batch_size) / reps, hi, accumulation)
    valid = (atomic >= lo) & (atomic <= hi) & (batch_size >= lo * reps)
    total = reps * atomic * (accum + 1)
    t_iter = time_fn(nodes, reps, atomic, accum)
    xput = np.where(valid, total / t_iter, 0.0)
    xput = np.where(np.isfinite(xput), xput, 0.0)
    ok = xput > 0
    return GoodputEstimate(
        goodput=xput,
        throughput=xput.copy(),
        batch_size=np.where(ok, total, 0),
        atomic_bsz=np.where(ok, atomic, 0),
        accum_steps=np.where(ok, accum, 0),
    )


def _unflatten(values: np.ndarray, shape: tuple[int, ...],
               scalar: bool) -> float | np.ndarray:
    if scalar:
        value: float = values.item()
        return value
    return values.reshape(shape)


@dataclass(frozen=True)
class GoodputFunction:
    """Pollux's goodput function of one job on one (homogeneous) GPU type."""

    perf: PerfParams
    grad: GradParams
    init_batch_size: float

    def _time(self, nodes: np.ndarray, reps: np.ndarray, atomic: np.ndarray,
              accum: np.ndarray) -> npt.NDArray[np.float64]:
        return step_time(self.perf, nodes, reps, atomic, accum)

    def throughput(self, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                   atomic_bsz: npt.ArrayLike,
                   accum_steps: npt.ArrayLike = 0) -> npt.NDArray[np.float64]:
        return throughput(self.perf, num_nodes, num_replicas, atomic_bsz, accum_steps)

    def efficiency(self, batch_size: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return efficiency(self.grad, batch_size, self.init_batch_size)

    def evaluate(self, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                 atomic_bsz: npt.ArrayLike,
                 accum_steps: npt.ArrayLike = 0) -> npt.NDArray[np.float64]:
        batch = (np.asarray(num_replicas) * np.asarray(atomic_bsz)
                 * (np.asarray(accum_steps) + 1))
        return (self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps)
                * self.efficiency(batch))

    __call__ = evaluate

    def optimize(self, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike, *,
                 max_batch_size: float | None = None,
                 atomic_bsz_range: tuple[int | None, int | None] | None = None,
                 accumulation: bool = True,
                 ) -> tuple[float | np.ndarray, float | np.ndarray, float | np.ndarray]:
        """Best (goodput, atomic_bsz, accum_steps) per configuration; scalars for scalars."""
        max_bs = self.init_batch_size if max_batch_size is None else max_batch_size
        if max_bs < self.init_batch_size:
            raise ValueError("max_batch_size < init_batch_size")
        lo, hi = atomic_bsz_range or (None, None)
        rng = (lo or 1, hi or max_bs)
        shape = np.broadcast(np.asarray(num_nodes), np.asarray(num_replicas)).shape
        scalar = shape == ()
        est = choose_batch(self._time, self.grad, self.init_batch_size, num_nodes,
                           num_replicas, max_batch_size=max_bs, atomic_bsz_range=rng,
                           accumulation=accumulation)
        return (_unflatten(est.goodput, shape, scalar),
                _unflatten(est.atomic_bsz, shape, scalar),
                _unflatten(est.accum_steps, shape, scalar))

    def fixed_batch(self, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                    batch_size: float, *,
                    atomic_bsz_range: tuple[int, int],
                    accumulation: bool = True) -> GoodputEstimate:
        return fixed_batch(self._time, num_nodes, num_replicas, batch_size,
                           atomic_bsz_range=atomic_bsz_range, accumulation=accumulation)
