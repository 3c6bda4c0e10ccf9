"""The controller's own checks of a submission: a job id, and the queue a job may
enter (its tenant's and its token's); and the batch sizes a profiling pass tries.
What a `JobSpec` itself means (`resolve`: its checks and defaults) is the contract's,
`api/validation.py`.

Every rule raises an `ApiError` naming the field, never a crash or a silent default.
"""

from __future__ import annotations

from sia_grpc.api import pb
from sia_grpc.api.convert import queue_of
from sia_grpc.api.errors import invalid, permission_denied
from sia_grpc.names import MAX_ID, is_name
from sia_grpc.policy.queues import DEFAULT_QUEUE, QueueSet


def check_job_id(job_id: str, field: str = "job_id") -> None:
    if not is_name(job_id, MAX_ID):
        raise invalid(field, f"{job_id!r} is not a valid id ([A-Za-z0-9._-], 1 to 63 characters, "
                             "starting with a letter or digit)")


def admit_to_queue(spec: pb.JobSpec, queues: QueueSet, bound: tuple[str, ...] = (),
                   path: str = "spec") -> None:
    """Check a new job's queue and priority class against the queues in force, and that
    its tenant may use the queue, and the caller's token too (`bound`: the queues the
    token is bound to; empty: any). A spec naming no queue goes to the token's first
    bound queue (set in `spec`), else to `default`. Unknown names are INVALID_ARGUMENT
    naming the field; a queue refused is PERMISSION_DENIED (reason QUEUE_DENIED)."""
    if not spec.queue and bound:
        spec.queue = bound[0]
    name = spec.queue or DEFAULT_QUEUE
    queue = queue_of(queues, name, spec.priority, path)
    if not queue.admits(spec.tenant):
        raise permission_denied(
            f"{path}.queue: queue {name!r} does not admit tenant {spec.tenant!r} (it admits "
            f"{', '.join(sorted(queue.tenants))})", "QUEUE_DENIED")
    if bound and name not in bound:
        raise permission_denied(
            f"{path}.queue: this token may submit only to queue{'s' if len(bound) > 1 else ''} "
            f"{', '.join(bound)}, not {name!r}", "QUEUE_DENIED")


def profile_batch_sizes(lo: int, hi: int, count: int = 10) -> list[int]:
    """The ~`count` geometrically spaced micro-batch sizes a profiling pass tries."""
    if hi <= lo:
        return [lo]
    ratio = (hi / lo) ** (1 / max(count - 1, 1))
    return sorted({min(hi, max(lo, round(lo * ratio**k))) for k in range(count)})
