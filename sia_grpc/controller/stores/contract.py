"""What every store back-end promises the controller: the `JobStore` protocol, its
errors and its records. The SQLite and PostgreSQL stores implement it with one
shared body of SQL (`sql.py`), so their semantics cannot drift apart.

Semantics, on both back-ends:

- Every mutating call is one transaction that has committed when the call returns;
  a failure raises `StoreError` (or a subclass) and commits nothing.
- Every job change takes the next store revision and appends (revision, kind, job)
  to the changelog (`events_since`), trimmed by `compact` (`Compacted` for a resume
  from before the trimmed range).
- The cluster's event history (`pb.Event`): each event takes the next event id (a
  sequence of its own, beside the revisions), in the transaction of the change it
  describes (`create_jobs` records each new job's JOB_SUBMITTED, `delete_job` its
  JOB_DELETED, `put_jobs` the events given with the jobs), so ids order the
  history and are never reused (a deposed writer is fenced); `cluster_events`
  reads them (the newest, or those after an id), trimmed by `compact` with the
  changelog (`Compacted` for a resume from before).
- `create_jobs` is idempotent per request_id; page tokens are opaque and survive
  the deletion of the job they point at; published rounds are kept, the newest
  `rounds_limit`; drains are kept.
- The lease (one row per name): a holder, a term that only ever grows, and an
  expiry computed by the database's clock (never compare two machines' clocks). A
  store `fence`d at a term conditions every write transaction on that lease still
  being held at that term, checked inside the same transaction: a deposed writer
  gets `Fenced` and nothing is written; a new leader ends the transactions another
  controller still holds open (`end_deposed`), whose locks would hold its writes
  until that one's commit was refused. Its holder may raise the term as it releases
  the lease (`release(..., raise_to=H)`: after a restore, the row's term is below
  terms already led), never lower it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from sia_grpc.api import pb

# Both back-ends share the version numbers and what each version brought.
SCHEMA_VERSION = 5

LEASE = "controller"  # the lease the controllers elect their leader with
MAX_TERM = 2**63 - 1  # the largest term both databases' integers hold


class StoreError(Exception):
    """The store could not do what was asked; the server maps it to UNAVAILABLE."""


class JobExists(StoreError):
    """The job_id is already taken (by a different request)."""


class RequestConflict(StoreError):
    """The request_id was already used with a different spec."""


class NotFound(StoreError):
    """No job with that job_id."""


class Compacted(StoreError):
    """The changelog after the requested revision was already dropped."""


class Fenced(StoreError):
    """This store is fenced at a term whose lease is no longer held (another holder
    took it, or it expired): a deposed writer. Nothing was written."""


@dataclass(frozen=True)
class StoredJob:
    job: pb.Job  # with job.revision set
    extra: bytes  # controller-owned blob (b"" if never set)


@dataclass(frozen=True)
class EventQuery:
    """Which events `cluster_events` returns: those matching every non-empty field
    (`kinds`: any of them); `tenant`: only events of that tenant's jobs, and those
    about no job (rounds, nodes, the controllers)."""

    job_id: str = ""
    node: str = ""
    queue: str = ""
    kinds: tuple[int, ...] = ()
    tenant: str = ""


class Lease(NamedTuple):
    """Who holds a lease now: `expires_in_s` by the database's clock."""
    holder: str
    address: str  # where the holder serves, for a standby to name the leader
    term: int
    expires_in_s: float


class JobStore(Protocol):
    """The store contract (see the module docstring for the semantics)."""

    changelog_limit: int
    rounds_limit: int

    @property
    def revision(self) -> int: ...
    def create_jobs(self, items: Sequence[tuple[pb.Job, str]], *, term: int = 0
                    ) -> list[tuple[pb.Job, bool] | StoreError]: ...
    def put_jobs(self, items: Sequence[tuple[pb.Job, bytes | None]],
                 events: Sequence[pb.Event] = (), rounds: Sequence[pb.Round] = ()
                 ) -> list[int]: ...
    def delete_job(self, job_id: str, *, term: int = 0, at: float = 0.0) -> int: ...
    def compact(self) -> int: ...
    def set_drain(self, node: str, reason: str | None) -> None: ...
    def drains(self) -> dict[str, str]: ...
    def rounds(self, limit: int | None = None) -> list[pb.Round]: ...
    def get_job(self, job_id: str) -> StoredJob | None: ...
    def all_jobs(self) -> list[StoredJob]: ...
    def list_jobs(self, *, states: Collection[int] = (), tenant: str = "",
                  page_size: int = 100, page_token: str = "") -> tuple[list[pb.Job], str]: ...
    def events_since(self, revision: int, limit: int = 1000
                     ) -> list[tuple[int, int, pb.Job]]: ...
    def cluster_events(self, where: EventQuery, after_id: int = 0, limit: int = 100, *,
                       newest: bool = False) -> list[pb.Event]: ...
    def try_acquire(self, holder: str, ttl_s: float, *, address: str = "",
                    name: str = LEASE) -> int | None: ...
    def renew(self, holder: str, term: int, ttl_s: float, *, name: str = LEASE) -> bool: ...
    def release(self, holder: str, term: int, *, raise_to: int = 0,
                name: str = LEASE) -> bool: ...
    def leader(self, *, name: str = LEASE) -> Lease | None: ...
    def fence(self, term: int | None, *, name: str = LEASE) -> None: ...
    def end_deposed(self) -> int: ...
    def close(self) -> None: ...


def job_event(job: pb.Job, kind: pb.EventKind, term: int, message: str) -> pb.Event:
    """An event about `job`: its state and reason now, at its last update."""
    return pb.Event(kind=kind, term=term, job_id=job.job_id, queue=job.spec.queue,
                    state=job.status.state, reason=job.status.reason, message=message,
                    time=job.status.update_time)
