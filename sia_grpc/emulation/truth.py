"""What an application really does: the ground truth the simulator and the modeled
node agents emulate.

Built from the artifact's measurements (`sia_grpc/data/artifact/`) in the manner of
the Pollux and Sia simulators, and never shown to the policy under test.

Step times
    `step_time(gpu_type, num_nodes, num_replicas, atomic_bsz)` answers for the
    placement the request stands for. Placements are digit strings, one digit per
    node giving its replicas; `(num_nodes, num_replicas)` stands for the replicas
    spread as evenly as possible over the nodes, which is exactly what Sia's
    configuration set produces: a partial-node allocation is one digit (`"4"`),
    a whole-node one is `num_nodes` digits of R, the type's GPUs per node (R is
    the largest digit in the type's placements file: 4 for aws and quad, 8 for
    the others), e.g. `"888"`. The order of the digits does not matter (`"132"`
    and `"123"` are one placement, their rows are averaged). A request with more
    replicas than `num_nodes`·R is treated as `ceil(num_replicas / R)` nodes.

    1. The placement is in `placements-<type>.csv`: linear interpolation over
       local batch size among its rows (rows repeated for one batch size are
       averaged).
    2. Otherwise, from the placements rows averaged per (num_nodes, num_replicas,
       local_bsz) together with `scalability-<type>.csv`, with num_nodes capped at
       the largest node count in that data: the rows at exactly (nodes, replicas)
       if there are any, else linear interpolation over replicas between the two
       measured replica counts at that node count that bracket the request (at
       every local batch size either was measured at); where none bracket it,
       the rows of the nearest measured (num_nodes, num_replicas) (Euclidean,
       after the cap; ties to the smaller pair) stand in. (A 3-D
       `LinearNDInterpolator` over (nodes, replicas, batch) was used before: it
       took 8–37 s to triangulate for some types and mixed in other node
       counts' network costs.)

    Either way this gives, once per (type, nodes, replicas), a table of step and
    sync times over local batch size, interpolated linearly. Outside its measured
    batch sizes (multi-GPU placements were often measured only up to the largest
    global batch over their replica count), sync time is held at the nearest
    measured point's (all-reduce moves the same gradients whatever the batch) and
    the compute part, step − sync, follows the type's 1-GPU placement, which spans
    the type's whole local-batch range, scaled to join at that point (the paper's
    observation: under data parallelism compute time does not depend on the GPU
    count). The 1-GPU curve itself is held below its range and grows in proportion
    to the batch size above it. Extrapolating linearly from a table's last two
    points instead was tried and rejected: their slope is noise-dominated, and
    deepspeech2 on 2×8 dgx-ext came out 71× faster than one GPU at a local batch
    of 320. Sync time is capped at step time; both are multiplied by the
    application's calibrated `slowdown`.

Progress
    Progress is in the validation files' unit: iterations at the initial batch size
    (the smallest validation batch size; cifar10 at 128 makes 391 per epoch). A step
    with global batch B = replicas·atomic_bsz·(accum_steps + 1) advances progress by
    `gain(grad, B, init_batch_size)` = (var + sqr)/(var/S + sqr) with S =
    B/init_batch_size (`sia_grpc.models.efficiency.gain`), where `grad =
    grad_params(progress, B)` are the statistics of the epoch the job is in, as
    recorded in training at batch size B: interpolated linearly between the two
    validation files whose batch sizes bracket B (B clamped to their range), as
    the Pollux and Sia simulators do. (Until 2026-11 the initial batch size's
    statistics were used at every B; they understate the efficiency of large
    batches by 1.1-1.6x on average over the epochs, e.g. bert at 384, cifar10 at
    4096.) A job is done at `max_progress`.

The artifact's `gpt_pmp` (pipeline-parallel GPT) is not supported: its step and
sync columns mean something else (sync > step in every row; the artifact's
simulator rebuilds its times from micro-batch counts) and it has no seed profiles.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sia_grpc.models.catalogue import SUPPORTED_APPLICATIONS, application
from sia_grpc.models.efficiency import GradParams, gain
from sia_grpc.models.profiles import (
    StepTimes,
    load_placements,
    load_scalability,
    load_seed_profiles,
    load_validation,
    validation_batch_sizes,
)

__all__ = ["AppTruth", "SUPPORTED_APPLICATIONS", "load_app"]


_STEP_CACHE_SIZE = 1 << 17


@dataclass(frozen=True, eq=False)
class _Curve:
    """Step and sync time (unscaled) over local batch size, for one placement.

    Beyond its batch sizes the compute part (step − sync) follows `ref`, the
    type's 1-GPU curve, scaled to join at the nearest measured point, and sync is
    held there; `ref` itself (None) holds below its range and grows in proportion
    to the batch size above it.
    """

    bsz: tuple[float, ...]  # ascending, distinct
    step: tuple[float, ...]
    sync: tuple[float, ...]
    ref: _Curve | None = None

    @classmethod
    def of(cls, rows: Iterable[tuple[float, float, float]], ref: _Curve | None = None) -> _Curve:
        """From (local_bsz, step, sync) rows; repeated batch sizes are averaged."""
        acc: dict[float, list[tuple[float, float]]] = defaultdict(list)
        for b, s, y in rows:
            acc[float(b)].append((float(s), float(y)))
        bsz = tuple(sorted(acc))
        if not bsz:
            raise ValueError("no rows")
        step = tuple(sum(s for s, _ in acc[b]) / len(acc[b]) for b in bsz)
        sync = tuple(sum(y for _, y in acc[b]) / len(acc[b]) for b in bsz)
        return cls(bsz, step, tuple(min(y, s) for s, y in zip(step, sync, strict=True)), ref)

    def compute(self, b: float) -> float:
        step, sync = self(b)
        return step - sync

    def __call__(self, b: float) -> tuple[float, float]:
        xs, st, sy = self.bsz, self.step, self.sync
        if xs[0] <= b <= xs[-1]:
            i = min(bisect.bisect_right(xs, b), len(xs) - 1)
            x0, x1 = xs[i - 1], xs[i]
            if i == 0 or x1 == x0:
                return st[i], sy[i]
            w = (b - x0) / (x1 - x0)
            return (st[i - 1] + w * (st[i] - st[i - 1]),
                    sy[i - 1] + w * (sy[i] - sy[i - 1]))
        k = 0 if b < xs[0] else -1
        edge, compute, sync = xs[k], st[k] - sy[k], sy[k]
        if self.ref is not None:
            base = self.ref.compute(edge)
            ratio = self.ref.compute(b) / base if base > 0 else 1.0
        else:
            ratio = 1.0 if k == 0 else b / edge
        return sync + compute * ratio, sync


def _key(digits: Iterable[int]) -> str:
    """A placement independent of node order: its digits, sorted."""
    return "".join(sorted(str(d) for d in digits))


class _TypeTable:
    """Everything measured for one (application, GPU type), and the curves
    derived from it, built lazily and kept."""

    def __init__(self, app: str, gpu_type: str) -> None:
        p = load_placements(app, gpu_type)
        assert p.placement is not None
        self.app, self.gpu_type = app, gpu_type
        self.gpus_per_node = max(int(c) for pl in p.placement for c in pl)
        self.bsz_limits = (int(p.local_bsz.min()), int(p.local_bsz.max()))
        rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for pl, b, s, y in zip(p.placement, p.local_bsz, p.step_time, p.sync_time,
                               strict=True):
            rows[_key(int(c) for c in pl if c != "0")].append((b, s, y))
        one = rows.get("1")
        ref = _Curve.of(one) if one else None
        self.exact = {k: ref if k == "1" and ref else _Curve.of(v, ref)
                      for k, v in rows.items()}
        # Pollux: placements averaged per (nodes, replicas, bsz), plus scalability.
        groups: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)
        for table in (p, load_scalability(app, gpu_type)):
            for n, r, b, s, y in zip(table.num_nodes, table.num_replicas, table.local_bsz,
                                     table.step_time, table.sync_time, strict=True):
                groups[int(n), int(r)].append((b, s, y))
        self.groups = {k: _Curve.of(v, ref) for k, v in sorted(groups.items())}
        self.max_nodes = max(n for n, _ in self.groups)
        self._curves: dict[tuple[int, int], _Curve] = {}

    def curve(self, num_nodes: int, num_replicas: int) -> _Curve:
        key = (num_nodes, num_replicas)
        c = self._curves.get(key)
        if c is None:
            c = self._curves[key] = self._make_curve(num_nodes, num_replicas)
        return c

    def _make_curve(self, num_nodes: int, num_replicas: int) -> _Curve:
        r_max = self.gpus_per_node
        nodes = max(num_nodes, -(-num_replicas // r_max))
        q, rem = divmod(num_replicas, nodes)
        exact = self.exact.get(_key([q + 1] * rem + [q] * (nodes - rem)))
        if exact is not None:
            return exact
        n = min(nodes, self.max_nodes)
        if (n, num_replicas) in self.groups:
            return self.groups[n, num_replicas]
        between = self._between(n, num_replicas)
        if between is not None:
            return between
        near = min(self.groups, key=lambda g: ((g[0] - n) ** 2 + (g[1] - num_replicas) ** 2, g))
        return self.groups[near]

    def _between(self, nodes: int, replicas: int) -> _Curve | None:
        """Linear in replicas between the measured counts at `nodes` nodes that
        bracket `replicas`, or None if none do."""
        counts = [r for n, r in self.groups if n == nodes]
        lo = max((r for r in counts if r < replicas), default=None)
        hi = min((r for r in counts if r > replicas), default=None)
        if lo is None or hi is None:
            return None
        a, b = self.groups[nodes, lo], self.groups[nodes, hi]
        w = (replicas - lo) / (hi - lo)
        rows = []
        for x in sorted(set(a.bsz) | set(b.bsz)):
            (sa, ya), (sb, yb) = a(x), b(x)
            rows.append((x, (1 - w) * sa + w * sb, (1 - w) * ya + w * yb))
        return _Curve.of(rows, self.exact.get("1"))


@dataclass(frozen=True, eq=False)
class AppTruth:
    """One application's measured behaviour, for every GPU type it was profiled on.

    Build with `load_app(name)`; see the module docstring for how step times and
    progress are derived.
    """

    name: str
    init_batch_size: int  # smallest validation batch size
    max_batch_size: int  # largest validation batch size
    num_epochs: int
    restart_delay: float  # s of checkpoint-restore per (re)allocation
    slowdown: float  # every step and sync time is multiplied by this
    gpu_types: tuple[str, ...]  # types with a placements file
    _tables: dict[str, _TypeTable] = field(init=False, repr=False)
    _progress: np.ndarray = field(init=False, repr=False)  # end of each epoch, clamped
    _ends: list[float] = field(init=False, repr=False)  # the same, for bisect
    _grad: tuple[GradParams, ...] = field(init=False, repr=False)
    _grad_sizes: np.ndarray = field(init=False, repr=False)  # validation batch sizes
    _grad_sqr: np.ndarray = field(init=False, repr=False)  # [size, epoch]
    _grad_var: np.ndarray = field(init=False, repr=False)
    _cached_step: Callable[..., tuple[float, float]] = field(init=False, repr=False)
    # `_epoch_rates`, cached per shape.
    epoch_rates: Callable[[str, int, int, float, int], tuple[tuple[float, ...], float, float]] = (
        field(init=False, repr=False))

    def __post_init__(self) -> None:
        table = load_validation(self.name, self.init_batch_size)
        k = min(self.num_epochs, len(table))
        progress = np.array(table.progress[:k], dtype=float)
        progress.setflags(write=False)
        object.__setattr__(self, "_progress", progress)
        object.__setattr__(self, "_ends", progress.tolist())
        object.__setattr__(self, "_grad", tuple(
            GradParams(sqr=float(table.grad_sqr[i]), var=float(table.grad_var[i]))
            for i in range(k)))
        sizes = validation_batch_sizes(self.name)
        tables = [load_validation(self.name, b) for b in sizes]
        if min(len(t) for t in tables) < k:
            raise ValueError(f"{self.name}: a validation file has fewer than {k} epochs")
        object.__setattr__(self, "_grad_sizes", np.array(sizes, dtype=float))
        object.__setattr__(self, "_grad_sqr", np.array([t.grad_sqr[:k] for t in tables],
                                                       dtype=float))
        object.__setattr__(self, "_grad_var", np.array([t.grad_var[:k] for t in tables],
                                                       dtype=float))
        object.__setattr__(self, "_tables", {})
        object.__setattr__(self, "_cached_step",
                           functools.lru_cache(maxsize=_STEP_CACHE_SIZE)(self._step_time))
        object.__setattr__(self, "epoch_rates",
                           functools.lru_cache(maxsize=4096)(self._epoch_rates))

    # -- throughput ---------------------------------------------------------------

    def _table(self, gpu_type: str) -> _TypeTable:
        t = self._tables.get(gpu_type)
        if t is None:
            if gpu_type not in self.gpu_types:
                raise ValueError(f"gpu_type: {self.name} has no profile for {gpu_type!r} "
                                 f"(has {', '.join(self.gpu_types)})")
            t = self._tables[gpu_type] = _TypeTable(self.name, gpu_type)
        return t

    def gpus_per_node(self, gpu_type: str) -> int:
        """R: the most replicas on one node in the type's placements file."""
        return self._table(gpu_type).gpus_per_node

    def local_bsz_limits(self, gpu_type: str) -> tuple[int, int]:
        """(min, max) local batch size measured for the type (placements file)."""
        return self._table(gpu_type).bsz_limits

    def step_time(self, gpu_type: str, num_nodes: int, num_replicas: int,
                  atomic_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time) in seconds of one optimizer step, slowdown included.

        Memoised per (gpu_type, num_nodes, num_replicas, atomic_bsz)."""
        return self._cached_step(gpu_type, num_nodes, num_replicas, atomic_bsz)

    def _step_time(self, gpu_type: str, num_nodes: int, num_replicas: int,
                   atomic_bsz: float) -> tuple[float, float]:
        if num_nodes < 1 or num_replicas < num_nodes:
            raise ValueError(f"need 1 <= num_nodes <= num_replicas, got num_nodes="
                             f"{num_nodes}, num_replicas={num_replicas}")
        if not atomic_bsz > 0 or not math.isfinite(atomic_bsz):
            raise ValueError(f"atomic_bsz: must be positive, got {atomic_bsz!r}")
        step, sync = self._table(gpu_type).curve(int(num_nodes), int(num_replicas))(
            float(atomic_bsz))
        return step * self.slowdown, sync * self.slowdown

    def iteration_time(self, gpu_type: str, num_nodes: int, num_replicas: int,
                       atomic_bsz: float, accum_steps: int) -> float:
        """Seconds per iteration with `accum_steps` extra (non-syncing) micro-batches:
        step + (step − sync)·accum_steps."""
        step, sync = self.step_time(gpu_type, num_nodes, num_replicas, atomic_bsz)
        return step + (step - sync) * accum_steps

    def progress_rate(self, gpu_type: str, num_nodes: int, num_replicas: int,
                      atomic_bsz: float, accum_steps: int,
                      progress: float) -> tuple[float, float, float]:
        """(rate, step_time, sync_time): progress per second of training at `progress`
        on this shape, and the step and sync times it comes from.

        One iteration is step + (step − sync)·accum_steps seconds and advances
        progress by `gain(grad_params(progress, B), B, init_batch_size)` with global
        batch B = num_replicas·atomic_bsz·(accum_steps + 1). The rate holds within
        an epoch (`epoch_bounds`). The simulator and the node agent's modeled
        workers both call this, so they cannot drift apart.
        """
        step, sync = self.step_time(gpu_type, num_nodes, num_replicas, atomic_bsz)
        iteration = step + (step - sync) * accum_steps
        batch = num_replicas * atomic_bsz * (accum_steps + 1)
        rate = float(gain(self.grad_params(progress, batch), batch,
                          self.init_batch_size)) / iteration
        return rate, step, sync

    def _epoch_rates(self, gpu_type: str, num_nodes: int, num_replicas: int, atomic_bsz: float,
                     accum_steps: int) -> tuple[tuple[float, ...], float, float]:
        """(rate of every epoch, step, sync) on this shape: `progress_rate` at each
        epoch's start, computed once per shape (cached as `epoch_rates`). A modeled
        worker plans its whole run from it without recomputing every epoch."""
        rates = tuple(self.progress_rate(gpu_type, num_nodes, num_replicas, atomic_bsz,
                                         accum_steps, lo)[0] for lo, _ in self.epoch_bounds())
        step, sync = self.step_time(gpu_type, num_nodes, num_replicas, atomic_bsz)
        return rates, step, sync

    def seed_profile(self, gpu_type: str) -> StepTimes | None:
        """The 1-GPU profile Sia bootstraps from (seed-profiles), None if there is none.

        Times are as measured, *not* multiplied by `slowdown`; the simulated truth
        at those batch sizes is `step_time(gpu_type, 1, 1, bsz)`."""
        return load_seed_profiles(self.name).get(gpu_type)

    # -- progress -----------------------------------------------------------------

    @property
    def max_progress(self) -> float:
        """Progress at the end of `num_epochs` epochs (or of the validation file)."""
        return float(self._progress[-1])

    def epoch(self, progress: float) -> int:
        """The epoch (0-based) that `progress` is in; the last one at or past the end."""
        return min(bisect.bisect_right(self._ends, progress), len(self._ends) - 1)

    def epoch_bounds(self) -> tuple[tuple[float, float], ...]:
        """(start, end) progress of every epoch, the last ending at `max_progress`."""
        ends = self._ends
        return tuple(zip([0.0, *ends[:-1]], ends, strict=True))

    def grad_params(self, progress: float, batch_size=None) -> GradParams:
        """Gradient statistics (sqr, var, per initial batch) of the epoch `progress`
        is in; a step of global batch B gains `gain(grad, B, init_batch_size)`.

        Without `batch_size`: as recorded in training at the initial batch size.
        With it (a number or an array): as recorded at that batch size,
        interpolated linearly between the validation files that bracket it
        (clamped to their range); fields are arrays for an array."""
        e = self.epoch(progress)
        if batch_size is None:
            return self._grad[e]
        sizes = self._grad_sizes
        b = np.clip(np.asarray(batch_size, dtype=float), sizes[0], sizes[-1])
        sqr = np.interp(b, sizes, self._grad_sqr[:, e])
        var = np.interp(b, sizes, self._grad_var[:, e])
        if sqr.ndim == 0:
            return GradParams(sqr=float(sqr), var=float(var))
        return GradParams(sqr=sqr, var=var)


@functools.cache
def load_app(name: str) -> AppTruth:
    """The ground truth for the catalogue's application `name` (cached); ValueError
    naming the known ones otherwise."""
    info = application(name)
    return AppTruth(name=name, init_batch_size=info.init_batch_size,
                    max_batch_size=info.max_batch_size, num_epochs=info.num_epochs,
                    restart_delay=info.restart_delay, slowdown=info.slowdown,
                    gpu_types=info.gpu_types)
