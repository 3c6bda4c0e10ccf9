"""`sia-slurm`, the bridge's command line (docs/slurm.md).

    sia-slurm run [--interval 30] [--once] [--controller HOST:PORT] [--policy sia]
    sia-slurm env          # in a job's batch script: the SIA_* exports of the job

`env` runs at the start of every copy of every opted-in job, so it imports only
the standard library, the ticket and the Slurm commands; `run` imports the
bridge, with the policy, when it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import tomllib
from pathlib import Path

from sia_grpc.slurm.ticket import env_exports

__all__ = ["DEFAULT_INTERVAL_S", "build_parser", "main"]

DEFAULT_INTERVAL_S = 30.0


def _run(args: argparse.Namespace) -> int:
    from sia_grpc.policy.queues import QueueSet
    from sia_grpc.slurm.bridge import Bridge, grpc_optimizer, in_process_optimizer
    from sia_grpc.slurm.commands import Slurm
    from sia_grpc.slurm.reports import ReportServer

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
    from sia_grpc.slurm.commands import Slurm

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
    from sia_grpc.slurm.commands import SlurmError

    try:
        return args.func(args)
    except SlurmError as err:
        print(f"sia-slurm: {err}", file=sys.stderr)
        return 1
