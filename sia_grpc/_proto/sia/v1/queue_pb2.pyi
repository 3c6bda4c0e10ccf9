from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueSpec(_message.Message):
    __slots__ = ("name", "tenants", "guarantee", "guarantee_units", "borrow_limit", "min_runtime_s")
    class GuaranteeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BorrowLimitEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_UNITS_FIELD_NUMBER: _ClassVar[int]
    BORROW_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenants: _containers.RepeatedScalarFieldContainer[str]
    guarantee: _containers.ScalarMap[str, int]
    guarantee_units: float
    borrow_limit: _containers.ScalarMap[str, int]
    min_runtime_s: float
    def __init__(self, name: _Optional[str] = ..., tenants: _Optional[_Iterable[str]] = ..., guarantee: _Optional[_Mapping[str, int]] = ..., guarantee_units: _Optional[float] = ..., borrow_limit: _Optional[_Mapping[str, int]] = ..., min_runtime_s: _Optional[float] = ...) -> None: ...

class PriorityClassSpec(_message.Message):
    __slots__ = ("name", "weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class QueueConfig(_message.Message):
    __slots__ = ("queue", "priority_class", "default_priority", "unit_weights", "min_runtime_s", "max_restarts_per_round")
    class UnitWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    UNIT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    MIN_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    queue: _containers.RepeatedCompositeFieldContainer[QueueSpec]
    priority_class: _containers.RepeatedCompositeFieldContainer[PriorityClassSpec]
    default_priority: str
    unit_weights: _containers.ScalarMap[str, float]
    min_runtime_s: float
    max_restarts_per_round: int
    def __init__(self, queue: _Optional[_Iterable[_Union[QueueSpec, _Mapping]]] = ..., priority_class: _Optional[_Iterable[_Union[PriorityClassSpec, _Mapping]]] = ..., default_priority: _Optional[str] = ..., unit_weights: _Optional[_Mapping[str, float]] = ..., min_runtime_s: _Optional[float] = ..., max_restarts_per_round: _Optional[int] = ...) -> None: ...

class QueueUsage(_message.Message):
    __slots__ = ("queue", "gpus")
    class GpusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    gpus: _containers.ScalarMap[str, int]
    def __init__(self, queue: _Optional[str] = ..., gpus: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SideRow(_message.Message):
    __slots__ = ("name", "activity", "bound", "binding")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    name: str
    activity: float
    bound: float
    binding: bool
    def __init__(self, name: _Optional[str] = ..., activity: _Optional[float] = ..., bound: _Optional[float] = ..., binding: _Optional[bool] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("spec", "held", "borrowed", "held_units", "pending_jobs", "running_jobs")
    class HeldEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BorrowedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    HELD_UNITS_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    spec: QueueSpec
    held: _containers.ScalarMap[str, int]
    borrowed: _containers.ScalarMap[str, int]
    held_units: float
    pending_jobs: int
    running_jobs: int
    def __init__(self, spec: _Optional[_Union[QueueSpec, _Mapping]] = ..., held: _Optional[_Mapping[str, int]] = ..., borrowed: _Optional[_Mapping[str, int]] = ..., held_units: _Optional[float] = ..., pending_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ...) -> None: ...
