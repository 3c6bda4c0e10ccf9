from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ThroughputSample(_message.Message):
    __slots__ = ("gpu_type", "num_nodes", "num_replicas", "atomic_batch_size", "accum_steps", "step_time_s", "sync_time_s", "count")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ATOMIC_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SYNC_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    num_nodes: int
    num_replicas: int
    atomic_batch_size: int
    accum_steps: int
    step_time_s: float
    sync_time_s: float
    count: int
    def __init__(self, gpu_type: _Optional[str] = ..., num_nodes: _Optional[int] = ..., num_replicas: _Optional[int] = ..., atomic_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., step_time_s: _Optional[float] = ..., sync_time_s: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class GradientStats(_message.Message):
    __slots__ = ("sqr", "var")
    SQR_FIELD_NUMBER: _ClassVar[int]
    VAR_FIELD_NUMBER: _ClassVar[int]
    sqr: float
    var: float
    def __init__(self, sqr: _Optional[float] = ..., var: _Optional[float] = ...) -> None: ...

class TypeBatchLimits(_message.Message):
    __slots__ = ("gpu_type", "min_local_batch_size", "max_local_batch_size")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    MIN_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    min_local_batch_size: int
    max_local_batch_size: int
    def __init__(self, gpu_type: _Optional[str] = ..., min_local_batch_size: _Optional[int] = ..., max_local_batch_size: _Optional[int] = ...) -> None: ...
