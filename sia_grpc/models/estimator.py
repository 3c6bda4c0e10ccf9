"""Sia's bootstrapped per-GPU-type throughput estimates: what one job's time per
iteration is on each type, from its profiles and its own runs.

A job is profiled on one GPU of each type over ~10 batch sizes; that fixes each
type's compute model. Communication is unknown until the job runs multi-GPU, so:

* before any multi-GPU run, N GPUs are assumed to give exactly N x the 1-GPU
  throughput (no network time at all);
* once the job has run multi-GPU on some type A, Pollux's full model is fitted
  for A, and a type B not yet run multi-GPU is estimated by scaling A's curve:
  xput_B(N) = xput_B(1) / xput_A(1) * xput_A(N)   (A: the type with the most
  distinct multi-GPU observations, ties broken by name);
* once the job has run multi-GPU on B itself, B gets its own full fit.

The job model the policy calls, built on an estimator, is `bootstrap.JobGoodputModel`.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sia_grpc.models.throughput import PerfParams, compute_time, fit_perf_params, step_time

__all__ = ["ThroughputEstimator", "TimePlan", "plan_time", "FITTED", "COMPUTE_ONLY",
           "PROJECTED"]

_Key = tuple[int, int, int]  # (num_nodes, num_replicas, atomic_bsz)
# Measurement(s) as journaled: (type, nodes, replicas, batch sizes, step times, sync times).
Points = tuple[str, list[int], list[int], list[int], list[float], list[float]]

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
    own: npt.NDArray[np.float64]
    ref: npt.NDArray[np.float64]

    def __call__(self, nodes: np.ndarray, reps: np.ndarray, atomic: np.ndarray,
                 accum: np.ndarray) -> npt.NDArray[np.float64]:
        return plan_time(np.array(self.mode), self.own, self.ref,
                         nodes, reps, atomic, accum)


def plan_time(mode: np.ndarray, own: npt.NDArray[np.float64], ref: npt.NDArray[np.float64],
              nodes: npt.ArrayLike, reps: npt.ArrayLike, atomic: npt.ArrayLike,
              accum: npt.ArrayLike) -> npt.NDArray[np.float64]:
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
        self._plans: dict[str, TimePlan] = {}
        self._version = 0
        self._type_versions: dict[str, int] = {}  # per type: bumped when its data changes
        self._uid = _new_uid()
        self._copied = False
        # The last changes, (version after, points): a process holding this estimator
        # at an earlier version is sent them instead of the whole (`changes_since`).
        self._journal: list[tuple[int, Points]] = []

    def __deepcopy__(self, memo: dict[int, object]) -> ThroughputEstimator:
        # A deep copy is a new estimator (a job's own, made from a profile template):
        # it gets a uid of its own at once, unlike the same estimator pickled elsewhere.
        new = ThroughputEstimator.__new__(ThroughputEstimator)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        new._uid, new._copied, new._journal = _new_uid(), False, []
        return new

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_journal"}

    def __setstate__(self, state: dict[str, object]) -> None:
        # A pickled copy keeps the original's uid and version, so the
        # estimate cache of the process it lands in knows it; the first change to
        # the copy gives it a uid of its own (the original may change as well).
        self.__dict__.update(state)
        self._copied = True
        self._journal = []

    # -- input ---------------------------------------------------------------------------

    def _add(self, gpu_type: str, nodes: npt.ArrayLike, reps: npt.ArrayLike,
             bsz: npt.ArrayLike, step: npt.ArrayLike, sync: npt.ArrayLike) -> None:
        points = _points(gpu_type, nodes, reps, bsz, step, sync)
        self._accumulate(points)
        self._journal.append((self._version, points))
        del self._journal[:-_JOURNAL_KEPT]
        if self._copied:
            self._uid, self._copied = _new_uid(), False

    def _accumulate(self, points: Points) -> None:
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

    def changes_since(self, version: int) -> tuple[Points, ...] | None:
        """The changes that bring a copy of this estimator at `version` to this one's
        (`replay`), or None where they are no longer kept (the last few are)."""
        changes = tuple(points for after, points in self._journal if after > version)
        if len(changes) != self._version - version:
            return None
        return changes

    def replay(self, changes: tuple[Points, ...], version: int) -> None:
        """Bring this copy to the original's `version` by the original's `changes`
        (`changes_since`): the same data to the bit, the same uid and per-type
        versions, so caches keyed by them hold for both. ValueError if it ends
        anywhere else (this copy was not at the version the changes start from)."""
        if self._version + len(changes) != version:
            raise ValueError(f"changes from version {version - len(changes)} given to a "
                             f"copy at version {self._version}")
        for points in changes:
            self._accumulate(points)

    def add_profile(self, gpu_type: str, local_bsz: npt.ArrayLike, step_time: npt.ArrayLike,
                    sync_time: npt.ArrayLike) -> None:
        """1-GPU profile point(s) of `gpu_type` (arrays broadcast)."""
        self._add(gpu_type, 1, 1, local_bsz, step_time, sync_time)

    def add_observation(self, gpu_type: str, num_nodes: npt.ArrayLike,
                        num_replicas: npt.ArrayLike, atomic_bsz: npt.ArrayLike,
                        accum_steps: npt.ArrayLike, step_time: npt.ArrayLike,
                        sync_time: npt.ArrayLike) -> None:
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

    def time_fn(self, gpu_type: str) -> TimePlan | None:
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

    def step_time(self, gpu_type: str, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                  atomic_bsz: npt.ArrayLike,
                  accum_steps: npt.ArrayLike = 0) -> npt.NDArray[np.float64]:
        """Estimated seconds per iteration; inf for an unknown type."""
        fn = self.time_fn(gpu_type)
        shape = np.broadcast(np.asarray(num_nodes), np.asarray(num_replicas),
                             np.asarray(atomic_bsz), np.asarray(accum_steps)).shape
        if fn is None:
            return np.full(shape, np.inf)
        return np.broadcast_to(fn(np.asarray(num_nodes), np.asarray(num_replicas),
                                  np.asarray(atomic_bsz), np.asarray(accum_steps)), shape)

    def throughput(self, gpu_type: str, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                   atomic_bsz: npt.ArrayLike,
                   accum_steps: npt.ArrayLike = 0) -> npt.NDArray[np.float64]:
        """Estimated samples per second; 0 for an unknown type."""
        t = self.step_time(gpu_type, num_nodes, num_replicas, atomic_bsz, accum_steps)
        samples = (np.asarray(num_replicas) * np.asarray(atomic_bsz)
                   * (np.asarray(accum_steps) + 1))
        out: npt.NDArray[np.float64] = samples / t
        return out


_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def _points(gpu_type: str, nodes: npt.ArrayLike, reps: npt.ArrayLike, bsz: npt.ArrayLike,
            step: npt.ArrayLike, sync: npt.ArrayLike) -> Points:
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


# Fitted throughput models by (estimator uid, GPU type, version of that type's data).
_JOURNAL_KEPT = 16  # changes an estimator keeps for `changes_since`
_FITS: dict[tuple[int, str, int], PerfParams] = {}
_MAX_FITS = 200_000


def _new_uid() -> int:
    # Not `random`: a test that seeds it twice must not get two estimators one name.
    return int.from_bytes(os.urandom(8), "little")
