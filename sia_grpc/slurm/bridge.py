"""The bridge between a Slurm cluster and Sia's policy (`sia-slurm run`).

Every round it reads the nodes and jobs from Slurm, asks the policy for the
opted-in jobs' allocations (in this process, or over gRPC from a controller's
`PolicyService`: the same `OptimizeRequest` either way) and carries the
decisions out with Slurm's commands (`sia_grpc.slurm.translate.plan`). It keeps
nothing in memory between rounds: what it decided is in the jobs' comments, so
a restarted bridge picks up where the last one stopped (docs/slurm.md). The
command line is `sia_grpc.slurm.cli`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from sia_grpc.api import pb
from sia_grpc.policy.queues import QueueSet
from sia_grpc.slurm.commands import JobEnded, Slurm, SlurmError
from sia_grpc.slurm.reports import ReportServer
from sia_grpc.slurm.ticket import Ticket
from sia_grpc.slurm.translate import (
    Action,
    SlurmJob,
    SlurmNode,
    build_round,
    plan,
    read_jobs,
    read_nodes,
)

__all__ = ["Bridge", "RoundReport", "grpc_optimizer", "in_process_optimizer"]

Optimizer = Callable[[pb.OptimizeRequest], pb.OptimizeResponse]


def in_process_optimizer() -> Optimizer:
    """The policy service's own call, in this process."""
    from sia_grpc.api.optimize import optimize_request

    return optimize_request


def grpc_optimizer(target: str, *, token: str | None = None, ca: str | None = None,
                   timeout_s: float = 60.0) -> Optimizer:
    """`PolicyService.Optimize` on the controller (or policy server) at `target`:
    with `ca` (a CA certificate file) over TLS, with `token` as its bearer token."""
    import grpc

    from sia_grpc.api import PolicyServiceStub

    if ca:
        from sia_grpc.security.tls import channel_credentials

        channel = grpc.secure_channel(target, channel_credentials(ca))
    else:
        channel = grpc.insecure_channel(target)
    stub = PolicyServiceStub(channel)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return lambda request: stub.Optimize(request, timeout=timeout_s, metadata=metadata)


@dataclass
class RoundReport:
    """What one round did: the actions taken, those that failed (with why), and the
    moves left undone because the job had ended since the round read it; and when
    (the time.time() clock, for the bench's breakdown of a move's seconds) it read
    Slurm and carried out each action (Slurm job id ->
    (first command's start, last command's end); a move's last is the old job's
    scancel)."""

    actions: list[Action] = field(default_factory=list)
    failed: list[tuple[Action, str]] = field(default_factory=list)
    skipped: list[Action] = field(default_factory=list)  # moves of jobs that had ended
    moved: dict[int, int] = field(default_factory=dict)  # old Slurm id -> new
    left_out: dict[str, str] = field(default_factory=dict)  # node -> why
    invalid: dict[str, str] = field(default_factory=dict)  # sia id -> why
    response: pb.OptimizeResponse | None = None
    read_at: float = 0.0
    applied: dict[int, tuple[float, float]] = field(default_factory=dict)


