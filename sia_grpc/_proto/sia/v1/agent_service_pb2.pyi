from sia_grpc._proto.sia.v1 import goodput_pb2 as _goodput_pb2
from sia_grpc._proto.sia.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "telemetry", "ack", "exit")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    telemetry: Telemetry
    ack: DirectiveAck
    exit: JobExit
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., ack: _Optional[_Union[DirectiveAck, _Mapping]] = ..., exit: _Optional[_Union[JobExit, _Mapping]] = ...) -> None: ...

class GpuInventory(_message.Message):
    __slots__ = ("gpu_type", "count")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    count: int
    def __init__(self, gpu_type: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class RunningJob(_message.Message):
    __slots__ = ("job_id", "generation", "local_gpus")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    local_gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., local_gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class ProfilingPass(_message.Message):
    __slots__ = ("job_id", "generation", "local_gpu")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPU_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    local_gpu: int
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., local_gpu: _Optional[int] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "gpus", "agent_version", "running", "profiling", "draining", "instance_id", "highest_term", "isolation")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PROFILING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_TERM_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInventory]
    agent_version: str
    running: _containers.RepeatedCompositeFieldContainer[RunningJob]
    profiling: _containers.RepeatedCompositeFieldContainer[ProfilingPass]
    draining: bool
    instance_id: str
    highest_term: int
    isolation: str
    def __init__(self, node_id: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInventory, _Mapping]]] = ..., agent_version: _Optional[str] = ..., running: _Optional[_Iterable[_Union[RunningJob, _Mapping]]] = ..., profiling: _Optional[_Iterable[_Union[ProfilingPass, _Mapping]]] = ..., draining: _Optional[bool] = ..., instance_id: _Optional[str] = ..., highest_term: _Optional[int] = ..., isolation: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointEvent(_message.Message):
    __slots__ = ("generation", "path", "progress", "save_s", "restore_s")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SAVE_S_FIELD_NUMBER: _ClassVar[int]
    RESTORE_S_FIELD_NUMBER: _ClassVar[int]
    generation: int
    path: str
    progress: float
    save_s: float
    restore_s: float
    def __init__(self, generation: _Optional[int] = ..., path: _Optional[str] = ..., progress: _Optional[float] = ..., save_s: _Optional[float] = ..., restore_s: _Optional[float] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("job_id", "generation", "samples", "grad", "progress", "checkpoint", "profile", "profile_error", "profile_refused", "profile_gpu")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GRAD_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ERROR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_REFUSED_FIELD_NUMBER: _ClassVar[int]
    PROFILE_GPU_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    samples: _containers.RepeatedCompositeFieldContainer[_goodput_pb2.ThroughputSample]
    grad: _goodput_pb2.GradientStats
    progress: float
    checkpoint: CheckpointEvent
    profile: bool
    profile_error: str
    profile_refused: bool
    profile_gpu: int
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[_goodput_pb2.ThroughputSample, _Mapping]]] = ..., grad: _Optional[_Union[_goodput_pb2.GradientStats, _Mapping]] = ..., progress: _Optional[float] = ..., checkpoint: _Optional[_Union[CheckpointEvent, _Mapping]] = ..., profile: _Optional[bool] = ..., profile_error: _Optional[str] = ..., profile_refused: _Optional[bool] = ..., profile_gpu: _Optional[int] = ...) -> None: ...

class DirectiveAck(_message.Message):
    __slots__ = ("directive_id", "job_id", "generation", "ok", "error", "exit")
    DIRECTIVE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    directive_id: int
    job_id: str
    generation: int
    ok: bool
    error: str
    exit: JobExit
    def __init__(self, directive_id: _Optional[int] = ..., job_id: _Optional[str] = ..., generation: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., exit: _Optional[_Union[JobExit, _Mapping]] = ...) -> None: ...

class JobExit(_message.Message):
    __slots__ = ("job_id", "generation", "kind", "progress", "message")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[JobExit.Kind]
        KIND_COMPLETED: _ClassVar[JobExit.Kind]
        KIND_CHECKPOINTED: _ClassVar[JobExit.Kind]
        KIND_FAILED: _ClassVar[JobExit.Kind]
    KIND_UNSPECIFIED: JobExit.Kind
    KIND_COMPLETED: JobExit.Kind
    KIND_CHECKPOINTED: JobExit.Kind
    KIND_FAILED: JobExit.Kind
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    kind: JobExit.Kind
    progress: float
    message: str
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., kind: _Optional[_Union[JobExit.Kind, str]] = ..., progress: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("registered", "directive", "profile", "drain", "term")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    directive: Directive
    profile: ProfileRequest
    drain: Drain
    term: int
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., directive: _Optional[_Union[Directive, _Mapping]] = ..., profile: _Optional[_Union[ProfileRequest, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., term: _Optional[int] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("controller_version", "heartbeat_interval_s", "acks_carry_exits")
    CONTROLLER_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    ACKS_CARRY_EXITS_FIELD_NUMBER: _ClassVar[int]
    controller_version: str
    heartbeat_interval_s: float
    acks_carry_exits: bool
    def __init__(self, controller_version: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., acks_carry_exits: _Optional[bool] = ...) -> None: ...

class WorldLayout(_message.Message):
    __slots__ = ("world_size", "rank_offset", "master_addr", "master_port", "nodes")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    rank_offset: int
    master_addr: str
    master_port: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, world_size: _Optional[int] = ..., rank_offset: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class Directive(_message.Message):
    __slots__ = ("round", "directive_id", "job_id", "generation", "action", "spec", "local_gpus", "world", "allocation", "checkpoint_path", "restore_progress", "job_uid")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[Directive.Action]
        ACTION_RUN: _ClassVar[Directive.Action]
        ACTION_STOP: _ClassVar[Directive.Action]
    ACTION_UNSPECIFIED: Directive.Action
    ACTION_RUN: Directive.Action
    ACTION_STOP: Directive.Action
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    JOB_UID_FIELD_NUMBER: _ClassVar[int]
    round: int
    directive_id: int
    job_id: str
    generation: int
    action: Directive.Action
    spec: _job_pb2.JobSpec
    local_gpus: _containers.RepeatedScalarFieldContainer[int]
    world: WorldLayout
    allocation: _job_pb2.Allocation
    checkpoint_path: str
    restore_progress: float
    job_uid: str
    def __init__(self, round: _Optional[int] = ..., directive_id: _Optional[int] = ..., job_id: _Optional[str] = ..., generation: _Optional[int] = ..., action: _Optional[_Union[Directive.Action, str]] = ..., spec: _Optional[_Union[_job_pb2.JobSpec, _Mapping]] = ..., local_gpus: _Optional[_Iterable[int]] = ..., world: _Optional[_Union[WorldLayout, _Mapping]] = ..., allocation: _Optional[_Union[_job_pb2.Allocation, _Mapping]] = ..., checkpoint_path: _Optional[str] = ..., restore_progress: _Optional[float] = ..., job_uid: _Optional[str] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("job_id", "generation", "spec", "local_gpu", "local_batch_sizes", "job_uid")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPU_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    JOB_UID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    spec: _job_pb2.JobSpec
    local_gpu: int
    local_batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    job_uid: str
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., spec: _Optional[_Union[_job_pb2.JobSpec, _Mapping]] = ..., local_gpu: _Optional[int] = ..., local_batch_sizes: _Optional[_Iterable[int]] = ..., job_uid: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason", "cancel")
    REASON_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    cancel: bool
    def __init__(self, reason: _Optional[str] = ..., cancel: _Optional[bool] = ...) -> None: ...
