"""What the SDK's calls return: jobs as `JobView`s, whose states are `JobState`s."""

from __future__ import annotations

from typing import Any

from sia_grpc.api import TERMINAL_STATES, JobState, job_state, pb, state_name


def is_terminal(job: pb.Job | JobView) -> bool:
    """Whether the job has finished for good (SUCCEEDED, FAILED or CANCELLED)."""
    return job.status.state in TERMINAL_STATES


class _View:
    """Read-only access to a message's fields; `.proto` is the message itself."""

    __slots__ = ("proto",)

    def __init__(self, proto: Any) -> None:
        object.__setattr__(self, "proto", proto)

    def __getattr__(self, name: str) -> Any:
        if name == "proto":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.proto, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only; change .proto instead")

    def __eq__(self, other: object) -> bool:
        return self.proto == (other.proto if isinstance(other, _View) else other)

    # As the messages: mutable, unhashable.
    __hash__ = None  # type: ignore[assignment]


class StatusView(_View):
    """A `pb.JobStatus` whose `state` is a `JobState` ("RUNNING" when printed)."""

    __slots__ = ()

    @property
    def state(self) -> JobState | int:
        return job_state(self.proto.state)

    def __repr__(self) -> str:
        return f"StatusView(state={state_name(self.proto.state)})"


class JobView(_View):
    """A `pb.Job` as the SDK returns it: every field of the message, with
    `status.state` (and the shortcut `state`) a `JobState`, so `print(job.state)`
    shows "RUNNING" and `job.state == pb.JOB_STATE_RUNNING` holds. Where a `pb.Job`
    itself is needed (a message field, `CopyFrom`), pass `job.proto`."""

    __slots__ = ()

    @property
    def status(self) -> StatusView:
        return StatusView(self.proto.status)

    @property
    def state(self) -> JobState | int:
        return job_state(self.proto.status.state)

    def __repr__(self) -> str:
        return f"JobView({self.proto.job_id!r}, state={state_name(self.proto.status.state)})"
