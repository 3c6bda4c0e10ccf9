from sia_grpc._proto.sia.v1 import agent_service_pb2 as _agent_service_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OomEvent(_message.Message):
    __slots__ = ("atomic_batch_size", "message")
    ATOMIC_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    atomic_batch_size: int
    message: str
    def __init__(self, atomic_batch_size: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("telemetry", "rank", "oom", "startup_s")
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OOM_FIELD_NUMBER: _ClassVar[int]
    STARTUP_S_FIELD_NUMBER: _ClassVar[int]
    telemetry: _agent_service_pb2.Telemetry
    rank: int
    oom: OomEvent
    startup_s: float
    def __init__(self, telemetry: _Optional[_Union[_agent_service_pb2.Telemetry, _Mapping]] = ..., rank: _Optional[int] = ..., oom: _Optional[_Union[OomEvent, _Mapping]] = ..., startup_s: _Optional[float] = ...) -> None: ...

class WorkerReply(_message.Message):
    __slots__ = ("batch_size", "atomic_batch_size", "accum_steps", "current")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ATOMIC_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    atomic_batch_size: int
    accum_steps: int
    current: bool
    def __init__(self, batch_size: _Optional[int] = ..., atomic_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., current: _Optional[bool] = ...) -> None: ...
