"""What the controller's state machine takes in (events: each carries its time) and
gives out (actions the async shell carries out), and its settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sia_grpc.api import pb
from sia_grpc.api.validation import Resolved
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult

# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    at: float  # wall-clock seconds (injected clock)


@dataclass(frozen=True)
class JobCreated(Event):
    job: pb.Job  # durable already
    resolved: Resolved | None = None  # its validated spec, if the caller has it


@dataclass(frozen=True)
class JobCancelRequested(Event):
    job_id: str


@dataclass(frozen=True)
class JobDeleted(Event):
    job_id: str


@dataclass(frozen=True)
class AgentRegistered(Event):
    node_id: str
    gpu_type: str
    num_gpus: int
    version: str = ""
    running: tuple[tuple[str, int, tuple[int, ...]], ...] = ()  # (job, generation, gpus)
    profiling: tuple[tuple[str, int, int], ...] = ()  # passes in flight: (job, generation, gpu)
    draining: bool = False  # what the agent believes
    isolation: str = ""  # how the node separates jobs (Register.isolation)


@dataclass(frozen=True)
class AgentMessage(Event):
    node_id: str
    message: pb.AgentMessage  # heartbeat, telemetry, ack or exit


@dataclass(frozen=True)
class AgentDisconnected(Event):
    node_id: str


@dataclass(frozen=True)
class NodeDrainChanged(Event):
    """An admin drained a node (`reason` set) or ended its drain (`reason` None)."""

    node_id: str
    reason: str | None


@dataclass(frozen=True)
class NodeForgotten(Event):
    """An admin removed a LOST node (ClusterService.ForgetNode)."""

    node_id: str


@dataclass(frozen=True)
class QueuesLoaded(Event):
    """The queues in force from now on (at start, and on each good reload)."""

    queues: QueueSet


@dataclass(frozen=True)
class Liveness(Event):
    """Periodic check: agents silent past the heartbeat timeout are lost."""


@dataclass(frozen=True)
class Tick(Event):
    trigger: str = "timer"  # or "arrival", "requeue", ...
    # An early round (WantRound): it only places waiting jobs on idle GPUs.
    early: bool = False


@dataclass(frozen=True)
class SolveFinished(Event):
    round_no: int
    result: RoundResult | None
    error: str = ""  # set when the solve failed or timed out: nothing changes


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Send:
    """A message to a node's agent. The shell sends it only once the Persists of its
    batch have committed (write-ahead: `Controller._process`), so no agent acts on a
    decision the store does not hold."""

    node_id: str
    message: pb.ControllerMessage


@dataclass(frozen=True)
class Persist:
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class Solve:
    round_no: int
    trigger: str
    cluster: Cluster
    jobs: tuple[PolicyJob, ...]
    previous: Mapping[str, JobAllocation]
    queues: QueueSet | None = None  # None: no queues configured (one flat pool)


@dataclass(frozen=True)
class RoundAcked:
    """Every directive a round sent (including RUNs that waited for stops) is
    acknowledged: the round's effects are in place."""

    round_no: int
    # Set when it finished without every acknowledgement: why (an agent disconnected).
    interrupted: str = ""


@dataclass(frozen=True)
class Reconnect:
    """End the agent's stream: it was judged lost while still talking, so it must
    register again (and be reconciled) before it gets work."""

    node_id: str


@dataclass(frozen=True)
class RoundDone:
    round: pb.Round
    # Jobs the round preempted, as (their queue, why): "reclaim" (for another queue's
    # guarantee) or "policy" (the goodput ILP's choice); for the preemption counter.
    preempted: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RoundSkipped:
    """A round that did not run, and why (`round.note`): for the log and history."""

    round: pb.Round


@dataclass(frozen=True)
class WantRound:
    """Ask the shell for an early (debounced) round: a job became schedulable."""

    trigger: str = "arrival"


@dataclass(frozen=True)
class Happened:
    """Something an operator may care about that is not a job's state or reason (the
    shell records those itself, from what it persists): a node registered, lost,
    drained or forgotten, a queue reclaiming GPUs. The shell records it in the
    cluster's event history (`pb.Event`), in the transaction of its batch."""

    at: float
    kind: pb.EventKind
    message: str
    node: str = ""
    job_id: str = ""
    queue: str = ""


Action = (Send | Persist | Solve | RoundDone | RoundSkipped | WantRound | Reconnect | RoundAcked
          | Happened)


@dataclass(frozen=True)
class ControllerSettings:
    """What the state machine needs of the controller's configuration; the defaults
    of the settings it shares with `ControllerConfig` are that class's (one place)."""

    # seconds without a message: the agent is lost
    heartbeat_timeout: float = ControllerConfig.heartbeat_timeout
    profile_batch_sizes: int = 10  # micro-batch sizes per profiling pass
    persist_progress_every: float = 10.0  # seconds between progress-only writes
    checkpoint_root: str = ControllerConfig.checkpoint_root
    master_port_base: int = 29500
    # A job that has waited this long for a GPU to profile on gets one from the next
    # timer round (a profiling slot); until then, passes use GPUs that free up.
    profile_wait: float = ControllerConfig.round_duration
    reuse_profiles: bool = ControllerConfig.reuse_profiles
    job_retries: int = ControllerConfig.job_retries
    # Identical workloads' profiles kept for reuse (most recently profiled first out).
    profile_cache_entries: int = 4096

    @classmethod
    def of(cls, config: ControllerConfig) -> ControllerSettings:
        return cls(heartbeat_timeout=config.heartbeat_timeout,
                   checkpoint_root=config.checkpoint_root, profile_wait=config.round_duration,
                   reuse_profiles=config.reuse_profiles, job_retries=config.job_retries)
