"""Pollux's gradient-noise statistics and the AdaScale gain (plain Python).

One optimizer step averages `count` micro-batch gradients g_i (each the mean over
`b` samples, on some rank) into G. With |g|^2 the squared L2 norm,

    local = mean_i |g_i|^2      (before the all-reduce)
    total = |G|^2               (after it)

are unbiased for |E g|^2 + tr(Σ)/b and |E g|^2 + tr(Σ)/(count·b), where Σ is the
per-sample gradient covariance, so

    sqr = (count·total − local) / (count − 1)            estimates |E g|^2
    var = (local − total) · scale / (count − 1)          estimates tr(Σ) / B0

with scale = count·b / B0, the step's batch over the job's initial batch B0: the
variance is that of a gradient over B0 samples, as the scheduler's statistical
efficiency expects (sia_grpc.models.efficiency). Each estimate enters an
exponential moving average whose decay per step is smoothing**scale (one B0's
worth of samples decays it by `smoothing`), bias-corrected like Adam's.

With a single micro-batch per step (one replica, no accumulation) the caller
pairs this step's gradient with the previous step's (count 2, scale 2·b/B0), as
AdaptDL does; those estimates are slightly biased (the parameters moved), so the
averages restart when unbiased data becomes available.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["GradientNoise", "gain"]

_VAR_FLOOR = 1e-6


def gain(sqr: float, var: float, scale: float) -> float:
    """AdaScale's gain r = (var + sqr) / (var / scale + sqr): the progress of one
    step at `scale` × B0 relative to one step at B0 (1 at scale 1)."""
    var = max(var, _VAR_FLOOR)
    sqr = max(sqr, 0.0)
    return (var + sqr) / (var / scale + sqr)


@dataclass
class GradientNoise:
    """Exponentially smoothed sqr/var estimates, normalised to `init_batch_size`."""

    init_batch_size: int
    smoothing: float = 0.999
    sqr_biased: float = 0.0
    sqr_unbias: float = 0.0
    var_biased: float = 0.0
    var_unbias: float = 0.0
    biased: bool = False   # the averages hold differenced (single micro-batch) estimates
    updates: int = 0

    def update(self, local: float, total: float, count: int, scale: float,
               biased: bool = False) -> bool:
        """Add one step's measurement; False (and nothing changes) when unusable."""
        if count < 2 or not (math.isfinite(local) and math.isfinite(total)) or scale <= 0:
            return False
        if self.biased and not biased:
            self.sqr_biased = self.sqr_unbias = self.var_biased = self.var_unbias = 0.0
        self.biased = biased
        sqr = (count * total - local) / (count - 1)
        var = (local - total) * scale / (count - 1)
        theta = self.smoothing ** scale
        self.sqr_biased = theta * self.sqr_biased + (1 - theta) * sqr
        self.sqr_unbias = theta * self.sqr_unbias + (1 - theta)
        self.var_biased = theta * self.var_biased + (1 - theta) * var
        self.var_unbias = theta * self.var_unbias + (1 - theta)
        self.updates += 1
        return True

    @property
    def known(self) -> bool:
        return self.sqr_unbias > 0

    @property
    def sqr(self) -> float:
        """Smoothed |E g|^2 (0 before the first estimate; never negative)."""
        return max(self.sqr_biased / self.sqr_unbias, 0.0) if self.known else 0.0

    @property
    def var(self) -> float:
        """Smoothed tr(Var g) at B0 samples (0 before the first; never negative)."""
        return max(self.var_biased / self.var_unbias, 0.0) if self.known else 0.0

    def gain(self, scale: float) -> float:
        """The gain at `scale` × B0; 1 while nothing is known."""
        if not self.known:
            return 1.0
        return gain(self.sqr, self.var, scale)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            if hasattr(self, k):
                setattr(self, k, v)
