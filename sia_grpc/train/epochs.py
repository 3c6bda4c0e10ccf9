"""The resumable epoch loop."""

from __future__ import annotations

import math
from collections.abc import Iterator

from sia_grpc.train.runtime import current

__all__ = ["current_epoch", "remaining_epochs_until"]


def remaining_epochs_until(epochs: float) -> Iterator[int]:
    """The epochs still to train, resuming where the checkpoint left off.

        for epoch in remaining_epochs_until(30):
            for batch in loader:
                ...

    `epochs` is the script's own target; the job's target from the scheduler
    (SIA_TARGET_EPOCHS or SIA_TARGET_SAMPLES) takes precedence. A fractional
    target ends part-way through the last epoch. When the loop ends the target
    is reached: rank 0 reports progress 1 and a SIGTERM from then on exits 0.
    In a profiling pass (SIA_PROFILE) it runs until profiling is done and the
    process exits with EXIT_PROFILED.
    """
    rt = current()
    rt.script_epochs = float(epochs)
    while True:
        rt.boundary()
        if rt.target_reached():
            break
        if rt.target_samples() is None and not rt.profiling and rt.position.epoch >= math.ceil(
                rt.env.target_epochs or epochs):
            break  # no loader yet to measure the target in samples
        e = rt.position.epoch
        steps = rt.steps
        yield e
        if rt.position.epoch == e and not rt.target_reached():
            if rt.profiling and rt.steps == steps:
                raise RuntimeError("profiling needs the epoch loop to iterate the "
                                   "AdaptiveDataLoader")
            rt.warn_once("skip", "epoch %d ended before its data did; the next epoch starts "
                         "afresh", e)
            rt.skip_epoch()
    rt.finish()


def current_epoch() -> int:
    """The epoch the job is in (restored from the checkpoint)."""
    return current().position.epoch
