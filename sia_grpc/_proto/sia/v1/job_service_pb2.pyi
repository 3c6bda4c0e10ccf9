from sia_grpc._proto.sia.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateJobRequest(_message.Message):
    __slots__ = ("spec", "job_id", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: _job_pb2.JobSpec
    job_id: str
    request_id: str
    def __init__(self, spec: _Optional[_Union[_job_pb2.JobSpec, _Mapping]] = ..., job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states", "tenant")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[_job_pb2.JobState]
    tenant: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_job_pb2.JobState, str]]] = ..., tenant: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_job_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("since_revision", "job_id")
    SINCE_REVISION_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    since_revision: int
    job_id: str
    def __init__(self, since_revision: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("kind", "revision", "job")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[JobEvent.Kind]
        KIND_SNAPSHOT: _ClassVar[JobEvent.Kind]
        KIND_CREATED: _ClassVar[JobEvent.Kind]
        KIND_UPDATED: _ClassVar[JobEvent.Kind]
        KIND_DELETED: _ClassVar[JobEvent.Kind]
    KIND_UNSPECIFIED: JobEvent.Kind
    KIND_SNAPSHOT: JobEvent.Kind
    KIND_CREATED: JobEvent.Kind
    KIND_UPDATED: JobEvent.Kind
    KIND_DELETED: JobEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    kind: JobEvent.Kind
    revision: int
    job: _job_pb2.Job
    def __init__(self, kind: _Optional[_Union[JobEvent.Kind, str]] = ..., revision: _Optional[int] = ..., job: _Optional[_Union[_job_pb2.Job, _Mapping]] = ...) -> None: ...
