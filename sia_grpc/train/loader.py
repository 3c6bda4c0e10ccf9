"""AdaptiveDataLoader: one epoch per iteration, elastic batches, exactly-once samples.

Iterating yields this rank's micro-batches for the rest of the current epoch.
Which samples they hold is the sampler's business (sia_grpc.train.sampler): a
fixed order per (seed, epoch) and a position within it, so the batch size,
accumulation and replica count may change between steps, or across a restart,
without a sample of the epoch being skipped or seen twice. The batches are
fetched through a torch DataLoader (so num_workers, pin_memory and collate_fn
work as usual); its prefetching is re-planned whenever the batch changes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from sia_grpc.train.runtime import current
from sia_grpc.train.sampler import (
    Position,
    StepPlan,
    StepShape,
    micro_slice,
    plan_step,
    step_indices,
)

__all__ = ["AdaptiveDataLoader"]


class _Plans:
    """A DataLoader batch_sampler: this rank's micro-batches from `start` on, as if
    the shape never changed; each one's signature goes to `sigs` as it is handed
    out, so the consumer can tell a stale prefetch."""

    def __init__(self, loader: AdaptiveDataLoader, first: StepPlan, limit: int | None) -> None:
        self.loader = loader
        self.first = first
        self.limit = limit
        self.sigs: collections.deque = collections.deque()

    def __iter__(self) -> Iterator[list[int]]:
        ld = self.loader
        rt = ld._rt
        plan: StepPlan | None = self.first
        limit = self.limit
        while plan is not None:
            idx = step_indices(plan, ld._len, rt.seed, ld.shuffle, ld._orders)
            for a in range(plan.k):
                lo, hi = micro_slice(plan, a, rt.rank)
                batch = idx[lo:hi].tolist()
                self.sigs.append(((plan.start, plan.shape, plan.n), a, batch))
                yield batch
            if limit is not None:
                limit -= plan.n
            plan = plan_step(plan.end(), ld._len, plan.shape, limit)
            if plan is not None and plan.start.epoch != self.first.start.epoch:
                return


class AdaptiveDataLoader:
    """Elastic, resumable data loading for a data-parallel job.

    Arguments:
        dataset: a map-style dataset (len() and integer indexing).
        batch_size: the job's initial global batch size B0 (gradient statistics
            and LR scaling are relative to it); the scheduler may change the
            batch in use later.
        shuffle: a fresh order every epoch, fixed by (seed, epoch).
        seed: the shuffling seed (kept in checkpoints).
        **kwargs: DataLoader options: num_workers, collate_fn, pin_memory, ...
            (not batch_size, sampler, batch_sampler, shuffle, drop_last).

    `current_indices` holds the dataset indices of the micro-batch last yielded.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, **kwargs: Any) -> None:
        for bad in ("sampler", "batch_sampler", "drop_last", "batch_size", "shuffle"):
            if bad in kwargs:
                raise TypeError(f"AdaptiveDataLoader does not take {bad}=")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.dataset = dataset
        self.shuffle = shuffle
        self._kwargs = kwargs
        self._len = len(dataset)  # type: ignore[arg-type]
        self._orders: dict = {}
        self._rt = current()
        self._rt.attach_loader(self, self._len, batch_size, seed)
        self.batch_size = self._rt.init_batch_size
        self.current_indices: list[int] = []
        self._fast = (isinstance(dataset, TensorDataset) and not kwargs.get("num_workers")
                      and "collate_fn" not in kwargs and not kwargs.get("pin_memory"))
        self._it: Iterator | None = None
        self._plans: _Plans | None = None

    # ---- what the current step looks like --------------------------------------------------

    def _shape(self) -> StepShape:
        shape = self._rt.shape
        assert shape is not None  # (the runtime's, from when the loader was attached)
        return shape

    @property
    def current_batch_size(self) -> int:
        """The global batch of the step in flight (or the next one)."""
        st = self._rt._step
        return st.plan.n if st is not None else self._shape().batch_size

    @property
    def current_local_bsz(self) -> int:
        """This replica's micro-batch size."""
        return len(self.current_indices) or self._shape().atomic

    @property
    def accumulation_steps(self) -> int:
        """Micro-steps beyond the first in the current step."""
        st = self._rt._step
        return (st.plan.k if st is not None else self._shape().accum + 1) - 1

    @property
    def step_shape(self) -> StepShape:
        """The shape the scheduler chose for the step in flight (replicas, micro-batch,
        accumulation); an epoch's last step may be smaller."""
        st = self._rt._step
        return st.plan.shape if st is not None else self._shape()

    @property
    def current_step(self) -> int:
        """Index of the optimizer step in flight (steps completed before it)."""
        st = self._rt._step
        return self._rt.steps - (1 if st is not None and st.stepped else 0)

    def is_optim_step(self) -> bool:
        """True on the micro-step whose optimizer.step() really steps."""
        st = self._rt._step
        return st is None or st.micro == st.plan.k - 1

    @property
    def epoch(self) -> int:
        return self._rt.position.epoch

    def __len__(self) -> int:
        """Steps in a whole epoch at the current batch size (an estimate)."""
        return -(-self._len // self._shape().batch_size)

    # ---- iteration -----------------------------------------------------------------------

    def _fetch(self, plan: StepPlan, micro: int) -> Any:
        rt = self._rt
        if self._fast:
            idx = step_indices(plan, self._len, rt.seed, self.shuffle, self._orders)
            lo, hi = micro_slice(plan, micro, rt.rank)
            sel = idx[lo:hi]
            self.current_indices = sel.tolist()
            t = torch.from_numpy(sel)
            return [x[t] for x in self.dataset.tensors]  # type: ignore[attr-defined]
        want = ((plan.start, plan.shape, plan.n), micro)
        for _ in range(2):
            if self._it is None:
                target = rt.target_samples()
                limit = None if target is None or rt.profiling else target - rt.samples_done
                self._plans = _Plans(self, plan, limit)
                self._it = iter(DataLoader(self.dataset, batch_sampler=self._plans,
                                           **self._kwargs))
            try:
                batch = next(self._it)
            except StopIteration:
                batch = None
            assert self._plans is not None  # (made with self._it)
            sig = self._plans.sigs.popleft() if self._plans.sigs else None
            if batch is not None and sig is not None and sig[:2] == want:
                self.current_indices = sig[2]
                return batch
            self._it = None  # the plan changed under the prefetch: start over here
        raise RuntimeError(f"data loader out of step at {plan}")

    def __iter__(self) -> Iterator[Any]:
        rt = self._rt
        rt.boundary()
        epoch = rt.position.epoch
        self._it = None
        try:
            while True:
                plan = rt.next_plan()
                if plan is None:
                    if rt.position.epoch == epoch:
                        rt.end_epoch()
                    return
                if plan.start.epoch != epoch and not plan.start.carry:
                    return  # the epoch ended elsewhere (e.g. skipped by the epoch loop)
                for a in range(plan.k):
                    t0 = time.perf_counter()
                    batch = self._fetch(plan, a)
                    with rt.begin_micro(a, t0):
                        yield batch
                    rt.end_micro(a)
                rt.end_step()
                rt.boundary()
        finally:
            rt.abort_step()
            self._it = None
            self._plans = None

    def position(self) -> Position:
        return self._rt.position
