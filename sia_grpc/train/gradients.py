"""Gradient measurements around the user's backward passes.

A tensor hook on every trainable parameter sees each micro-batch's local
gradient before it is accumulated into `.grad` and before DDP all-reduces it
(the hooks run ahead of the AccumulateGrad node, where DDP's reducer hooks in).
It records the gradient's norm, so the per-micro-batch squared norms cost one
reduction per parameter per backward and no copies. At the optimizer step the
averaged gradient's squared norm comes from one fused `_foreach_norm` over the
`.grad`s. With a single micro-batch per step the previous step's gradient is
kept (one copy of the gradients) for Pollux's differenced estimate.

The time of the last hook also marks the end of this rank's backward compute;
what follows until the optimizer step is waiting for the all-reduce.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch

__all__ = ["GradientTracker", "StepGradients"]


@dataclass
class StepGradients:
    """One step's inputs to GradientNoise.update (see sia_grpc.train.noise)."""

    local: float | None  # mean over micro-batches of |g_i|^2 (None until summed over ranks)
    total: float         # |G|^2 of their average
    count: int
    biased: bool


def _sumsq(norms: list[torch.Tensor]) -> float:
    """Sum of squares of 0-dim norm tensors, in float64."""
    if not norms:
        return 0.0
    if len(norms) <= 64 and not norms[0].is_cuda:  # a few host scalars: cheaper in Python
        return math.fsum(float(n) ** 2 for n in norms)
    try:
        stacked = torch.stack(norms)
    except RuntimeError:  # mixed dtypes or devices
        stacked = torch.stack([n.double().cpu() for n in norms])
    return float(stacked.double().square().sum())


class GradientTracker:
    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.active = False
        self._norms: list[torch.Tensor] = []
        self.cuda = any(p.is_cuda for p in self.params)
        self._last_event = torch.cuda.Event(enable_timing=True) if self.cuda else None
        self.last_grad_t = 0.0
        self.hook_s = 0.0      # time spent in the hooks (overhead)
        self._prev: list[torch.Tensor] | None = None
        self._prev_key: tuple | None = None
        self._prev_sqr = 0.0
        self._handles = [p.register_hook(self._hook) for p in self.params]

    def _hook(self, grad: torch.Tensor) -> None:
        if not self.active:
            return
        t0 = time.perf_counter()
        self._norms.append(torch.linalg.vector_norm(grad))
        if self._last_event is not None:
            self._last_event.record()
        t1 = time.perf_counter()
        self.last_grad_t = t1
        self.hook_s += t1 - t0

    @property
    def has_grads(self) -> bool:
        """A backward pass of the current step has run."""
        return bool(self._norms)

    def sync_wait(self, now: float) -> float:
        """Seconds from the last local gradient to `now` (the optimizer step)."""
        if not self._norms:
            return 0.0
        if self._last_event is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return max(0.0, self._last_event.elapsed_time(end) / 1e3)
        return max(0.0, now - self.last_grad_t)

    def local_sum(self) -> float:
        """Sum over this step's micro-batches of |g_i|^2 on this rank."""
        return _sumsq(self._norms)

    def finalize(self, micro_steps: int, count: int) -> StepGradients | None:
        """Average the accumulated `.grad`s over `micro_steps` and measure them.

        With `count` (micro-batches over all ranks) above 1 the caller fills in
        `local` once the per-rank sums are added up. With count 1 the previous
        step's gradient stands in for a second micro-batch (None on the first
        such step)."""
        with_grad = [p for p in self.params if p.grad is not None]
        grads = cast(list[torch.Tensor], [p.grad for p in with_grad])  # (not None)
        self._norms = []
        if not grads:
            return None
        if micro_steps > 1:
            torch._foreach_div_(grads, float(micro_steps))
        total = _sumsq(list(torch._foreach_norm(grads)))
        if count > 1:
            self._prev = None
            return StepGradients(None, total, count, False)
        key = tuple(id(p) for p in with_grad)
        out = None
        if self._prev is not None and key == self._prev_key:
            pair = _sumsq(list(torch._foreach_norm(torch._foreach_add(grads, self._prev))))
            out = StepGradients((total + self._prev_sqr) / 2, pair / 4, 2, True)
            torch._foreach_copy_(self._prev, grads)
        else:
            self._prev = [g.detach().clone() for g in grads]
            self._prev_key = key
        self._prev_sqr = total
        return out

    def reset(self) -> None:
        """Forget this step's micro-batch norms (a step abandoned mid-way)."""
        self._norms = []

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
