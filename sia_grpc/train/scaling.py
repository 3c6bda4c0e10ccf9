"""Learning-rate scaling when the batch is `scale` × the initial batch.

* "adascale" (SGD): multiply the LR by AdaScale's gain (var + sqr)/(var/S + sqr),
  between 1 (all noise averaged away already) and S (pure noise: linear scaling).
* "sqrt" (Adam family and other adaptive optimizers): multiply by sqrt(S).
* "linear": multiply by S. "none": leave the LR alone.

"auto" picks adascale for torch.optim.SGD and sqrt for everything else.
"""

from __future__ import annotations

import math

from sia_grpc.train.noise import GradientNoise

__all__ = ["RULES", "lr_factor", "resolve_rule"]

RULES = ("adascale", "sqrt", "linear", "none")


def resolve_rule(rule: str, optimizer: object) -> str:
    if rule == "auto":
        import torch

        return "adascale" if isinstance(optimizer, torch.optim.SGD) else "sqrt"
    if rule not in RULES:
        raise ValueError(f"unknown scaling rule {rule!r}; choose auto or one of {RULES}")
    return rule


def lr_factor(rule: str, scale: float, noise: GradientNoise) -> float:
    if rule == "adascale":
        return noise.gain(scale)
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "linear":
        return scale
    return 1.0