class Bridge:
    def __init__(self, slurm: Slurm, optimize: Optimizer, *, policy: str = "",
                 params: Mapping[str, str] | None = None, round_duration_s: float = 0.0,
                 queues: QueueSet | None = None, queue_from: str = "",
                 reports: ReportServer | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.slurm, self.optimize = slurm, optimize
        self.policy, self.params = policy, dict(params or {})
        self.queues, self.queue_from = queues, queue_from
        self.reports = reports
        self.round_duration_s = round_duration_s
        self.clock = clock
        self.log = structlog.get_logger("sia_grpc.slurm")

    def round(self) -> RoundReport:
        """One round: read, decide, apply. A failed Slurm command is logged and
        reported; the others still run (the next round sees what came of it)."""
        read_at = time.time()
        nodes, left_out = read_nodes(self.slurm.nodes_json())
        jobs = self._record_reports(read_jobs(self.slurm.jobs_json()))
        report = RoundReport(left_out=dict(left_out), read_at=read_at)
        try:
            self._decide(nodes, jobs, report)
        finally:  # (whatever came of the round, the workers' replies carry their batches)
            self._tell_batches(jobs, [a for a in report.actions if a.kind == "rebatch"])
        return report

    def _decide(self, nodes: Sequence[SlurmNode], jobs: list[SlurmJob],
                report: RoundReport) -> None:
        """Ask the policy for the round's allocations and carry them out into `report`."""
        rnd = build_round(nodes, jobs, self.clock(), policy=self.policy, params=self.params,
                          round_duration_s=self.round_duration_s, queues=self.queues,
                          queue_from=self.queue_from, left_out=report.left_out)
        report.invalid = dict(rnd.invalid)
        for sia_id, why in rnd.invalid.items():
            self.log.warning("slurm.job_not_schedulable", sia_id=sia_id, reason=why)
        if not rnd.request.jobs and not rnd.stale:
            return
        if rnd.request.jobs and not rnd.request.nodes:
            self.log.info("slurm.no_gpus_for_sia", left_out=report.left_out)
            return
        response = self.optimize(rnd.request) if rnd.request.jobs else pb.OptimizeResponse()
        report.response = response
        self._apply(plan(rnd, response), {j.job_id: j.raw for j in jobs}, report)

    def _tell_batches(self, jobs: list[SlurmJob], rebatched: Sequence[Action] = ()) -> None:
        """Give the WorkerService each running job's batch, as its newest copy's
        ticket holds it (`rebatched`: those this round changed), for the replies to
        its workers."""
        if self.reports is None:
            return
        tickets = {j.ticket.id: j.ticket for j in sorted(jobs, key=lambda j: j.job_id)
                   if j.ticket is not None and j.holding}
        tickets.update((a.ticket.id, a.ticket) for a in rebatched if a.ticket is not None)
        self.reports.set_batches({sia_id: (t.moves, t.shape.batch)
                                  for sia_id, t in tickets.items() if t.shape is not None})

    def _apply(self, actions: list[Action], raw: Mapping[int, Mapping],
               report: RoundReport) -> None:
        """Carry `actions` out in two passes: first every copy, start and release,
        then every cancel (the old jobs of the moves, older copies). slurmctld starts
        pending jobs on a timer (once a second, after `batch_sched_delay`) but at once
        when a job ends, so every job this round gave GPUs is pending by the time the
        first old copy ends and frees them (docs/slurm.md, "Where a move's seconds
        go")."""
        cancels: list[tuple[Action, int | None, float]] = []
        for action in actions:
            started = time.time()
            if action.kind == "cancel":
                cancels.append((action, None, started))
                continue
            try:
                new = (self.slurm.copy(action, raw.get(action.job_id))
                       if action.kind == "move" else self.slurm.apply(action))
            except JobEnded as err:  # finished since the round read it: nothing to do
                self.log.info("slurm.move_skipped", job=action.job_id, reason=str(err))
                report.skipped.append(action)
                continue
            except SlurmError as err:
                self._failed(action, err, report)
                continue
            if action.kind == "move":
                cancels.append((action, new, started))
            else:
                self._done(action, None, started, report)
        for action, new, started in cancels:
            try:
                if new is None:
                    self.slurm.cancel(action.job_id)
                else:
                    self.slurm.end_move(action, new)
            except JobEnded as err:  # its owner cancelled it, or it finished, meanwhile
                self.log.info("slurm.move_undone", job=action.job_id, new_job=new,
                              reason=str(err))
                report.skipped.append(action)
                continue
            except SlurmError as err:  # (a move's copy is in: the next round cancels
                self._failed(action, err, report)  # the older of the two)
                continue
            self._done(action, new, started, report)

    def _failed(self, action: Action, err: SlurmError, report: RoundReport) -> None:
        self.log.warning("slurm.action_failed", kind=action.kind, job=action.job_id,
                         error=str(err))
        report.failed.append((action, str(err)))

    def _done(self, action: Action, new: int | None, started: float,
              report: RoundReport) -> None:
        report.actions.append(action)
        report.applied[action.job_id] = (started, time.time())
        if new is not None:
            report.moved[action.job_id] = new
        self.log.info("slurm.action", kind=action.kind, job=action.job_id, new_job=new,
                      sia_id=action.ticket.id if action.ticket else None,
                      shape=vars(action.ticket.shape)
                      if action.ticket and action.ticket.shape else None,
                      reason=action.reason)

    def _record_reports(self, jobs: list[SlurmJob]) -> list[SlurmJob]:
        """`jobs` with what the workers reported since the last round written into
        their tickets, in Slurm (the newest copy of each sia job)."""
        reported = self.reports.take() if self.reports is not None else {}
        carriers = {j.ticket.id: j for j in sorted(jobs, key=lambda j: j.job_id) if j.ticket}
        updated: dict[int, SlurmJob] = {}
        for sia_id, telemetry in reported.items():
            j = carriers.get(sia_id)
            if j is None:
                continue  # it has ended
            assert j.ticket is not None  # (a carrier's)
            ticket = self._measure_restart(j.ticket.observe(telemetry), telemetry.generation)
            try:
                self.slurm.note(j.job_id, ticket)
            except SlurmError as err:
                self.log.warning("slurm.report_not_recorded", job=j.job_id, error=str(err))
                continue
            updated[j.job_id] = dataclasses.replace(j, ticket=ticket)
        return [updated.get(j.job_id, j) for j in jobs]

    def _measure_restart(self, ticket: Ticket, generation: int) -> Ticket:
        """`ticket` with its restart cost measured, once its copy (of `generation`)
        has reported: from the moment the bridge gave the copy its shape to its first
        report (sia_grpc.train's rank 0 reports at its first step), for a copy that
        resumed a job that had run (moves > 0). That is what the move cost the job
        end to end, the old copy's checkpoint and Slurm's launch included, which the
        workers' own start-up time leaves out. For its first start the same span is
        `launch_s` (no old copy to stop: Slurm's share, known before any move is).
        The copy has run since that report (`running_since`, its run time)."""
        if ticket.placed is None or generation != ticket.moves:
            return ticket
        assert self.reports is not None  # (what reported)
        first = self.reports.first_report(ticket.id, generation)
        if first is None:
            return ticket
        took = max(first - ticket.placed, 0.0)
        if ticket.moves == 0:  # its first start: Slurm's share, measured before any move
            return dataclasses.replace(ticket, placed=None, launch_s=took, running_since=first)
        return dataclasses.replace(ticket, placed=None, restart_s=took, running_since=first)

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Rounds every `interval_s` until `stop` is set; a round that fails (Slurm
        not answering, the controller away) is logged and the next one tries again."""
        while not stop.is_set():
            try:
                self.round()
            except Exception as err:  # keep serving: the next round starts from Slurm
                self.log.exception("slurm.round_failed", error=str(err))
            stop.wait(interval_s)
