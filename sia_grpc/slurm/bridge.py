"""`sia-slurm`: the bridge between a Slurm cluster and Sia's policy.

Every round it reads the nodes and jobs from Slurm, asks the policy for the
opted-in jobs' allocations (in this process, or over gRPC from a controller's
`PolicyService`: the same `OptimizeRequest` either way) and carries the
decisions out with Slurm's commands (`sia_grpc.slurm.translate.plan`). It keeps
nothing in memory between rounds: what it decided is in the jobs' comments, so
a restarted bridge picks up where the last one stopped (docs/slurm.md).

    sia-slurm run [--interval 30] [--once] [--controller HOST:PORT] [--policy sia]
    sia-slurm env          # in a job's batch script: the SIA_* exports of the job
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from sia_grpc.api import pb
from sia_grpc.policy.queues import QueueSet
from sia_grpc.slurm.commands import Slurm, SlurmError
from sia_grpc.slurm.reports import ReportServer
from sia_grpc.slurm.translate import (
    Action,
    SlurmJob,
    Ticket,
    build_round,
    job_environment,
    plan,
    read_jobs,
    read_nodes,
)

__all__ = ["Bridge", "RoundReport", "grpc_optimizer", "in_process_optimizer", "main"]

Optimizer = Callable[[pb.OptimizeRequest], pb.OptimizeResponse]
DEFAULT_INTERVAL_S = 30.0


def in_process_optimizer() -> Optimizer:
    """The policy service's own call, in this process."""
    from sia_grpc.controller.policy_service import optimize_request

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
    """What one round did: the actions taken, and those that failed (with why)."""

    actions: list[Action] = field(default_factory=list)
    failed: list[tuple[Action, str]] = field(default_factory=list)
    moved: dict[int, int] = field(default_factory=dict)  # old Slurm id -> new
    left_out: dict[str, str] = field(default_factory=dict)  # node -> why
    invalid: dict[str, str] = field(default_factory=dict)  # sia id -> why
    response: pb.OptimizeResponse | None = None


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
        nodes, left_out = read_nodes(self.slurm.nodes_json())
        jobs = self._record_reports(read_jobs(self.slurm.jobs_json()))
        rnd = build_round(nodes, jobs, self.clock(), policy=self.policy, params=self.params,
                          round_duration_s=self.round_duration_s, queues=self.queues,
                          queue_from=self.queue_from, left_out=left_out)
        report = RoundReport(left_out=dict(left_out), invalid=dict(rnd.invalid))
        for sia_id, why in rnd.invalid.items():
            self.log.warning("slurm.job_not_schedulable", sia_id=sia_id, reason=why)
        if not rnd.request.jobs and not rnd.stale:
            return report
        if rnd.request.jobs and not rnd.request.nodes:
            self.log.info("slurm.no_gpus_for_sia", left_out=left_out)
            return report
        response = self.optimize(rnd.request) if rnd.request.jobs else pb.OptimizeResponse()
        report.response = response
        raw = {j.job_id: j.raw for j in jobs}
        for action in plan(rnd, response):
            try:
                new = self.slurm.apply(action, raw.get(action.job_id))
            except SlurmError as err:
                self.log.warning("slurm.action_failed", kind=action.kind, job=action.job_id,
                                 error=str(err))
                report.failed.append((action, str(err)))
                continue
            report.actions.append(action)
            if new is not None:
                report.moved[action.job_id] = new
            self.log.info("slurm.action", kind=action.kind, job=action.job_id, new_job=new,
                          sia_id=action.ticket.id if action.ticket else None,
                          shape=vars(action.ticket.shape)
                          if action.ticket and action.ticket.shape else None,
                          reason=action.reason)
        return report

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
            ticket = j.ticket.observe(telemetry)
            try:
                self.slurm.note(j.job_id, ticket)
            except SlurmError as err:
                self.log.warning("slurm.report_not_recorded", job=j.job_id, error=str(err))
                continue
            updated[j.job_id] = dataclasses.replace(j, ticket=ticket)
        return [updated.get(j.job_id, j) for j in jobs]

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Rounds every `interval_s` until `stop` is set; a round that fails (Slurm
        not answering, the controller away) is logged and the next one tries again."""
        while not stop.is_set():
            try:
                self.round()
            except Exception as err:  # keep serving: the next round starts from Slurm
                self.log.exception("slurm.round_failed", error=str(err))
            stop.wait(interval_s)


def env_exports(job_id: str, jobs_json: Mapping) -> str:
    """`export SIA_...=...` lines for Slurm job `job_id` (from its ticket)."""
    for j in jobs_json.get("jobs", []):
        if str(j.get("job_id")) == job_id:
            ticket = Ticket.parse(j.get("comment") or "", int(job_id))
            if ticket is None:
                return ""
            return "".join(f"export {k}={shlex.quote(v)}\n"
                           for k, v in job_environment(ticket).items())
    return ""


def _run(args: argparse.Namespace) -> int:
    if args.controller:
        token = (Path(args.token_file).read_text().strip() if args.token_file
                 else os.environ.get("SIA_TOKEN"))
        optimize = grpc_optimizer(args.controller, token=token, ca=args.ca)
    else:
        optimize = in_process_optimizer()
    params = dict(kv.split("=", 1) for kv in args.set)
    queues = None
    if args.queues:
        try:
            with open(args.queues, "rb") as f:
                queues = QueueSet.from_mapping(tomllib.load(f))
        except (OSError, ValueError) as err:  # (TOML and field errors are ValueErrors)
            print(f"sia-slurm: --queues {args.queues}: {err}", file=sys.stderr)
            return 2
    reports = None
    if args.listen:
        if not args.worker_token_file:
            print("sia-slurm: --listen needs --worker-token-file (the workers' token)",
                  file=sys.stderr)
            return 2
        reports = ReportServer(args.listen, Path(args.worker_token_file).read_text().strip())
    bridge = Bridge(Slurm(), optimize, policy=args.policy, params=params,
                    round_duration_s=args.interval, queues=queues,
                    queue_from=args.queue_from, reports=reports)
    if args.once:
        report = bridge.round()
        if reports is not None:
            reports.stop()
        print(json.dumps({"actions": [(a.kind, a.job_id) for a in report.actions],
                          "failed": [(a.kind, a.job_id, why) for a, why in report.failed],
                          "moved": report.moved, "left_out": report.left_out,
                          "invalid": report.invalid}))
        return 1 if report.failed else 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        bridge.run(args.interval, stop)
    finally:
        if reports is not None:
            reports.stop()
    return 0


def _env(args: argparse.Namespace) -> int:
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        print("sia-slurm env: SLURM_JOB_ID is not set (run it in a Slurm job)", file=sys.stderr)
        return 2
    sys.stdout.write(env_exports(job_id, Slurm().jobs_json()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sia-slurm", description="the bridge between Slurm and Sia's policy "
                                      "(docs/slurm.md)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run rounds beside slurmctld")
    run.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                     help=f"seconds between rounds (default {DEFAULT_INTERVAL_S:g})")
    run.add_argument("--once", action="store_true",
                     help="one round, its actions printed as JSON, then exit")
    run.add_argument("--controller", metavar="HOST:PORT",
                     help="ask this controller's PolicyService (default: the policy in "
                          "this process)")
    run.add_argument("--token-file", metavar="FILE",
                     help="with --controller: file holding its bearer token (default: env "
                          "SIA_TOKEN)")
    run.add_argument("--ca", metavar="FILE",
                     help="with --controller: its CA certificate (PEM): connect with TLS")
    run.add_argument("--queues", metavar="FILE.toml",
                     help="the queues, as the controller's queues TOML (docs/operations.md, "
                          "\"Queues\"); default: none, one pool")
    run.add_argument("--queue-from", choices=("account", "partition"), default="",
                     help="with --queues: the queue of a job whose spec names none is its "
                          "Slurm account's (or partition's) name")
    run.add_argument("--listen", metavar="HOST:PORT",
                     help="serve WorkerService here for the jobs' workers to report their "
                          "step times (sia slurm submit --report-to)")
    run.add_argument("--worker-token-file", metavar="FILE",
                     help="with --listen: file holding the token the workers must send")
    run.add_argument("--policy", default="", help="the policy (default sia)")
    run.add_argument("--set", action="append", default=[], metavar="SETTING=VALUE",
                     help="a setting of the policy (sia-slurm passes it as params)")
    run.set_defaults(func=_run)
    env = sub.add_parser("env", help="print the SIA_* exports of the Slurm job this runs in")
    env.set_defaults(func=_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SlurmError as err:
        print(f"sia-slurm: {err}", file=sys.stderr)
        return 1
