import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sia_grpc._proto.sia.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_JOB_SUBMITTED: _ClassVar[EventKind]
    EVENT_KIND_JOB_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_JOB_DELETED: _ClassVar[EventKind]
    EVENT_KIND_ROUND_STARTED: _ClassVar[EventKind]
    EVENT_KIND_ROUND_FINISHED: _ClassVar[EventKind]
    EVENT_KIND_NODE_REGISTERED: _ClassVar[EventKind]
    EVENT_KIND_NODE_LOST: _ClassVar[EventKind]
    EVENT_KIND_NODE_DRAINED: _ClassVar[EventKind]
    EVENT_KIND_NODE_UNDRAINED: _ClassVar[EventKind]
    EVENT_KIND_NODE_FORGOTTEN: _ClassVar[EventKind]
    EVENT_KIND_QUEUE_RECLAIM: _ClassVar[EventKind]
    EVENT_KIND_RELOAD: _ClassVar[EventKind]
    EVENT_KIND_LEADER: _ClassVar[EventKind]
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_JOB_SUBMITTED: EventKind
EVENT_KIND_JOB_CHANGED: EventKind
EVENT_KIND_JOB_DELETED: EventKind
EVENT_KIND_ROUND_STARTED: EventKind
EVENT_KIND_ROUND_FINISHED: EventKind
EVENT_KIND_NODE_REGISTERED: EventKind
EVENT_KIND_NODE_LOST: EventKind
EVENT_KIND_NODE_DRAINED: EventKind
EVENT_KIND_NODE_UNDRAINED: EventKind
EVENT_KIND_NODE_FORGOTTEN: EventKind
EVENT_KIND_QUEUE_RECLAIM: EventKind
EVENT_KIND_RELOAD: EventKind
EVENT_KIND_LEADER: EventKind

class Event(_message.Message):
    __slots__ = ("id", "term", "time", "kind", "job_id", "node", "queue", "round", "state", "reason", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    term: int
    time: _timestamp_pb2.Timestamp
    kind: EventKind
    job_id: str
    node: str
    queue: str
    round: int
    state: _job_pb2.JobState
    reason: str
    message: str
    def __init__(self, id: _Optional[int] = ..., term: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[EventKind, str]] = ..., job_id: _Optional[str] = ..., node: _Optional[str] = ..., queue: _Optional[str] = ..., round: _Optional[int] = ..., state: _Optional[_Union[_job_pb2.JobState, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class EventFilter(_message.Message):
    __slots__ = ("job_id", "node", "queue", "kinds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node: str
    queue: str
    kinds: _containers.RepeatedScalarFieldContainer[EventKind]
    def __init__(self, job_id: _Optional[str] = ..., node: _Optional[str] = ..., queue: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[EventKind, str]]] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("filter", "after_id", "limit")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    filter: EventFilter
    after_id: int
    limit: int
    def __init__(self, filter: _Optional[_Union[EventFilter, _Mapping]] = ..., after_id: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("filter", "after_id")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    filter: EventFilter
    after_id: int
    def __init__(self, filter: _Optional[_Union[EventFilter, _Mapping]] = ..., after_id: _Optional[int] = ...) -> None: ...
