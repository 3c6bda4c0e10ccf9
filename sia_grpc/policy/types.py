"""What a policy takes and returns: jobs as the scheduler sees them, allocations,
and the record of one round. Plain frozen data; no behaviour beyond validation."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np

from sia_grpc.policy.cluster import Cluster, Config, GpuId
from sia_grpc.policy.errors import FieldError

if TYPE_CHECKING:
    from sia_grpc.policy.queues import QueueSet


class Adaptivity(enum.Enum):
    """How much of a job's resources the scheduler may change."""

    ADAPTIVE = "adaptive"  # GPU type, count and batch size
    STRONG_SCALING = "strong-scaling"  # type and count; batch size fixed
    RIGID = "rigid"  # type only; count and batch size fixed


class GoodputEstimate(Protocol):
    # (read-only: models.goodput.GoodputEstimate is a frozen dataclass)
    @property
    def goodput(self) -> np.ndarray: ...
    @property
    def throughput(self) -> np.ndarray: ...
    @property
    def batch_size(self) -> np.ndarray: ...
    @property
    def atomic_bsz(self) -> np.ndarray: ...
    @property
    def accum_steps(self) -> np.ndarray: ...


class GoodputModel(Protocol):
    """A job's goodput estimator (see `sia_grpc.models.JobGoodputModel`)."""

    def evaluate(self, gpu_type: str, num_nodes: np.ndarray, num_replicas: np.ndarray, *,
                 fixed_batch_size: int | None = None) -> GoodputEstimate: ...


@dataclass(frozen=True)
class PolicyJob:
    """One active job, with everything a round needs to know about it.

    `age` and `num_restarts` feed Sia's restart factor; `restart_cost` is the
    job's measured (or hinted) checkpoint-restart time S_i in seconds.
    `progress` (0..1 of its target) and `run_time` (seconds it has held GPUs) are
    what a scheduler knows of how far the job has got; `remaining_run_time` turns
    them into its expected remaining run time (Sia's lifetime restart horizon).
    `attained` is the time (seconds) the job has held GPUs of each type, for
    time-sharing policies (Gavel); the caller keeps it, so policies stay stateless.
    `run_time` is its sum, unless `total_run_time` is given: a caller that knows
    only the total (PolicyService's `run_time_s`) gives that, and Gavel, which
    reads `attained` per type, sees the job as new rather than on a made-up type.
    `restoring` is set while the job is still paying its checkpoint-restore delay
    after its GPUs last changed; Sia then keeps its allocation as it is (see
    `SiaConfig.hold_restoring`). `pinned` keeps its allocation whatever the
    policy's settings: the controller's early rounds (a job arrived and GPUs are
    idle) place waiting jobs on idle GPUs without moving running ones.
    """

    job_id: str
    model: GoodputModel
    adaptivity: Adaptivity = Adaptivity.ADAPTIVE
    min_gpus: int = 1
    max_gpus: int | None = None
    allowed_types: frozenset[str] | None = None
    pipeline_gpus: int = 1  # GPUs per data-parallel replica (hybrid parallelism)
    batch_size: int | None = None  # fixed global batch (strong-scaling, rigid)
    num_gpus: int | None = None  # fixed GPU count (rigid)
    age: float = 0.0
    num_restarts: int = 0
    restart_cost: float = 30.0
    submit_time: float = 0.0  # for FIFO ordering
    attained: Mapping[str, float] = field(default_factory=dict)
    progress: float = 0.0
    total_run_time: float | None = None  # seconds held in all; None: sum of `attained`
    restoring: bool = False
    # Queues (`sia_grpc.policy.queues`): the job's queue and priority class ("": the
    # default), and the seconds it has run on its current allocation (for the
    # minimum runtime before it may be preempted).
    queue: str = "default"
    priority: str = ""
    stint: float = 0.0
    pinned: bool = False
    required: bool = False  # must get GPUs if any configuration fits (a profiling slot)

    @property
    def run_time(self) -> float:
        if self.total_run_time is not None:
            return self.total_run_time
        return sum(self.attained.values())

    def remaining_run_time(self) -> float | None:
        """Seconds of running it is expected to need still, at the rate it has made
        progress so far (None before it has made any)."""
        if not 0 < self.progress < 1 or self.run_time <= 0:
            return None
        return self.run_time * (1 - self.progress) / self.progress

    def __post_init__(self) -> None:
        if not self.job_id:
            raise FieldError("job_id", "must be non-empty")
        if self.pipeline_gpus < 1:
            raise FieldError("pipeline_gpus", f"must be >= 1, got {self.pipeline_gpus}")
        if self.min_gpus < 1:
            raise FieldError("min_gpus", f"must be >= 1, got {self.min_gpus}")
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise FieldError("max_gpus", f"{self.max_gpus} is below min_gpus {self.min_gpus}")
        if self.adaptivity is not Adaptivity.ADAPTIVE and not self.batch_size:
            raise FieldError("batch_size", f"required for {self.adaptivity.value} jobs")
        if self.adaptivity is Adaptivity.RIGID and not self.num_gpus:
            raise FieldError("num_gpus", "required for rigid jobs")
        if self.num_gpus is not None and (self.num_gpus < 1
                                          or self.num_gpus % self.pipeline_gpus):
            raise FieldError("num_gpus", f"{self.num_gpus} is not a positive multiple of "
                             f"pipeline_gpus {self.pipeline_gpus}")
        if self.num_gpus is not None and not (
                self.min_gpus <= self.num_gpus <= (self.max_gpus or self.num_gpus)):
            raise FieldError("num_gpus", f"{self.num_gpus} is outside [min_gpus, max_gpus]")
        if self.restart_cost < 0 or self.age < 0 or self.num_restarts < 0:
            raise FieldError("restart_cost/age/num_restarts", "must be non-negative")
        if self.total_run_time is not None and not self.total_run_time >= 0:
            raise FieldError("total_run_time", f"must be non-negative, got {self.total_run_time}")
        if any(v < 0 for v in self.attained.values()):
            raise FieldError("attained", "time on a GPU type must be non-negative")


