"""What the training runtime is made of. `Runtime` (runtime.py) is assembled from
parts, one per module (`Steps`: the step protocol, `Exits`: how the process stops
and its process-wide hooks), that read and set each other's attributes; every part
inherits `RuntimeBase`, so each attribute is declared here once, with its type and
what it means, and the type checker sees it in every part. (The controller's
`ShellBase` is the same for its shell.)

`Runtime.__init__` sets the attributes. The methods under TYPE_CHECKING are what one
part calls of another, for the type checker only (each is defined in the module
named; mypy checks that the definitions match these).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sia_grpc.api import pb
from sia_grpc.train.agreement import Agreement
from sia_grpc.train.checkpointing import Checkpointer
from sia_grpc.train.jobstate import JobState
from sia_grpc.train.profiling import ProfilePass
from sia_grpc.train.sampler import StepPlan, StepShape
from sia_grpc.train.telemetry import Overheads, Reports
from sia_grpc.train.worker import Worker

__all__ = ["RuntimeBase", "StepInFlight"]


@dataclass
class StepInFlight:
    """The step in flight."""

    plan: StepPlan
    micro: int = 0
    t_fetch: float = 0.0    # this micro-step's start (before its batch is fetched)
    t_yield: float = 0.0    # when its batch went to the user
    stepped: bool = False
    agreed: bool = False
    sync_s: float = 0.0     # all-reduce wait + agreement, on the last micro-step
    last_micro_s: float = 0.0


class RuntimeBase:
    """The attributes of `Runtime`, declared once for all its parts."""

    # -- set once, by Runtime.__init__: what the runtime holds, grouped by concern ------
    # Rank, world, device, settings (fixed for the process).
    worker: Worker
    # What the library costs, measured.
    overheads: Overheads
    # A profiling pass's stages (empty outside one).
    profile: ProfilePass
    # The per-step stop/batch agreement of all ranks.
    agreement: Agreement
    # Rank 0's reports to the agent.
    reports: Reports
    # Registered states, saves, resume.
    checkpoints: Checkpointer
    # Data position and progress (checkpointed).
    job: JobState

    # -- set as the script goes ---------------------------------------------------------
    # The shape the steps take now (None until the loader is attached).
    shape: StepShape | None
    # The script's own target, in epochs (`remaining_epochs_until`).
    script_epochs: float | None
    # The AdaptiveDataParallel and the AdaptiveDataLoader (one of each per process).
    model: Any
    loader: Any
    # The LR scaling rule.
    rule: str
    # The step in flight (Steps); the loader reads it.
    _step: StepInFlight | None
    # Shapes whose first (untimed) step is done.
    _warm: set[StepShape]
    # The target is reached (`finish`).
    completed: bool
    # Every rank ends at the same point (barrier at exit).
    _together: bool
    # The keys of the warnings given once (`warn_once`).
    _warned: set[str]

    # -- the process-wide hooks (Exits), put back by `reset()` -------------------------
    # The SIGTERM disposition to put back, when one was set.
    _prev_sigterm: Any
    _prev_excepthook: Callable[[type[BaseException], BaseException, TracebackType | None],
                               Any]

    if TYPE_CHECKING:
        # runtime.py
        def report(self, *, checkpoint: pb.CheckpointEvent | None = None,
                   oom: pb.OomEvent | None = None, profile: bool = False,
                   force: bool = False) -> pb.WorkerReply | None: ...
        def save_checkpoint(self) -> pb.CheckpointEvent: ...
        def target_samples(self) -> int | None: ...
        def target_reached(self) -> bool: ...
        def warn_once(self, key: str, msg: str, *args: Any) -> None: ...
        # exits.py
        def _exit(self, code: int) -> None: ...
        def _finish_profile(self) -> None: ...
        def _stop_with_checkpoint(self) -> None: ...
        # steps.py
        def current_atomic(self) -> int: ...
