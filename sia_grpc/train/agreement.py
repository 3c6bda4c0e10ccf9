"""The per-step agreement: how all ranks act on the same stop and batch at the same step.

The agreement collective is one all-reduce (sum) of a few float64s per step:
[SIGTERM seen, stale reply, wanted micro-batch, wanted accumulation, this rank's
sum of squared micro-batch gradient norms]. Only rank 0 contributes the agent's
wishes (the others send zeros), so the sum is rank 0's; a SIGTERM on any rank
stops all. Every rank then acts on the same values at the same step boundary.

With one replica it takes effect at once. With several, the all-reduce is
started without waiting and collected at the next step, so its latency hides
behind a step of compute: what it carries (a stop, a new batch, this step's
summed squares) takes effect one step later, on every rank at the same step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sia_grpc.train.sampler import StepShape
from sia_grpc.train.telemetry import Overheads

__all__ = ["Agreement", "OnSum"]

LOG = logging.getLogger("sia_grpc.train")

# What to do with the summed squared gradient norms once the agreement has them.
OnSum = Callable[[float], None]


@dataclass
class Agreement:
    """The requests this rank has seen since the last agreement, and what all
    ranks agreed on."""

    rank: int
    world_size: int
    device: torch.device
    overheads: Overheads

    # Requests, local until the next agreement.
    sigterm: bool = False
    want_stale: bool = False      # the agent said this generation is not current
    want_shape: StepShape | None = None
    # Agreed (all ranks).
    stop: bool = False
    stale: bool = False
    next_shape: StepShape | None = None  # the shape the next step takes
    _pending: tuple[Any, torch.Tensor, OnSum | None] | None = None  # the all-reduce in flight

    def agree(self, local_sqr: float, on_sum: OnSum | None, shape: StepShape | None,
              steps: int) -> None:
        """Send this rank's requests and `local_sqr`; `on_sum` gets the sum over all
        ranks. `shape` is the step shape in use, `steps` the steps done."""
        want = self.want_shape if self.rank == 0 else None
        self.want_shape = None
        vec = [1.0 if self.sigterm else 0.0,
               1.0 if (self.rank == 0 and self.want_stale) else 0.0,
               float(want.atomic) if want else 0.0,
               float(want.accum) if want else 0.0,
               local_sqr]
        if self.world_size == 1:
            self._apply(vec, on_sum, (shape, steps))
            return
        t0 = time.perf_counter()
        self._collect((shape, steps))
        t = torch.tensor(vec, dtype=torch.float64, device=self.device)
        self._pending = (dist.all_reduce(t, async_op=True), t, on_sum)
        self.overheads.agree_s += time.perf_counter() - t0
        self.overheads.agrees += 1

    def collect(self) -> None:
        """Finish the agreement in flight for its statistics alone (leaving: what
        it would decide no longer matters)."""
        self._collect(None)

    def take_shape(self) -> StepShape | None:
        """The agreed new shape, once."""
        new, self.next_shape = self.next_shape, None
        return new

    # `decide`: (the shape in use, the steps done) to act on what was agreed, or None
    # to take the statistics alone.

    def _collect(self, decide: tuple[StepShape | None, int] | None) -> None:
        if self._pending is None:
            return
        work, t, on_sum = self._pending
        self._pending = None
        work.wait()
        self._apply(t.tolist(), on_sum, decide)

    def _apply(self, vec: list[float], on_sum: OnSum | None,
               decide: tuple[StepShape | None, int] | None) -> None:
        if on_sum is not None:
            on_sum(vec[4])
        if decide is None:
            return
        shape, steps = decide
        if vec[0] > 0:
            self.stop = True
        if vec[1] > 0:
            self.stale = True
        if vec[2] > 0:
            new = StepShape(self.world_size, int(round(vec[2])), int(round(vec[3])))
            if new != shape:
                LOG.info("batch change after step %d: %d × %d × %d = %d", steps + 1,
                         new.replicas, new.atomic, new.accum + 1, new.batch_size)
                self.next_shape = new
