"""Scheduling policies: Sia's ILP, the placer, and baselines — pure and synchronous.

Every policy is a frozen dataclass with `optimize(cluster, jobs, previous) ->
RoundResult`; the previous round's allocation is an explicit argument and
nothing is remembered between calls, so the simulator and the controller can
call the very same functions.
"""

from sia_grpc.policy.baselines import FifoPolicy, GavelPolicy, PolluxPolicy
from sia_grpc.policy.cluster import (
    Cluster,
    Config,
    GpuId,
    Node,
    paper_hetero_cluster,
    paper_homo_cluster,
)
from sia_grpc.policy.params import POLICIES, make_policy
from sia_grpc.policy.sia import SiaConfig, SiaPolicy
from sia_grpc.policy.types import (
    Adaptivity,
    JobAllocation,
    Policy,
    PolicyJob,
    RoundResult,
    SettingError,
)

__all__ = [
    "POLICIES", "Adaptivity", "Cluster", "Config", "FifoPolicy", "GavelPolicy", "GpuId",
    "JobAllocation", "Node", "Policy", "PolicyJob", "PolluxPolicy", "RoundResult", "SettingError",
    "SiaConfig", "SiaPolicy", "make_policy", "paper_hetero_cluster", "paper_homo_cluster",
]
