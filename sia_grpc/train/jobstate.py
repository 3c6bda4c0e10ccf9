"""The job's data position and progress: what a checkpoint carries from one
generation to the next (its "sia" entry), and the target it is measured against.

(Not named `progress.py`: importing a submodule of sia_grpc.train sets the package
attribute of its name, which would replace the public `sia_grpc.train.progress()`.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sia_grpc.train.env import WorkerEnv
from sia_grpc.train.noise import GradientNoise
from sia_grpc.train.sampler import Position, StepPlan
from sia_grpc.train.telemetry import SampleTable

__all__ = ["JobState"]

LOG = logging.getLogger("sia_grpc.train")

_STATE_VERSION = 1


@dataclass
class JobState:
    """Where the job is in its data and how far it has come (all ranks alike)."""

    position: Position = field(default_factory=Position)
    samples_done: int = 0
    steps: int = 0
    si_steps: float = 0.0        # scale-invariant steps: the sum of the gains
    init_batch_size: int | None = None
    dataset_len: int | None = None
    seed: int = 0
    noise: GradientNoise | None = None
    table: SampleTable = field(default_factory=SampleTable)  # measured step times

    @classmethod
    def from_state_dict(cls, s: dict) -> JobState:
        """The state `state_dict` saved."""
        job = cls(Position(s["epoch"], s["pos"], s.get("carry", 0)),
                  samples_done=s["samples_done"], steps=s["steps"], si_steps=s["si_steps"],
                  init_batch_size=s["init_batch_size"], dataset_len=s["dataset_len"],
                  seed=s["seed"])
        if s.get("noise"):
            job.noise = GradientNoise(s["init_batch_size"])
            job.noise.load_state_dict(s["noise"])
        job.table.load_state_dict(s.get("samples", {}))
        return job

    def state_dict(self) -> dict:
        p = self.position
        return {
            "version": _STATE_VERSION, "epoch": p.epoch, "pos": p.pos, "carry": p.carry,
            "samples_done": self.samples_done, "steps": self.steps, "si_steps": self.si_steps,
            "init_batch_size": self.init_batch_size, "dataset_len": self.dataset_len,
            "seed": self.seed, "noise": self.noise.state_dict() if self.noise else None,
            "samples": self.table.state_dict(),
        }

    # ---- targets ---------------------------------------------------------------------------

    def target_samples(self, env: WorkerEnv, script_epochs: float | None) -> int | None:
        """The samples to train on: the job's target (from the scheduler) or else the
        script's epochs; None while neither can be said in samples."""
        if env.target_samples:
            return env.target_samples
        if self.dataset_len is None:
            return None
        epochs = env.target_epochs or script_epochs
        if not epochs:
            return None
        return max(1, round(epochs * self.dataset_len))

    def progress(self, target: int | None) -> float:
        """Fraction of `target` trained on (0 without one)."""
        if not target:
            return 0.0
        return min(1.0, self.samples_done / target)

    # ---- moving on -------------------------------------------------------------------------

    def commit(self, plan: StepPlan, gain: float) -> None:
        """`plan`'s samples are trained on."""
        self.position = plan.end()
        self.samples_done += plan.n
        self.steps += 1
        self.si_steps += gain

    def end_epoch(self) -> None:
        """The epoch has no further step: the next one begins with what is left."""
        p = self.position
        # Any step of the epoch took the carried samples first, and the dataset holds
        # at least as many samples as there are replicas: nothing is carried twice.
        assert p.carry == 0, p
        assert self.dataset_len is not None  # (set when the loader is attached)
        self.position = Position(p.epoch + 1, 0, self.dataset_len - p.pos)
        if self.position.carry:
            LOG.info("%d sample(s) left at the end of epoch %d go into epoch %d's first step",
                     self.position.carry, p.epoch, p.epoch + 1)

    def skip_epoch(self) -> None:
        """The script moved on without finishing the epoch: start the next one."""
        p = self.position
        self.position = Position(p.epoch + 1, 0, 0)
