"""What a start or move through Slurm costs a job, as the bridge prices it for the
policy (`translate.policy_job`): the application's own restore, and Slurm's share,
measured here from the jobs' tickets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sia_grpc.api.errors import ApiError
from sia_grpc.api.validation import resolve
from sia_grpc.client.spec import spec_from_mapping
from sia_grpc.slurm.ticket import Ticket

__all__ = ["measured_share", "restore_s"]


def restore_s(spec: Mapping[str, Any]) -> float | None:
    """The application's own restore cost for a ticket's spec (its `restart_cost_s`, or
    the application's default); None for a spec that cannot be scheduled."""
    try:
        return resolve(spec_from_mapping(spec, source="spec")).restart_cost
    except (ApiError, ValueError):
        return None


def measured_share(tickets: Iterable[Ticket]) -> float:
    """What a start or move through Slurm costs beyond the application's restore, as
    measured here: the median over the jobs of their last move's end-to-end cost
    (`restart_s`), else their first start's (`launch_s`), less their own restore.
    The bridge's round, the commands, slurmctld's scheduling and slurmd's launch,
    which every job pays alike. 0 before any job has first reported."""
    shares = sorted(max(took - restore, 0.0) for t in tickets
                    if (took := t.restart_s if t.restart_s is not None else t.launch_s)
                    is not None and (restore := restore_s(t.spec)) is not None)
    return shares[len(shares) // 2] if shares else 0.0
