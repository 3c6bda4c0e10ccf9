"""Job states and the changes between them, as a table: a state changes only along
it (`set_state` raises `IllegalTransition` otherwise, as dask's worker state
machine does), and a job's reason always matches its state (`REASONS`)."""

from __future__ import annotations

from typing import Protocol

from sia_grpc.api import TERMINAL_STATES, pb, state_name
from sia_grpc.controller.machine.events import Action, Persist

TERMINAL = TERMINAL_STATES
WAITING = frozenset({pb.JOB_STATE_PROFILING, pb.JOB_STATE_QUEUED})  # not yet started

_Q, _P, _RUN, _RS = (pb.JOB_STATE_QUEUED, pb.JOB_STATE_PROFILING, pb.JOB_STATE_RUNNING,
                     pb.JOB_STATE_RESTARTING)
_ENDS = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})

# state -> the states it may change to (itself: a new reason). A job accepted is
# PROFILING (one GPU of each type for a short pass); profiled, it waits QUEUED; a
# RUN makes it RUNNING; a move, resize or preemption is RESTARTING until its old
# workers have stopped; requeued, it is QUEUED again. An ended job never changes.
TRANSITIONS: dict[int, frozenset[int]] = {
    pb.JOB_STATE_UNSPECIFIED: frozenset({_P, _Q}),
    _P: frozenset({_P, _Q}) | _ENDS,
    _Q: frozenset({_Q, _RUN}) | _ENDS,
    _RUN: frozenset({_RUN, _RS, _Q}) | _ENDS,
    _RS: frozenset({_RS, _RUN, _Q}) | _ENDS,
    **dict.fromkeys(_ENDS, frozenset()),
}

# What a job's reason may begin with in each state (checked by `check_invariants`).
REASONS: dict[int, tuple[str, ...]] = {
    pb.JOB_STATE_QUEUED: ("accepted", "waiting: ", "requeued: ", "preempted", "starting: "),
    pb.JOB_STATE_PROFILING: ("waiting: ",),
    pb.JOB_STATE_RESTARTING: ("checkpointing: ",),
    pb.JOB_STATE_RUNNING: ("started on ", "kept ", "scaled ", "moved ", "repacked ", "running"),
    pb.JOB_STATE_SUCCEEDED: ("completed",),
    pb.JOB_STATE_FAILED: ("failed: ",),
    pb.JOB_STATE_CANCELLED: ("cancelled",),
}


class IllegalTransition(AssertionError):
    """A job's state was to change along no edge of `TRANSITIONS`: a bug."""


class _Record(Protocol):
    """What `set_state` changes: a record holding a job (a `records.JobRec`)."""

    job: pb.Job


# A job as it is accepted (stored by CreateJob, then taken by the state machine): it
# profiles first.
SUBMITTED = (pb.JOB_STATE_PROFILING, "waiting: profiling on each GPU type")

def set_state(rec: _Record, state: pb.JobState, at: float, reason: str) -> None:
    """Change `rec`'s state (and reason, update time) along the table."""
    st = rec.job.status
    if state not in TRANSITIONS.get(st.state, frozenset()):
        raise IllegalTransition(f"{rec.job.job_id}: {state_name(st.state)} -> "
                                f"{state_name(state)} ({reason!r})")
    st.state = state
    st.reason = reason
    st.update_time.FromNanoseconds(int(at * 1e9))


def set_reason(rec: _Record, reason: str, out: list[Action]) -> None:
    """Change `rec`'s reason, its state unchanged. The reason is part of the job's
    record: a change is saved and published like every other field (a Persist, and
    so the job's JOB_CHANGED event), never made in memory only, where `sia get` would
    show it and `sia watch`, the dashboard and the history would not."""
    if rec.job.status.reason != reason:
        rec.job.status.reason = reason
        out.append(Persist((rec.job.job_id,)))
