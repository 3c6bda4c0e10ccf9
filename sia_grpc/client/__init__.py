"""Talking to a Sia controller: the SDK (`SiaClient`, `AsyncSiaClient`) and job spec files."""

from sia_grpc.api import JobState
from sia_grpc.client.sdk import (
    DEFAULT_TARGET,
    TERMINAL_STATES,
    AsyncJobHandle,
    AsyncSiaClient,
    Backoff,
    JobHandle,
    JobView,
    SiaClient,
    StatusView,
    is_terminal,
)
from sia_grpc.client.spec import SpecError, load_spec, spec_from_mapping, spec_to_mapping

__all__ = [
    "DEFAULT_TARGET",
    "TERMINAL_STATES",
    "AsyncJobHandle",
    "AsyncSiaClient",
    "Backoff",
    "JobHandle",
    "JobState",
    "JobView",
    "SiaClient",
    "StatusView",
    "SpecError",
    "is_terminal",
    "load_spec",
    "spec_from_mapping",
    "spec_to_mapping",
]
