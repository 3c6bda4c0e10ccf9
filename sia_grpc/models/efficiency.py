"""Pollux's statistical efficiency, from the gradient noise scale.

Training with batch size B = S * B0 (B0: the initial batch size) makes `gain`
times the progress per step that B0 makes, where

    gain = (var + sqr) / (var / S + sqr)

(sqr: squared norm of the true gradient, var: gradient-noise variance, both per
B0 samples). Per sample the progress is gain / S relative to B0, which is the
efficiency: 1 at S = 1, falling towards 1/S once the noise is averaged away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["GradParams", "gain", "efficiency", "grad_params_at_progress"]


@dataclass(frozen=True)
class GradParams:
    sqr: float  # |E[g]|^2
    var: float  # Var[g] at the initial batch size


# No gradient statistics yet: no statistical gain from a larger batch (gain = 1), so
# a policy keeps the job near its initial batch size until it reports some.
NEUTRAL_GRAD = GradParams(sqr=1.0, var=0.0)


def gain(grad: GradParams, batch_size: npt.ArrayLike,
         init_batch_size: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Progress per step at `batch_size` relative to a step at `init_batch_size`."""
    scale: npt.NDArray[np.float64] = (np.asarray(batch_size, dtype=float)
                                      / np.asarray(init_batch_size, dtype=float))
    return efficiency(grad, batch_size, init_batch_size) * scale


def efficiency(grad: GradParams, batch_size: npt.ArrayLike,
               init_batch_size: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Progress per sample at `batch_size` relative to `init_batch_size` (1 at B0).

    gain / S = (var + sqr) / (var + sqr·S); 1/S (gain 1) where that denominator
    is not positive. Broadcasts: `grad` fields and `init_batch_size` may be
    arrays (one job per row when many jobs are scored at once).
    """
    scale = np.asarray(batch_size, dtype=float) / np.asarray(init_batch_size, dtype=float)
    var = np.asarray(grad.var, dtype=float)
    sqr = np.asarray(grad.sqr, dtype=float)
    # The quotient written over the denominator, var + sqr·S: this runs over every
    # candidate batch of every changed job, and each pass over them counts. (The same
    # operations as the formula, so the same bits.)
    out = np.asarray(var + sqr * scale)  # (a 0-d array where all are scalars)
    ok = out > 0
    np.divide(var + sqr, out, out=out, where=ok)
    if not ok.all():
        np.divide(1.0, np.broadcast_to(scale, out.shape), out=out, where=~ok)
    return out


class _GradTable(Protocol):
    @property
    def progress(self) -> npt.NDArray[np.float64]: ...
    @property
    def grad_sqr(self) -> npt.NDArray[np.float64]: ...
    @property
    def grad_var(self) -> npt.NDArray[np.float64]: ...


def grad_params_at_progress(table: _GradTable, fraction: float) -> GradParams:
    """Gradient statistics of the epoch a run is in after `fraction` (0..1) of it.

    `table` is a per-epoch record (e.g. profiles.ValidationTable) whose `progress`
    column is cumulative and ends at the run's end; row i holds the statistics
    measured over epoch i, which ends at progress[i].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    progress = np.asarray(table.progress, dtype=float)
    if progress.size == 0:
        raise ValueError("empty gradient-statistics table")
    target = fraction * progress[-1]
    i = min(int(np.searchsorted(progress, target, side="right")), progress.size - 1)
    return GradParams(sqr=float(table.grad_sqr[i]), var=float(table.grad_var[i]))
