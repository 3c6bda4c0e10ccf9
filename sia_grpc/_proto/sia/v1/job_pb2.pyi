import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sia_grpc._proto.sia.v1 import goodput_pb2 as _goodput_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Adaptivity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADAPTIVITY_UNSPECIFIED: _ClassVar[Adaptivity]
    ADAPTIVITY_ADAPTIVE: _ClassVar[Adaptivity]
    ADAPTIVITY_STRONG_SCALING: _ClassVar[Adaptivity]
    ADAPTIVITY_RIGID: _ClassVar[Adaptivity]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_PROFILING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_RESTARTING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
ADAPTIVITY_UNSPECIFIED: Adaptivity
ADAPTIVITY_ADAPTIVE: Adaptivity
ADAPTIVITY_STRONG_SCALING: Adaptivity
ADAPTIVITY_RIGID: Adaptivity
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_PROFILING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_RESTARTING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class JobSpec(_message.Message):
    __slots__ = ("name", "application", "command", "adaptivity", "min_gpus", "max_gpus", "num_gpus", "allowed_gpu_types", "batch_size", "max_batch_size", "type_batch_limits", "epochs", "samples", "pipeline_gpus", "restart_cost_s", "tenant", "labels", "queue", "priority", "env", "memory_mib_per_gpu")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVITY_FIELD_NUMBER: _ClassVar[int]
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_GPU_TYPES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TYPE_BATCH_LIMITS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_GPUS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COST_S_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_PER_GPU_FIELD_NUMBER: _ClassVar[int]
    name: str
    application: str
    command: _containers.RepeatedScalarFieldContainer[str]
    adaptivity: Adaptivity
    min_gpus: int
    max_gpus: int
    num_gpus: int
    allowed_gpu_types: _containers.RepeatedScalarFieldContainer[str]
    batch_size: int
    max_batch_size: int
    type_batch_limits: _containers.RepeatedCompositeFieldContainer[_goodput_pb2.TypeBatchLimits]
    epochs: float
    samples: int
    pipeline_gpus: int
    restart_cost_s: float
    tenant: str
    labels: _containers.ScalarMap[str, str]
    queue: str
    priority: str
    env: _containers.ScalarMap[str, str]
    memory_mib_per_gpu: int
    def __init__(self, name: _Optional[str] = ..., application: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., adaptivity: _Optional[_Union[Adaptivity, str]] = ..., min_gpus: _Optional[int] = ..., max_gpus: _Optional[int] = ..., num_gpus: _Optional[int] = ..., allowed_gpu_types: _Optional[_Iterable[str]] = ..., batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., type_batch_limits: _Optional[_Iterable[_Union[_goodput_pb2.TypeBatchLimits, _Mapping]]] = ..., epochs: _Optional[float] = ..., samples: _Optional[int] = ..., pipeline_gpus: _Optional[int] = ..., restart_cost_s: _Optional[float] = ..., tenant: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., queue: _Optional[str] = ..., priority: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., memory_mib_per_gpu: _Optional[int] = ...) -> None: ...

class GpuRef(_message.Message):
    __slots__ = ("node", "index")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    node: str
    index: int
    def __init__(self, node: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("gpu_type", "num_gpus", "num_nodes", "gpus", "batch_size", "num_replicas", "atomic_batch_size", "accum_steps")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ATOMIC_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    num_gpus: int
    num_nodes: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuRef]
    batch_size: int
    num_replicas: int
    atomic_batch_size: int
    accum_steps: int
    def __init__(self, gpu_type: _Optional[str] = ..., num_gpus: _Optional[int] = ..., num_nodes: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuRef, _Mapping]]] = ..., batch_size: _Optional[int] = ..., num_replicas: _Optional[int] = ..., atomic_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("state", "allocation", "restarts", "progress", "goodput", "reason", "create_time", "start_time", "finish_time", "update_time", "generation", "message", "throughput", "restart_seconds")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    RESTART_SECONDS_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    allocation: Allocation
    restarts: int
    progress: float
    goodput: float
    reason: str
    create_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    generation: int
    message: str
    throughput: float
    restart_seconds: float
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ..., restarts: _Optional[int] = ..., progress: _Optional[float] = ..., goodput: _Optional[float] = ..., reason: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., generation: _Optional[int] = ..., message: _Optional[str] = ..., throughput: _Optional[float] = ..., restart_seconds: _Optional[float] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "spec", "status", "revision", "uid")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: JobSpec
    status: JobStatus
    revision: int
    uid: str
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., status: _Optional[_Union[JobStatus, _Mapping]] = ..., revision: _Optional[int] = ..., uid: _Optional[str] = ...) -> None: ...
