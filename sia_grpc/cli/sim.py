"""`sia simulate`, `sia report`, `sia policy-settings`: the simulator's commands."""

from __future__ import annotations

import argparse
from typing import Any

from sia_grpc.cli.argparsing import UsageError, command, examples

PREFIX = "sia simulate"


def _simulate(args: argparse.Namespace) -> int:
    from sia_grpc.sim.runner import run

    if args.scale < 1 or args.jobs < 1:
        raise UsageError("--scale and --jobs must be >= 1")
    return run(args.workloads, [p.strip() for p in args.policy.split(",")], args.cluster,
               args.scale, args.jobs, args.json, args.plots, policy_config=args.policy_config,
               sets=args.sets, round_duration=args.round_duration, queues=args.queues,
               quiet=args.quiet)


def _policy_settings(args: argparse.Namespace) -> int:
    from sia_grpc.policy import params

    print(params.settings_table())
    return 0


def _report(args: argparse.Namespace) -> int:
    from sia_grpc.sim.report import write

    return write(args.json_path, args.out, args.produced_by, args.quota_free)


def add_commands(sub: Any) -> None:
    sim = command(sub, "simulate", "replay job-arrival traces against a modelled cluster",
                  _simulate, prefix=PREFIX, usage=(ValueError,))
    sim.add_argument("workloads", nargs="+", metavar="WORKLOAD_OR_DIR",
                     help="CSV files, directories of them, or shipped workloads "
                          "(saturn, philly, newtrace, saturn/workload-1, ...)")
    sim.add_argument("--policy", default="sia",
                     help="sia, pollux, gavel, fifo, sia-partitioned, sia-plus, or several "
                          "separated by commas")
    sim.add_argument("--cluster", default="hetero64",
                     help="hetero64, homo64, or a cluster TOML file (default hetero64)")
    sim.add_argument("--scale", type=int, default=1, help="multiply the cluster's nodes")
    sim.add_argument("--jobs", type=int, default=2, metavar="N",
                     help="simulations to run in parallel processes (default 2)")
    sim.add_argument("--json", metavar="OUT", help="write per-run metrics as JSON")
    sim.add_argument("--plots", metavar="DIR", help="write PNG plots to DIR")
    sim.add_argument("--policy-config", metavar="FILE.toml",
                     help="policy settings: [policy.<name>] tables, as in the controller's "
                          "TOML (tables of policies not run are ignored)")
    sim.add_argument("--set", dest="sets", action="append", default=[],
                     metavar="POLICY.SETTING=VALUE[,VALUE...]",
                     help="a policy setting over --policy-config, e.g. sia.p=-1 (repeatable); "
                          "several values run one variant each, labelled sia(p=-1), ...; "
                          "`sia policy-settings` lists the settings")
    sim.add_argument("--round-duration", type=float, metavar="SECONDS",
                     help="the rounds' length for every policy (default: each policy's "
                          "own: 60 s, Gavel 360 s)")

    sim.add_argument("--queues", metavar="QUEUES.toml",
                     help="queues for every policy: [[queue]] tables (guarantees, borrowing "
                          "limits), priority classes, and an [assignment] rule for jobs "
                          "whose trace names no queue (sia_grpc/data/queues/three-queues.toml"
                          "); the JSON then has metrics.queues.<name>")
    sim.add_argument("-q", "--quiet", action="store_true",
                     help="no progress on stderr (bars on a terminal, else a line per run "
                          "at most every 30 s, and one as each run ends): only the table")
    examples(sim, ("sia simulate saturn/workload-1", "one shipped workload, Sia alone"),
             ("sia simulate philly saturn --policy sia,pollux,gavel --json results.json",
              "policies side by side"),
             ("sia simulate saturn --set sia.p=-1,-0.5 --cluster homo64", "two variants"),
             ("sia simulate saturn --queues sia_grpc/data/queues/three-queues.toml", "with "
              "queues"))

    command(sub, "policy-settings", "each policy's settings, defaults and help "
                                    "([policy.<name>], --set, --policy-set)", _policy_settings)

    rep = command(sub, "report", "simulate --json output as markdown beside the paper",
                  _report)
    rep.add_argument("json_path", metavar="RESULTS.json", help="what 'sia simulate --json' wrote")
    rep.add_argument("--out", metavar="FILE.md", help="write here instead of stdout")
    rep.add_argument("--produced-by", default="", metavar="CMD",
                     help="the command that produced the JSON, quoted in the report")
    rep.add_argument("--quota-free", metavar="RESULTS.json",
                     help="runs of sia without --queues, for the queues' targets table: per "
                          "workload, sia with queues against sia-partitioned and quota-free sia")
