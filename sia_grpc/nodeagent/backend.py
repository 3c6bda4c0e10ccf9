"""What the agent needs from whatever runs the training: the worker back-end.

The agent owns the stream, directive semantics and GPU bookkeeping; a back-end
only starts, checkpoints and profiles workers and reports on them. The modeled
back-end (`modeled.ModeledBackend`) implements this from the profile data; real
torch workers will implement the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sia_grpc.api import pb
from sia_grpc.names import job_key

__all__ = ["ExitCallback", "Launch", "WorkerBackend"]

# Called (synchronously, on the event loop) when a worker ends on its own,
# e.g. JobExit KIND_COMPLETED; its GPUs are already free.
ExitCallback = Callable[[pb.JobExit], None]


@dataclass(frozen=True)
class Launch:
    """One generation of a job on this node, as an ACTION_RUN directive gives it."""

    job_id: str
    generation: int
    local_gpus: tuple[int, ...]
    spec: pb.JobSpec
    allocation: pb.Allocation  # the job's whole allocation, across nodes
    world: pb.WorldLayout
    restore_progress: float  # fraction 0..1 of the last checkpoint
    checkpoint_path: str = ""
    job_uid: str = ""  # the job's server-assigned uid: its files are keyed by it

    @property
    def leader(self) -> bool:
        """Whether this node holds global rank 0: it alone reports for the job."""
        return self.world.rank_offset == 0

    def check_gpu_type(self, gpu_type: str) -> None:
        """ValueError unless the allocation (where it names a type) is of `gpu_type`."""
        a = self.allocation
        if a.gpu_type and a.gpu_type != gpu_type:
            raise ValueError(f"allocation.gpu_type: {a.gpu_type!r} does not match this "
                             f"node's {gpu_type!r}")

    @classmethod
    def from_directive(cls, d: pb.Directive) -> Launch:
        return cls(job_id=d.job_id, generation=d.generation, local_gpus=tuple(d.local_gpus),
                   spec=d.spec, allocation=d.allocation, world=d.world,
                   restore_progress=d.restore_progress, checkpoint_path=d.checkpoint_path,
                   job_uid=d.job_uid)

    @property
    def key(self) -> str:
        """What the job's files on this node are keyed by (`names.job_key`)."""
        return job_key(self.spec.tenant, self.job_id, self.job_uid)


class WorkerBackend(Protocol):
    """Runs workers on this node's GPUs. All job ids are unique among running workers."""

    def check(self, launch: Launch) -> None:
        """Raise ValueError (with a message for the directive's ack) if `launch`
        could not start; changes nothing."""
        ...

    async def start(self, launch: Launch, on_exit: ExitCallback) -> None:
        """Start the worker; return once it runs. `on_exit` reports an end the
        agent did not ask for (completion, failure)."""
        ...

    async def stop(self, job_id: str) -> pb.JobExit:
        """Checkpoint and stop the job's worker; its JobExit (KIND_CHECKPOINTED)."""
        ...

    def allocation(self, job_id: str) -> pb.Allocation:
        """The allocation the running job was last given."""
        ...

    async def rebatch(self, job_id: str, allocation: pb.Allocation) -> None:
        """Change the running job's batch size and accumulation in place, between
        steps and without a restart (the elastic data loader's job)."""
        ...

    async def profile(self, request: pb.ProfileRequest) -> pb.Telemetry:
        """Time a few steps per batch size on one GPU; Telemetry with profile=true."""
        ...

    def running(self) -> list[pb.RunningJob]:
        """The workers running now (what a Register lists after a reconnect)."""
        ...

    def telemetry(self) -> list[pb.Telemetry]:
        """A report per job this node reports for, since the previous call."""
        ...

    async def close(self) -> None:
        """Stop every worker without reporting; safe to call twice."""
        ...
