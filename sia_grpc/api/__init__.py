"""The `sia.v1` wire contract: messages as `pb`, service stubs and servicers by name.

    from sia_grpc.api import pb
    spec = pb.JobSpec(name="resnet", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)

The modules are generated from `protos/sia/v1/` (`make protos`).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from sia_grpc._proto.sia.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    cluster_service_pb2,
    cluster_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    policy_service_pb2,
    policy_service_pb2_grpc,
    worker_service_pb2_grpc,
)
from sia_grpc.api import pb  # every message and enum value, flat: pb.JobSpec

JobServiceStub = job_service_pb2_grpc.JobServiceStub
JobServiceServicer = job_service_pb2_grpc.JobServiceServicer
add_JobServiceServicer_to_server = job_service_pb2_grpc.add_JobServiceServicer_to_server
ClusterServiceStub = cluster_service_pb2_grpc.ClusterServiceStub
ClusterServiceServicer = cluster_service_pb2_grpc.ClusterServiceServicer
add_ClusterServiceServicer_to_server = cluster_service_pb2_grpc.add_ClusterServiceServicer_to_server
AgentServiceStub = agent_service_pb2_grpc.AgentServiceStub
AgentServiceServicer = agent_service_pb2_grpc.AgentServiceServicer
add_AgentServiceServicer_to_server = agent_service_pb2_grpc.add_AgentServiceServicer_to_server
PolicyServiceStub = policy_service_pb2_grpc.PolicyServiceStub
PolicyServiceServicer = policy_service_pb2_grpc.PolicyServiceServicer
add_PolicyServiceServicer_to_server = policy_service_pb2_grpc.add_PolicyServiceServicer_to_server
WorkerServiceStub = worker_service_pb2_grpc.WorkerServiceStub
WorkerServiceServicer = worker_service_pb2_grpc.WorkerServiceServicer
add_WorkerServiceServicer_to_server = worker_service_pb2_grpc.add_WorkerServiceServicer_to_server

# Full service names, for health checking and reflection.
SERVICE_NAMES = tuple(
    m.DESCRIPTOR.services_by_name[s].full_name
    for m, s in ((job_service_pb2, "JobService"), (cluster_service_pb2, "ClusterService"),
                 (agent_service_pb2, "AgentService"), (policy_service_pb2, "PolicyService")))

# What GetCluster shows a tenant for a GPU another tenant's job holds (not a valid job
# id): part of the contract, since clients (the dashboard) draw such GPUs apart.
OTHER_TENANT = "(other tenant)"

# The isolation levels a node agent registers (`Register.isolation`), weakest first
# (nodeagent/isolation/levels.py's `Level` values).
ISOLATION_LEVELS = ("none", "user", "sandbox")

# One vocabulary for states everywhere a person reads them (CLI, SDK, errors, logs,
# metrics): RUNNING, not JOB_STATE_RUNNING.
TERMINAL_STATES = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED,
                             pb.JOB_STATE_CANCELLED})


def seconds(ts: Timestamp) -> float:
    """A `google.protobuf.Timestamp` as seconds since the epoch (0.0 when unset)."""
    return ts.ToNanoseconds() / 1e9


def state_name(state: int) -> str:
    """"RUNNING" for pb.JOB_STATE_RUNNING (an unknown number as itself)."""
    try:
        return pb.JobState.Name(state).removeprefix("JOB_STATE_")
    except ValueError:
        return str(state)


class _NamedIntEnum(enum.IntEnum):
    """An IntEnum that prints as its name (3.11's IntEnum prints the number)."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)


# pb.JobState as a Python enum with the short names: JobState.RUNNING == pb.JOB_STATE_RUNNING
# (an int), and str() / print() / f"{...}" show "RUNNING". What the SDK's job views return.
if TYPE_CHECKING:  # (what a checker sees: the members are the protos', made at run time)
    class JobState(_NamedIntEnum):
        pass
else:
    JobState = _NamedIntEnum("JobState", {state_name(v): v for v in pb.JobState.values()})


def job_state(state: int) -> JobState | int:
    """`state` as a JobState (a number this version does not know stays an int)."""
    try:
        return JobState(state)
    except ValueError:
        return state


def node_state_name(state: int) -> str:
    """"READY" for pb.NODE_STATE_READY."""
    try:
        return pb.NodeState.Name(state).removeprefix("NODE_STATE_")
    except ValueError:
        return str(state)
