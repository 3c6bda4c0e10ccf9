import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sia_grpc._proto.sia.v1 import event_pb2 as _event_pb2
from sia_grpc._proto.sia.v1 import job_pb2 as _job_pb2
from sia_grpc._proto.sia.v1 import queue_pb2 as _queue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_LOST: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_LOST: NodeState
NODE_STATE_DRAINING: NodeState

class GpuSlot(_message.Message):
    __slots__ = ("index", "job_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    job_id: str
    def __init__(self, index: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "gpu_type", "num_gpus", "state", "gpus", "agent_version", "last_heartbeat", "drain_reason", "isolation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu_type: str
    num_gpus: int
    state: NodeState
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSlot]
    agent_version: str
    last_heartbeat: _timestamp_pb2.Timestamp
    drain_reason: str
    isolation: str
    def __init__(self, name: _Optional[str] = ..., gpu_type: _Optional[str] = ..., num_gpus: _Optional[int] = ..., state: _Optional[_Union[NodeState, str]] = ..., gpus: _Optional[_Iterable[_Union[GpuSlot, _Mapping]]] = ..., agent_version: _Optional[str] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., drain_reason: _Optional[str] = ..., isolation: _Optional[str] = ...) -> None: ...

class GpuTypeSummary(_message.Message):
    __slots__ = ("gpu_type", "nodes", "gpus", "allocated")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    nodes: int
    gpus: int
    allocated: int
    def __init__(self, gpu_type: _Optional[str] = ..., nodes: _Optional[int] = ..., gpus: _Optional[int] = ..., allocated: _Optional[int] = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("nodes", "types", "policy", "round_duration_s")
    NODES_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ROUND_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    types: _containers.RepeatedCompositeFieldContainer[GpuTypeSummary]
    policy: str
    round_duration_s: float
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., types: _Optional[_Iterable[_Union[GpuTypeSummary, _Mapping]]] = ..., policy: _Optional[str] = ..., round_duration_s: _Optional[float] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("round", "start_time", "trigger", "jobs", "gpus_allocated", "jobs_moved", "objective", "estimate_ms", "solve_ms", "place_ms", "dispatch_ms", "total_ms", "note", "end_time", "binding_rows", "reclaims", "moves", "term")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    GPUS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    JOBS_MOVED_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_MS_FIELD_NUMBER: _ClassVar[int]
    SOLVE_MS_FIELD_NUMBER: _ClassVar[int]
    PLACE_MS_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    BINDING_ROWS_FIELD_NUMBER: _ClassVar[int]
    RECLAIMS_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    round: int
    start_time: _timestamp_pb2.Timestamp
    trigger: str
    jobs: int
    gpus_allocated: int
    jobs_moved: int
    objective: float
    estimate_ms: float
    solve_ms: float
    place_ms: float
    dispatch_ms: float
    total_ms: float
    note: str
    end_time: _timestamp_pb2.Timestamp
    binding_rows: _containers.RepeatedScalarFieldContainer[str]
    reclaims: int
    moves: _containers.RepeatedCompositeFieldContainer[RoundMove]
    term: int
    def __init__(self, round: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., trigger: _Optional[str] = ..., jobs: _Optional[int] = ..., gpus_allocated: _Optional[int] = ..., jobs_moved: _Optional[int] = ..., objective: _Optional[float] = ..., estimate_ms: _Optional[float] = ..., solve_ms: _Optional[float] = ..., place_ms: _Optional[float] = ..., dispatch_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., note: _Optional[str] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., binding_rows: _Optional[_Iterable[str]] = ..., reclaims: _Optional[int] = ..., moves: _Optional[_Iterable[_Union[RoundMove, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class RoundMove(_message.Message):
    __slots__ = ("job_id", "name", "tenant", "kind", "before", "after")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    tenant: str
    kind: str
    before: _job_pb2.Allocation
    after: _job_pb2.Allocation
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., tenant: _Optional[str] = ..., kind: _Optional[str] = ..., before: _Optional[_Union[_job_pb2.Allocation, _Mapping]] = ..., after: _Optional[_Union[_job_pb2.Allocation, _Mapping]] = ...) -> None: ...

class ListRoundsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ListRoundsResponse(_message.Message):
    __slots__ = ("rounds",)
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    rounds: _containers.RepeatedCompositeFieldContainer[Round]
    def __init__(self, rounds: _Optional[_Iterable[_Union[Round, _Mapping]]] = ...) -> None: ...

class WatchRoundsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class UndrainNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class ForgetNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "config")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[_queue_pb2.QueueStatus]
    config: _queue_pb2.QueueConfig
    def __init__(self, queues: _Optional[_Iterable[_Union[_queue_pb2.QueueStatus, _Mapping]]] = ..., config: _Optional[_Union[_queue_pb2.QueueConfig, _Mapping]] = ...) -> None: ...
