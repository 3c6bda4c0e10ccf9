"""A profiling pass (SIA_PROFILE): a few steps at each micro-batch size in turn on one
GPU, the first steps of each size untimed warm-up; then a report and EXIT_PROFILED.
"""

from __future__ import annotations

from dataclasses import dataclass

from sia_grpc.api import pb
from sia_grpc.train.sampler import StepShape

__all__ = ["PROFILE_MEASURED_STEPS", "PROFILE_WARMUP_STEPS", "ProfilePass"]

PROFILE_WARMUP_STEPS = 2
PROFILE_MEASURED_STEPS = 3


@dataclass
class ProfilePass:
    """The stages (one per micro-batch size, smallest first) and how far the pass is."""

    sizes: list[int]
    stage: int = 0
    stage_steps: int = 0         # steps done in the current stage
    done: bool = False
    oom: pb.OomEvent | None = None  # the out-of-memory error that ended it early

    @classmethod
    def of(cls, sizes: tuple[int, ...]) -> ProfilePass:
        return cls(sorted(set(sizes)))

    def first_shape(self) -> StepShape:
        return StepShape(1, self.sizes[0], 0)

    def end_step(self) -> tuple[bool, StepShape | None]:
        """Count a step: (whether it is timed, the next stage's shape if this step
        ended the stage and another follows)."""
        self.stage_steps += 1
        timed = self.stage_steps > PROFILE_WARMUP_STEPS
        if self.stage_steps < PROFILE_WARMUP_STEPS + PROFILE_MEASURED_STEPS:
            return timed, None
        self.stage += 1
        self.stage_steps = 0
        if self.stage >= len(self.sizes):
            self.done = True
            return timed, None
        return timed, StepShape(1, self.sizes[self.stage], 0)
