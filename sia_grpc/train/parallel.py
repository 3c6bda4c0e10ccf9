"""AdaptiveDataParallel: DistributedDataParallel that the scheduler can resize.

It wraps the model in DDP when there is more than one replica (and runs it as it
is otherwise), checkpoints and restores the model, optimizer and LR scheduler,
measures the gradient statistics, and patches the optimizer so that

* `optimizer.step()` is a no-op on accumulation micro-steps and, on the last
  micro-step, averages the accumulated gradients, joins the per-step agreement,
  scales the learning rate for the current batch (AdaScale gain for SGD, sqrt for
  Adam-family optimizers, see sia_grpc.train.scaling) for that one step, steps,
  and commits the data position;
* `optimizer.zero_grad()` is a no-op between accumulating micro-steps.

So the training loop stays the plain one: zero_grad, forward, backward, step.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from sia_grpc.train.gradients import GradientTracker
from sia_grpc.train.runtime import current
from sia_grpc.train.scaling import resolve_rule

__all__ = ["AdaptiveDataParallel"]


def _patch_optimizer(optimizer: torch.optim.Optimizer, rt) -> None:
    if getattr(optimizer, "_sia_patched", False):
        raise RuntimeError("this optimizer is already wrapped by an AdaptiveDataParallel")
    orig_step = optimizer.step
    orig_zero_grad = optimizer.zero_grad

    def step(self, *args, **kwargs):
        return rt.optimizer_step(orig_step, args, kwargs)

    def zero_grad(self, *args, **kwargs):
        if rt.may_zero_grad():
            return orig_zero_grad(*args, **kwargs)
        return None

    # An LR scheduler created earlier wrapped `step` and checks for its mark; one
    # created later wraps this bound method (it needs __func__), as usual.
    if getattr(orig_step, "_wrapped_by_lr_sched", False):
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = MethodType(step, optimizer)  # type: ignore[method-assign]
    optimizer.zero_grad = MethodType(zero_grad, optimizer)  # type: ignore[method-assign]
    optimizer._sia_patched = True  # type: ignore[attr-defined]


class AdaptiveDataParallel(torch.nn.Module):
    """Data-parallel `module` whose batch size and replica count may change.

    Arguments:
        module: the model, already on this replica's device.
        optimizer: its optimizer (patched in place, see the module doc).
        lr_scheduler: optional; checkpointed and restored with the rest.
        scaling_rule: "auto" (adascale for SGD, sqrt otherwise), "adascale",
            "sqrt", "linear" or "none".
        **ddp_kwargs: passed to DistributedDataParallel.

    Call `sia_grpc.train.init()` first (it is called with defaults otherwise).
    The wrapped model's state_dict keys start with "module.", like DDP's.
    """

    ddp: DistributedDataParallel | None  # (set past nn.Module: not a submodule)

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, *, scaling_rule: str = "auto",
                 **ddp_kwargs: Any) -> None:
        super().__init__()
        rt = current()
        self.module = module
        rt.register_state("model", module)
        rt.register_state("optimizer", optimizer)
        if lr_scheduler is not None:
            rt.register_state("lr_scheduler", lr_scheduler)
        ddp = None
        if rt.world_size > 1:
            on_cuda = next((p.is_cuda for p in module.parameters()), False)
            if on_cuda:
                ddp_kwargs.setdefault("device_ids", [torch.cuda.current_device()])
            ddp = DistributedDataParallel(module, **ddp_kwargs)
        # Not a registered submodule: the state_dict holds the parameters once.
        object.__setattr__(self, "ddp", ddp)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.tracker = GradientTracker(module.parameters())
        rule = resolve_rule(scaling_rule, optimizer)
        _patch_optimizer(optimizer, rt)
        rt.attach_model(self, rule)
        self._rt = rt

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self.ddp or self.module)(*args, **kwargs)

    def train(self, mode: bool = True) -> AdaptiveDataParallel:
        super().train(mode)
        if self.ddp is not None:
            self.ddp.training = mode
        return self

    @property
    def gain(self) -> float:
        """AdaScale's gain for the current batch (1 until statistics exist)."""
        rt = self._rt
        if rt.noise is None or rt.shape is None:
            return 1.0
        return rt.noise.gain(rt.shape.batch_size / rt.init_batch_size)

    @property
    def grad_stats(self) -> tuple[float, float]:
        """(sqr, var): the smoothed |E g|^2 and tr(Var g) at the initial batch size."""
        noise = self._rt.noise
        return (noise.sqr, noise.var) if noise is not None else (0.0, 0.0)
