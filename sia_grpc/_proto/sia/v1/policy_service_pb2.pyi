from sia_grpc._proto.sia.v1 import goodput_pb2 as _goodput_pb2
from sia_grpc._proto.sia.v1 import job_pb2 as _job_pb2
from sia_grpc._proto.sia.v1 import queue_pb2 as _queue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeSpec(_message.Message):
    __slots__ = ("name", "gpu_type", "num_gpus")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu_type: str
    num_gpus: int
    def __init__(self, name: _Optional[str] = ..., gpu_type: _Optional[str] = ..., num_gpus: _Optional[int] = ...) -> None: ...

class PolicyJob(_message.Message):
    __slots__ = ("job_id", "adaptivity", "min_gpus", "max_gpus", "num_gpus", "allowed_gpu_types", "pipeline_gpus", "batch_size", "init_batch_size", "max_batch_size", "type_batch_limits", "samples", "grad", "age_s", "restarts", "restart_cost_s", "queue", "priority", "stint_s", "restoring", "progress", "run_time_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVITY_FIELD_NUMBER: _ClassVar[int]
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_GPU_TYPES_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_GPUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INIT_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TYPE_BATCH_LIMITS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GRAD_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COST_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STINT_S_FIELD_NUMBER: _ClassVar[int]
    RESTORING_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RUN_TIME_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    adaptivity: _job_pb2.Adaptivity
    min_gpus: int
    max_gpus: int
    num_gpus: int
    allowed_gpu_types: _containers.RepeatedScalarFieldContainer[str]
    pipeline_gpus: int
    batch_size: int
    init_batch_size: int
    max_batch_size: int
    type_batch_limits: _containers.RepeatedCompositeFieldContainer[_goodput_pb2.TypeBatchLimits]
    samples: _containers.RepeatedCompositeFieldContainer[_goodput_pb2.ThroughputSample]
    grad: _goodput_pb2.GradientStats
    age_s: float
    restarts: int
    restart_cost_s: float
    queue: str
    priority: str
    stint_s: float
    restoring: bool
    progress: float
    run_time_s: float
    def __init__(self, job_id: _Optional[str] = ..., adaptivity: _Optional[_Union[_job_pb2.Adaptivity, str]] = ..., min_gpus: _Optional[int] = ..., max_gpus: _Optional[int] = ..., num_gpus: _Optional[int] = ..., allowed_gpu_types: _Optional[_Iterable[str]] = ..., pipeline_gpus: _Optional[int] = ..., batch_size: _Optional[int] = ..., init_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., type_batch_limits: _Optional[_Iterable[_Union[_goodput_pb2.TypeBatchLimits, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[_goodput_pb2.ThroughputSample, _Mapping]]] = ..., grad: _Optional[_Union[_goodput_pb2.GradientStats, _Mapping]] = ..., age_s: _Optional[float] = ..., restarts: _Optional[int] = ..., restart_cost_s: _Optional[float] = ..., queue: _Optional[str] = ..., priority: _Optional[str] = ..., stint_s: _Optional[float] = ..., restoring: _Optional[bool] = ..., progress: _Optional[float] = ..., run_time_s: _Optional[float] = ...) -> None: ...

class PreviousAllocation(_message.Message):
    __slots__ = ("job_id", "allocation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    allocation: _job_pb2.Allocation
    def __init__(self, job_id: _Optional[str] = ..., allocation: _Optional[_Union[_job_pb2.Allocation, _Mapping]] = ...) -> None: ...

class OptimizeRequest(_message.Message):
    __slots__ = ("nodes", "jobs", "previous", "policy", "params", "round_duration_s", "queues")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ROUND_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeSpec]
    jobs: _containers.RepeatedCompositeFieldContainer[PolicyJob]
    previous: _containers.RepeatedCompositeFieldContainer[PreviousAllocation]
    policy: str
    params: _containers.ScalarMap[str, str]
    round_duration_s: float
    queues: _queue_pb2.QueueConfig
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeSpec, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[PolicyJob, _Mapping]]] = ..., previous: _Optional[_Iterable[_Union[PreviousAllocation, _Mapping]]] = ..., policy: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., round_duration_s: _Optional[float] = ..., queues: _Optional[_Union[_queue_pb2.QueueConfig, _Mapping]] = ...) -> None: ...

class JobDecision(_message.Message):
    __slots__ = ("job_id", "allocation", "restart", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    RESTART_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    allocation: _job_pb2.Allocation
    restart: bool
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., allocation: _Optional[_Union[_job_pb2.Allocation, _Mapping]] = ..., restart: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class OptimizeResponse(_message.Message):
    __slots__ = ("decisions", "objective", "timings_ms", "queues", "rows")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[JobDecision]
    objective: float
    timings_ms: _containers.ScalarMap[str, float]
    queues: _containers.RepeatedCompositeFieldContainer[_queue_pb2.QueueUsage]
    rows: _containers.RepeatedCompositeFieldContainer[_queue_pb2.SideRow]
    def __init__(self, decisions: _Optional[_Iterable[_Union[JobDecision, _Mapping]]] = ..., objective: _Optional[float] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., queues: _Optional[_Iterable[_Union[_queue_pb2.QueueUsage, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[_queue_pb2.SideRow, _Mapping]]] = ...) -> None: ...