_new, _set = object.__new__, object.__setattr__  # (`JobAllocation.of`)


@dataclass(frozen=True)
class JobAllocation:
    """A job's resources for the coming round."""

    config: Config
    gpus: tuple[GpuId, ...] = ()
    num_replicas: int = 0
    batch_size: int = 0
    atomic_bsz: int = 0
    accum_steps: int = 0
    goodput: float = 0.0  # estimated, samples/s scaled by statistical efficiency

    @classmethod
    def of(cls, config: Config, gpus: tuple[GpuId, ...], num_replicas: int, batch_size: int,
           atomic_bsz: int, accum_steps: int, goodput: float) -> JobAllocation:
        """The constructor's result, made as pickle makes it: a frozen dataclass's
        `__init__` sets each field through `object.__setattr__`, 5 µs an allocation,
        0.1 s of a round at 20,000 jobs. (The class has no checks to skip.) Its
        `__dict__` is given whole: half the time of updating an empty one."""
        self = _new(cls)
        _set(self, "__dict__", {"config": config, "gpus": gpus, "num_replicas": num_replicas,
                                "batch_size": batch_size, "atomic_bsz": atomic_bsz,
                                "accum_steps": accum_steps, "goodput": goodput})
        return self


@dataclass(frozen=True)
class SiloHint:
    """One queue's silo solve in a round (`silos.silo_use`): its capacity prices
    and each job's configuration (job id -> index in the cluster's configs). The
    next round's silo solve of that queue starts from them; only its speed
    depends on them, never its answer beyond the solver's gap."""

    prices: tuple[float, ...]
    choice: Mapping[str, int]


@dataclass(frozen=True)
class WarmStart:
    """What a round leaves for the next to start from (`RoundResult.warm`, given
    back as `optimize(..., warm=)`): per queue, its silo solve."""

    silos: Mapping[str, SiloHint] = field(default_factory=dict)
    # The round's capacity prices, and its side rows' by name: the next round's solve
    # tries them first (`solve(..., prices=)` checks that they fit).
    prices: tuple[float, ...] | None = None
    row_prices: Mapping[str, float] = field(default_factory=dict)
    # The queues whose guarantee rows the round needed and may need again
    # (`rounds.ilp_round` leaves out the rows of queues holding at least what they
    # could be owed): the next round solves their silos first.
    needed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RoundResult:
    """A policy's decision for one round, and what it cost to reach."""

    allocations: Mapping[str, JobAllocation]
    restarted: frozenset[str]  # jobs that must checkpoint-restart (new shape or moved)
    objective: float
    timings: Mapping[str, float]  # seconds: estimate, build, solve, place, total
    solver_stats: Mapping[str, float] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)  # per job, human-readable
    # With queues: GPUs each queue holds per type, and each side row (guarantee,
    # borrowing, restarts) as (activity, bound) of Σ coef·x ≤ bound.
    queues: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    rows: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    warm: WarmStart | None = None  # for the next round's `optimize(..., warm=)`


class SettingError(ValueError):
    """A policy setting is unknown or has a bad value. `key` names it: the config
    field (`p`), qualified by the policy once known (`sia.p`)."""

    def __init__(self, setting: str, problem: str, policy: str = "") -> None:
        self.setting, self.problem, self.policy = setting, problem, policy
        super().__init__(f"{self.key}: {problem}")

    @property
    def key(self) -> str:
        return f"{self.policy}.{self.setting}" if self.policy else self.setting


def setting(default: Any, help: str) -> Any:
    """A field of a policy's frozen config, with the help text that
    `sia_grpc.policy.params.settings` lists (docs, `--help`)."""
    return field(default=default, metadata={"help": help})


def positive(config: Any, *names: str) -> None:
    """SettingError naming the first of `names` whose value is not > 0 (NaN included)."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise SettingError(name, f"must be positive, got {value:g}")


class _RoundLength(Protocol):
    @property
    def round_duration(self) -> float: ...


class RoundFromConfig:
    """Mixin for policies whose frozen `config` carries their round length."""

    config: _RoundLength

    @property
    def round_duration(self) -> float:
        return self.config.round_duration


class Policy(Protocol):
    """Every scheduling policy: pure, parameters frozen, previous round explicit."""

    @property
    def name(self) -> str: ...
    @property
    def round_duration(self) -> float: ...

    def optimize(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                 previous: Mapping[str, JobAllocation], *,
                 queues: QueueSet | None = None,
                 warm: WarmStart | None = None) -> RoundResult: ...
    # (`warm` is given only to a policy whose last result left one and whose
    # `optimize` takes it (`warm_arg`), so a policy without warm starts, or a
    # wrapper written before them that hands on another policy's results, need not.)


class WarmArg(TypedDict, total=False):
    """`warm_arg`'s keywords: `warm`, or none."""

    warm: WarmStart


def warm_arg(policy: Policy, warm: WarmStart | None) -> WarmArg:
    """The keyword to give `policy.optimize` the last round's `warm`: none where
    there is none or `optimize` does not take it (by name, or as `**kwargs`)."""
    if warm is None:
        return {}
    try:
        params = inspect.signature(policy.optimize).parameters.values()
    except (TypeError, ValueError):  # (a builtin or C-level callable: not asked)
        return {}
    takes = any(p.name == "warm" or p.kind is p.VAR_KEYWORD for p in params)
    return {"warm": warm} if takes else {}
