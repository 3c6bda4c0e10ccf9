"""Which samples each rank trains on: deterministic, elastic, exactly once per epoch.

Every epoch has one permutation of the dataset, fixed by (seed, epoch), so any
world size computes the same order. The job's position is the number of samples
of that order already trained on. An optimizer step takes the next `n` samples
(the global batch) and splits them into `k` micro-steps (accumulation) of `R`
disjoint per-rank shares each, as evenly as sizes allow. The shape (replicas,
micro-batch, accumulation) may change between any two steps, or across a restart
with a different world size: the position carries over, so no sample of an epoch
is skipped or repeated.

The last step of an epoch takes what is left. So that every rank always has at
least one sample, a leftover smaller than the replica count is folded into the
step before it; if an epoch's remainder is smaller than the replica count from
the outset (a restart with more replicas just before an epoch's end), those
samples are carried into the first step of the next epoch instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Position", "StepPlan", "StepShape", "epoch_order", "micro_slice", "plan_step",
           "shape_for", "step_indices"]


@dataclass(frozen=True)
class StepShape:
    """One optimizer step's layout: `replicas` × `atomic` samples per micro-step,
    `accum + 1` micro-steps."""

    replicas: int
    atomic: int
    accum: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.atomic < 1 or self.accum < 0:
            raise ValueError(f"invalid step shape {self}")

    @property
    def batch_size(self) -> int:
        return self.replicas * self.atomic * (self.accum + 1)


def shape_for(replicas: int, batch_size: int = 0, atomic: int = 0, accum: int = 0
              ) -> StepShape:
    """The shape for a requested batch: `atomic` and `accum` when given (the global
    batch is then replicas × atomic × (accum + 1)), else the largest micro-batch
    with `accum` that does not exceed `batch_size` (at least 1)."""
    if atomic > 0:
        return StepShape(replicas, atomic, accum)
    if batch_size <= 0:
        raise ValueError("need a batch size or a micro-batch size")
    return StepShape(replicas, max(1, batch_size // (replicas * (accum + 1))), accum)


@dataclass(frozen=True)
class Position:
    """Where the job is: `pos` samples of epoch `epoch`'s order are done, and the
    last `carry` samples of the previous epoch's order still wait (see above)."""

    epoch: int = 0
    pos: int = 0
    carry: int = 0


@dataclass(frozen=True)
class StepPlan:
    """The next optimizer step: `n` samples in `k` micro-steps of `shape`."""

    start: Position
    n: int
    k: int
    shape: StepShape

    @property
    def regular(self) -> bool:
        """A full step of its shape (equal micro-batches of exactly `atomic`)."""
        return self.n == self.shape.batch_size and self.k == self.shape.accum + 1

    def end(self) -> Position:
        at = self.start
        if self.n <= at.carry:
            return Position(at.epoch, at.pos, at.carry - self.n)
        return Position(at.epoch, at.pos + self.n - at.carry, 0)


def epoch_order(dataset_len: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The epoch's sample order: a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return np.arange(dataset_len, dtype=np.int64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
    return rng.permutation(dataset_len).astype(np.int64)


def plan_step(at: Position, dataset_len: int, shape: StepShape,
              limit: int | None = None) -> StepPlan | None:
    """The next step from `at`, or None when the epoch is done (what is left of it
    then being fewer samples than replicas; the caller carries them over).
    `limit` caps the samples (a target in samples); below `replicas` it ends the
    epoch's steps too."""
    remaining = at.carry + dataset_len - at.pos
    if limit is not None:
        remaining = min(remaining, limit)
    r = shape.replicas
    if remaining < r or remaining <= 0:
        return None
    # carried samples go first, all of them in one step where the target allows
    n = max(min(shape.batch_size, remaining), min(at.carry, remaining))
    if 0 < remaining - n < r:  # fold a too-small leftover into this step
        n = remaining
    k = max(1, min(shape.accum + 1, -(-n // (r * shape.atomic)), n // r))
    return StepPlan(at, n, k, shape)


def micro_slice(plan: StepPlan, micro: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the step's `n` samples that `rank` trains on in micro-step
    `micro`: chunks as even as possible, never empty."""
    n, k, r = plan.n, plan.k, plan.shape.replicas
    c0, c1 = micro * n // k, (micro + 1) * n // k
    m = c1 - c0
    return c0 + rank * m // r, c0 + (rank + 1) * m // r


def step_indices(plan: StepPlan, dataset_len: int, seed: int, shuffle: bool = True,
                 _cache: dict | None = None) -> np.ndarray:
    """The dataset indices of the whole step, in order (carried samples first)."""
    def order(epoch: int) -> np.ndarray:
        if _cache is None:
            return epoch_order(dataset_len, seed, epoch, shuffle)
        key = (dataset_len, seed, epoch, shuffle)
        if key not in _cache:
            if len(_cache) > 2:
                _cache.clear()
            _cache[key] = epoch_order(dataset_len, seed, epoch, shuffle)
        return _cache[key]

    at = plan.start
    if not at.carry:
        return order(at.epoch)[at.pos:at.pos + plan.n]
    first = dataset_len - at.carry
    prev = order(at.epoch - 1)[first:first + min(plan.n, at.carry)]
    if plan.n <= at.carry:
        return prev
    return np.concatenate([prev, order(at.epoch)[at.pos:at.pos + plan.n - at.carry]])
