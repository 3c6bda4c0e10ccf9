"""The rules the controller's books keep after every event (`check_invariants`), in
the manner of dask's `validate_state()`: the state-machine tests and the chaos runs
call it after each event, so a rule broken anywhere is caught where it breaks."""

from __future__ import annotations

import collections
from typing import Protocol

from sia_grpc.api import pb, state_name
from sia_grpc.controller.machine.books import DirectiveBook, JobBook, MoveBook, NodeBook
from sia_grpc.controller.machine.records import JobRec, live_rendezvous
from sia_grpc.controller.machine.transitions import REASONS, TERMINAL, WAITING


class InvariantError(AssertionError):
    """The controller's books broke a rule (`check_invariants`)."""


class Books(Protocol):
    """The books `check_invariants` reads of `ControllerState` (which calls it, so this
    module does not import it: `state` imports `invariants`, never the reverse; both
    import the books, `books.py`)."""

    job_book: JobBook
    node_book: NodeBook
    directive_book: DirectiveBook
    move_book: MoveBook


def check_invariants(self: Books) -> None:
    """Raise `InvariantError` naming the first rule the books break.

    The rules hold after every event, whatever order events arrive in; the
    state-machine tests and the chaos runs call this after each one. The
    central one: every GPU held belongs to a live job that runs or profiles on
    it, or to a STOP in flight whose acknowledgement will free it. A GPU held by
    a job that no longer exists, with nothing to free it, is a leak for ever."""
    stops = _stops(self)
    _no_run_before_register(self)
    _every_gpu_explained(self, stops)
    _one_rendezvous_per_port(self)
    active: collections.Counter[str] = collections.Counter()
    for job_id, rec in self.job_book.jobs.items():
        if rec.state not in TERMINAL:
            active[rec.job.spec.tenant] += 1
        _job_gpus(self, job_id, rec, stops)
        _job_state(self, job_id, rec)
    if +self.job_book.active_by_tenant != active:
        raise InvariantError(f"active jobs per tenant {dict(self.job_book.active_by_tenant)}, "
                             f"counted {dict(active)}")


def _stops(self: Books) -> set[tuple[str, str]]:
    """The (job, node) pairs with a STOP in flight, checked against their count."""
    due = collections.Counter((j, n) for j, n, act, _ in self.directive_book.pending.values()
                              if act == pb.Directive.ACTION_STOP)
    if due != self.directive_book.stops_due:
        raise InvariantError(f"STOPs due {dict(self.directive_book.stops_due)}, "
                             f"pending {dict(due)}")
    return set(due)


def _no_run_before_register(self: Books) -> None:
    # No GPU of a node is given out before its agent has said what runs on it
    # (`NodeRec.bookable`): a node restored from the store gets no pass and no RUN.
    for job_id, name, act, _ in self.directive_book.pending.values():
        node = self.node_book.nodes.get(name)
        if act == pb.Directive.ACTION_RUN and node is not None and node.restored:
            raise InvariantError(f"{job_id}: RUN sent to {name} before its agent registered")


def _every_gpu_explained(self: Books, stops: set[tuple[str, str]]) -> None:
    """Every GPU held belongs to a job that runs or profiles on it, or has a STOP in
    flight that frees it."""
    for node in self.node_book.nodes.values():
        if node.state == pb.NODE_STATE_LOST and node.holder:
            raise InvariantError(f"lost node {node.name} holds GPUs {node.holder}")
        for g, job_id in node.holder.items():
            if not 0 <= g < node.num_gpus:
                raise InvariantError(f"{node.name}/{g}: booked past its {node.num_gpus} GPUs")
            rec = self.job_book.jobs.get(job_id)
            explained = (job_id, node.name) in stops or rec is not None and (
                g in rec.held.get(node.name, ()) or (node.name, g) in rec.profiling.values())
            if not explained and not node.restored:
                what = "deleted" if rec is None else state_name(rec.state)
                raise InvariantError(
                    f"{node.name}/{g} held by {job_id!r} ({what}), which neither runs nor "
                    "profiles there and has no STOP in flight")


def _one_rendezvous_per_port(self: Books) -> None:
    # No two jobs' live generations rendezvous at one port of one master node: the
    # later one's rank 0 could not listen (EADDRINUSE) and the job would fail.
    ports: dict[tuple[str, int], str] = {}
    for job_id, rec in self.job_book.jobs.items():
        where = live_rendezvous(rec)
        if where is not None:
            if where in ports:
                raise InvariantError(f"{job_id} and {ports[where]} both rendezvous at "
                                     f"{where[0]}:{where[1]}")
            ports[where] = job_id


def _job_gpus(self: Books, job_id: str, rec: JobRec, stops: set[tuple[str, str]]) -> None:
    """A job's passes, holdings and stops agree with the nodes' books."""
    ended = rec.state in TERMINAL
    passes = {n for n, _ in rec.profiling.values()}
    for name, gpu in rec.profiling.values():
        node = self.node_book.nodes.get(name)
        if node is None or node.holder.get(gpu) != job_id:
            raise InvariantError(f"{job_id}: profiling on {name}/{gpu}, not booked to it")
        if node.restored:
            raise InvariantError(f"{job_id}: profiling on {name}/{gpu} before its agent "
                                 "registered")
    for name, gpus in rec.held.items():
        node = self.node_book.nodes.get(name)
        if node is None:
            raise InvariantError(f"{job_id}: holds GPUs on unknown node {name}")
        if not node.restored and any(node.holder.get(g) != job_id for g in gpus):
            raise InvariantError(f"{job_id}: holds {name}/{gpus}, booked to "
                                 f"{[node.holder.get(g) for g in gpus]}")
    for name in rec.stopping:
        if (job_id, name) not in stops:
            raise InvariantError(f"{job_id}: stopping on {name} with no STOP in flight")
    if ended and not (rec.held.keys() | passes) <= rec.stopping:
        loose = sorted((rec.held.keys() | passes) - rec.stopping)
        raise InvariantError(f"{job_id} is {state_name(rec.state)} but holds GPUs on "
                             f"{loose} not being stopped")


def _job_state(self: Books, job_id: str, rec: JobRec) -> None:
    """A job's state agrees with its profiles, its move and its reason."""
    # A job is scheduled only on types it holds a 1-GPU profile of, its own pass's
    # or an identical job's (`Profiling._reuse_profiles`).
    if rec.state in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING) and not rec.usable:
        raise InvariantError(f"{job_id}: {state_name(rec.state)} with no profiled type")
    if not rec.usable <= set(rec.estimator.known_types):
        raise InvariantError(f"{job_id}: usable on {sorted(rec.usable)}, but its estimate "
                             f"knows only {list(rec.estimator.known_types)}")
    # A job that waits holds GPUs only where it is being stopped (a fenced
    # generation's workers, freed by the STOP's ack): none runs for it.
    if rec.state in WAITING and not rec.moving and set(rec.held) - rec.stopping:
        raise InvariantError(f"{job_id}: {state_name(rec.state)} but holds GPUs on "
                             f"{sorted(set(rec.held) - rec.stopping)} not being stopped")
    if rec.moving and job_id not in self.move_book.moving:
        raise InvariantError(f"{job_id}: moving, but not in the moves to dispatch")
    if rec.state == pb.JOB_STATE_RUNNING and (rec.alloc is None or rec.moving):
        raise InvariantError(f"{job_id}: RUNNING without a settled allocation")
    if not rec.job.status.reason.startswith(REASONS.get(rec.state, ("",))):
        raise InvariantError(f"{job_id}: {state_name(rec.state)} with reason "
                             f"{rec.job.status.reason!r}")
