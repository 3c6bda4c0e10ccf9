"""The `sia` command line."""

from __future__ import annotations

import argparse
import sys

from sia_grpc import __version__
from sia_grpc.argparsing import subcommand


def _scales(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scales: expected e.g. 1,8,32 — got {text!r}") from None
    if not out or any(s < 1 for s in out):
        raise argparse.ArgumentTypeError("--scales: each scale must be a positive integer")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The whole `sia` command line (every subcommand registered)."""
    parser = argparse.ArgumentParser(
        prog="sia", description="sia-grpc: the Sia scheduler's command line ('sia COMMAND "
                                "--help' for each command)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = subcommand(sub, "demo", "real PyTorch jobs scheduled by a live controller and "
                                   "two emulated-GPU agents (--modeled: modeled agents "
                                   "running a trace; --offline: policy rounds only)")
    mode = demo.add_mutually_exclusive_group()
    mode.add_argument("--modeled", action="store_true",
                      help="modeled agents of three GPU types running a small trace, "
                           "faster than real time")
    mode.add_argument("--offline", action="store_true",
                      help="only solve Sia rounds on the paper's 64-GPU cluster, no services")
    demo.add_argument("--keep", metavar="DIR",
                      help="real training: keep the work files (logs, checkpoints) in DIR")
    demo.add_argument("--time-scale", type=float, default=120.0,
                      help="modeled: cluster seconds per real second (default 120)")
    demo.add_argument("--jobs", type=int, default=16, help="offline: sample jobs (default 16)")
    demo.add_argument("--rounds", type=int, default=4, help="offline: rounds (default 4)")
    demo.add_argument("--seed", type=int, default=1)

    sim = subcommand(sub, "simulate", "replay job-arrival traces against a modelled cluster")
    sim.add_argument("workloads", nargs="+", metavar="WORKLOAD_OR_DIR",
                     help="CSV files, directories of them, or shipped workloads "
                          "(saturn, philly, newtrace, saturn/workload-1, ...)")
    sim.add_argument("--policy", default="sia",
                     help="sia, pollux, gavel, fifo, or several separated by commas")
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

    subcommand(sub, "policy-settings", "each policy's settings, defaults and help "
                                       "([policy.<name>], --set, --policy-set)")

    rep = subcommand(sub, "report", "simulate --json output as markdown beside the paper")
    rep.add_argument("json_path", metavar="RESULTS.json", help="what 'sia simulate --json' wrote")
    rep.add_argument("--out", metavar="FILE.md", help="write here instead of stdout")
    rep.add_argument("--produced-by", default="", metavar="CMD",
                     help="the command that produced the JSON, quoted in the report")

    bench = subcommand(sub, "bench", "benchmarks of the policy, simulator, control plane "
                                     "and training back-end (docs/benchmarks.md)")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    pol = subcommand(bench_sub, "policy", "time whole Sia rounds vs the CVXPY+GLPK_MI path")
    pol.add_argument("--scales", type=_scales, default=[1, 8, 32, 128],
                     help="multiples of the 64-GPU cluster (default 1,8,32,128)")
    pol.add_argument("--rounds", type=int, default=10, help="timed rounds per scale")
    pol.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    pol.add_argument("--reference-limit", type=float, default=60.0,
                     help="skip the reference once one solve takes longer (s)")
    pol.add_argument("--no-reference", action="store_true", help="production path only")
    pol.add_argument("--json", metavar="OUT", help="also write results as JSON")
    bsim = subcommand(bench_sub, "sim", "CPU-seconds to simulate whole workloads")
    bsim.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                      default=["saturn/workload-1", "newtrace/workload-1"],
                      help="CSV files or shipped workloads "
                           "(default: saturn/workload-1 newtrace/workload-1)")
    bsim.add_argument("--policy", default="sia")
    bsim.add_argument("--cluster", default="hetero64")

    rp = subcommand(sub, "replay", "submit a trace to a live controller with modeled "
                                   "agents, and compare with the simulator")
    rp.add_argument("workload", metavar="WORKLOAD",
                    help="a CSV file or shipped workload (saturn/workload-1, ...)")
    rp.add_argument("--time-scale", type=float, default=300.0,
                    help="cluster seconds per real second (default 300)")
    rp.add_argument("--policy", default="sia")
    rp.add_argument("--cluster", default="hetero64")
    rp.add_argument("--first", type=int, help="only the first N jobs by arrival")
    rp.add_argument("--no-compare", action="store_true", help="skip the simulation")
    rp.add_argument("--json", help="write the comparison as JSON")

    from sia_grpc.client.cli import add_commands

    add_commands(sub)  # submit, ls, get, ..., drain, undrain, forget (talk to a controller)

    from sia_grpc.security.cli import add_commands as add_security_commands

    add_security_commands(sub)  # certs init/issue, tokens add/list/revoke

    ld = subcommand(bench_sub, "load", "many agents and many submitted jobs: none lost, "
                                       "controller memory and CPU recorded")
    ld.add_argument("--agents", type=int, default=1000)
    ld.add_argument("--gpus-per-agent", type=int, default=8)
    ld.add_argument("--jobs", type=int, default=10000)
    ld.add_argument("--clients", type=int, default=64)
    ld.add_argument("--json", action="store_true")
    tr = subcommand(bench_sub, "training", "resize latency and profiling time of real "
                                           "workers through the agent's torch back-end")
    tr.add_argument("--json", action="store_true")
    cp = subcommand(bench_sub, "control-plane",
                    "round latency and CreateJob throughput over loopback")
    cp.add_argument("--agents", type=int, default=128)
    cp.add_argument("--gpus-per-agent", type=int, default=8)
    cp.add_argument("--jobs", type=int, default=256, help="active jobs during the rounds")
    cp.add_argument("--rounds", type=int, default=10)
    cp.add_argument("--creates", type=int, default=5000)
    cp.add_argument("--clients", type=int, default=32)
    cp.add_argument("--json", action="store_true")
    cp.add_argument("--agents-in-process", action="store_true",
                    help="run the agents as tasks in the controller's process "
                         "(default: one agent process per GPU type)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is not None:
        return args.func(args)
    if args.command == "replay":
        from sia_grpc.replay import run as run_replay

        if not args.time_scale > 0:
            parser.error("--time-scale: must be positive")
        return run_replay(args.workload, rate=args.time_scale, policy=args.policy,
                          cluster=args.cluster, first=args.first,
                          compare=not args.no_compare, json_out=args.json)
    if args.command == "demo" and not (args.offline or args.modeled):
        from sia_grpc.traindemo import main as train_demo

        return train_demo(keep=args.keep)
    if args.command == "demo" and args.modeled:
        import asyncio

        from sia_grpc.demo import live_demo
        from sia_grpc.observability import configure_logging

        if not args.time_scale > 0:
            parser.error("--time-scale: must be positive")
        configure_logging(level="warning")
        return asyncio.run(live_demo(rate=args.time_scale))
    if args.command == "demo":
        from sia_grpc.demo import run_demo

        return run_demo(num_jobs=args.jobs, rounds=args.rounds, seed=args.seed)
    if args.command == "simulate":
        from sia_grpc.sim.runner import run as run_sim

        if args.scale < 1 or args.jobs < 1:
            parser.error("--scale and --jobs must be >= 1")
        try:
            return run_sim(args.workloads, [p.strip() for p in args.policy.split(",")],
                           args.cluster, args.scale, args.jobs, args.json, args.plots,
                           policy_config=args.policy_config, sets=args.sets,
                           round_duration=args.round_duration)
        except ValueError as exc:
            print(f"sia simulate: {exc}", file=sys.stderr)
            return 2
    if args.command == "policy-settings":
        from sia_grpc.policy import params

        print(params.settings_table())
        return 0
    if args.command == "report":
        from sia_grpc.sim.report import write

        return write(args.json_path, args.out, args.produced_by)
    if args.command == "bench" and args.bench == "policy":
        from sia_grpc.bench import run

        if args.rounds < 1 or args.warmup < 0:
            parser.error("--rounds must be >= 1 and --warmup >= 0")
        return run(args.scales, args.rounds, args.warmup, args.reference_limit,
                   not args.no_reference, args.json)
    if args.command == "bench" and args.bench == "load":
        from sia_grpc.controlbench import run_load

        for name in ("agents", "gpus_per_agent", "jobs", "clients"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')}: must be >= 1")
        return run_load(agents=args.agents, gpus_per_agent=args.gpus_per_agent,
                        jobs=args.jobs, clients=args.clients, as_json=args.json)
    if args.command == "bench" and args.bench == "training":
        from sia_grpc.train.bench import run as bench_training

        return bench_training(as_json=args.json)
    if args.command == "bench" and args.bench == "control-plane":
        from sia_grpc.controlbench import run as bench_cp

        for name in ("agents", "gpus_per_agent", "jobs", "rounds", "creates", "clients"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')}: must be >= 1")
        return bench_cp(agents=args.agents, gpus_per_agent=args.gpus_per_agent, jobs=args.jobs,
                        rounds=args.rounds, creates=args.creates, clients=args.clients,
                        agents_in_process=args.agents_in_process,
                        as_json=args.json)
    if args.command == "bench" and args.bench == "sim":
        from sia_grpc.sim.runner import bench as bench_sim

        try:
            return bench_sim(args.workloads, args.policy, args.cluster)
        except ValueError as exc:
            print(f"sia bench sim: {exc}", file=sys.stderr)
            return 2
    parser.error("unknown command")
    return 2


if __name__ == "__main__":
    sys.exit(main())
