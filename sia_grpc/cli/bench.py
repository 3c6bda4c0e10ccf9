"""`sia bench ...` and `sia replay`: measurements (results in docs/benchmarks.md and
docs/results.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sia_grpc.cli.argparsing import UsageError, command, positive, subcommand


def _scales(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scales: expected e.g. 1,8,32 — got {text!r}") from None
    if not out or any(s < 1 for s in out):
        raise argparse.ArgumentTypeError("--scales: each scale must be a positive integer")
    return out


def _policy(args: argparse.Namespace) -> int:
    from sia_grpc.bench.policy import run

    if args.rounds < 1 or args.warmup < 0:
        raise UsageError("--rounds must be >= 1 and --warmup >= 0")
    if args.queues < 0:
        raise UsageError("--queues must be >= 0")
    return run(args.scales, args.rounds, args.warmup, args.reference_limit,
               not args.no_reference, args.json, queues=args.queues)


def _sim(args: argparse.Namespace) -> int:
    from sia_grpc.bench.sim import run

    return run(args.workloads, args.policy, args.cluster, args.scale)


def _load(args: argparse.Namespace) -> int:
    from sia_grpc.bench.control_plane import run_load

    return run_load(agents=args.agents, gpus_per_agent=args.gpus_per_agent, jobs=args.jobs,
                    clients=args.clients, as_json=args.json)


def _training(args: argparse.Namespace) -> int:
    from sia_grpc.bench.training import run

    return run(as_json=args.json)


_LEVELS = ("none", "user", "sandbox")  # (sia_grpc.bench.isolation.LEVELS)


def _levels(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out or any(x not in _LEVELS for x in out):
        raise argparse.ArgumentTypeError(f"--levels: expected some of {','.join(_LEVELS)} "
                                         f"— got {text!r}")
    return list(dict.fromkeys(out))


def _isolation(args: argparse.Namespace) -> int:
    from sia_grpc.bench.isolation import run

    return run(levels=args.levels, repeats=args.repeats, steady_s=args.steady,
               as_json=args.json)


def _control_plane(args: argparse.Namespace) -> int:
    from sia_grpc.bench.control_plane import run
    from sia_grpc.controller.stores import is_postgres

    if args.store and not is_postgres(args.store):
        print("error: --store: expected a postgresql:// DSN (SQLite is always measured)",
              file=sys.stderr)
        return 2
    return run(agents=args.agents, gpus_per_agent=args.gpus_per_agent, jobs=args.jobs,
               rounds=args.rounds, creates=args.creates, clients=args.clients,
               agents_in_process=args.agents_in_process, as_json=args.json, store=args.store)


def _failover(args: argparse.Namespace) -> int:
    from sia_grpc.bench.failover import run
    from sia_grpc.controller.stores import is_postgres
    from sia_grpc.testing.postgres import unavailable

    if args.store and not is_postgres(args.store):
        raise UsageError("--store: expected a postgresql:// DSN")
    if not args.store and (why := unavailable()):
        raise UsageError(f"no PostgreSQL server to start ({why}); give one with --store DSN")
    return run(kills=args.kills, agents=args.agents, gpus_per_agent=args.gpus_per_agent,
               ttl=args.lease_ttl, rate=args.rate, clients=args.clients, store=args.store,
               json_out=args.json)


def _dashboard(args: argparse.Namespace) -> int:
    from sia_grpc.testing.browser import unavailable

    if why := unavailable():
        raise UsageError(f"no headless browser: {why}")
    from sia_grpc.bench.dashboard import run

    return run(jobs=args.jobs, samples=args.samples, as_json=args.json)


def _slurm(args: argparse.Namespace) -> int:
    from sia_grpc.testing.slurm import unavailable

    if why := unavailable():
        raise UsageError(f"no Slurm test cluster: {why}")
    from sia_grpc.bench.slurm import run

    return run(args.workload, args.first, args.time_scale, interval_s=args.interval,
               timeout_s=args.timeout, json_out=args.json, quiet=args.quiet)


def _replay(args: argparse.Namespace) -> int:
    from sia_grpc.bench.replay import run

    return run(args.workload, rate=args.time_scale, policy=args.policy, cluster=args.cluster,
               first=args.first, compare=not args.no_compare, json_out=args.json,
               reuse_profiles=not args.no_profile_reuse)


# -- the parsers, one function each ---------------------------------------------------

_count = positive(int)  # (agents, jobs, repeats, ...)


def _add_policy(bench_sub: Any) -> None:
    pol = command(bench_sub, "policy", "time whole Sia rounds vs the CVXPY+GLPK_MI path",
                  _policy)
    pol.add_argument("--scales", type=_scales, default=[1, 8, 32, 128],
                     help="multiples of the 64-GPU cluster (default 1,8,32,128)")
    pol.add_argument("--rounds", type=int, default=10, help="timed rounds per scale")
    pol.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    pol.add_argument("--reference-limit", type=float, default=60.0,
                     help="skip the reference once one solve takes longer (s)")
    pol.add_argument("--no-reference", action="store_true", help="production path only")
    pol.add_argument("--json", metavar="OUT", help="also write results as JSON")
    pol.add_argument("--queues", type=int, default=0, metavar="N",
                     help="also time the whole call with N queues (guarantees, borrowing "
                          "limits, type-flexible guarantees, a restart budget; then the "
                          "same queues without the budget) beside the same rounds without "
                          "queues, at 2,048 GPUs / 2,000 jobs (0: skip)")


def _add_sim(bench_sub: Any) -> None:
    bsim = command(bench_sub, "sim", "CPU-seconds to simulate whole workloads", _sim,
                   prefix="sia bench sim", usage=(ValueError,))
    bsim.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                      default=["saturn/workload-1", "newtrace/workload-1"],
                      help="CSV files or shipped workloads "
                           "(default: saturn/workload-1 newtrace/workload-1)")
    bsim.add_argument("--policy", default="sia", help="the policy (default sia)")
    bsim.add_argument("--cluster", default="hetero64",
                      help="hetero64, homo64, or a cluster TOML file (default hetero64)")
    bsim.add_argument("--scale", type=positive(int), default=1,
                      help="multiply the cluster's nodes (as sia simulate --scale)")


def _add_load(bench_sub: Any) -> None:
    ld = command(bench_sub, "load", "many agents and many submitted jobs: none lost, "
                                    "controller memory and CPU recorded", _load)
    ld.add_argument("--agents", type=_count, default=1000)
    ld.add_argument("--gpus-per-agent", type=_count, default=8)
    ld.add_argument("--jobs", type=_count, default=10000)
    ld.add_argument("--clients", type=_count, default=64)
    ld.add_argument("--json", action="store_true")


def _add_training(bench_sub: Any) -> None:
    tr = command(bench_sub, "training", "resize latency and profiling time of real workers "
                                        "through the agent's torch back-end", _training)
    tr.add_argument("--json", action="store_true")


def _add_isolation(bench_sub: Any) -> None:
    iso = command(bench_sub, "isolation", "what node isolation (none, user, sandbox) costs "
                                          "a job's start, resize, stop and steps, with real "
                                          "workers on emulated GPUs", _isolation)
    iso.add_argument("--levels", type=_levels, default=list(_LEVELS),
                     help="the levels to measure, those the host gives (default "
                          "none,user,sandbox; user and sandbox need root)")
    iso.add_argument("--repeats", type=_count, default=5,
                     help="fresh jobs per level, each started, resized and stopped (default 5)")
    iso.add_argument("--steady", type=positive(float), default=3.0, metavar="SECONDS",
                     help="training time per job for the steady step time (default 3)")
    iso.add_argument("--json", action="store_true", help="print the results as JSON")


def _add_control_plane(bench_sub: Any) -> None:
    cp = command(bench_sub, "control-plane",
                 "round latency and CreateJob throughput over loopback", _control_plane)
    cp.add_argument("--agents", type=_count, default=128)
    cp.add_argument("--gpus-per-agent", type=_count, default=8)
    cp.add_argument("--jobs", type=_count, default=256, help="active jobs during the rounds")
    cp.add_argument("--rounds", type=_count, default=10)
    cp.add_argument("--creates", type=_count, default=5000)
    cp.add_argument("--clients", type=_count, default=32)
    cp.add_argument("--json", action="store_true")
    cp.add_argument("--store", default="", metavar="DSN",
                    help="measure on this PostgreSQL store too (postgresql://USER@HOST/DB; "
                         "the password from the DSN, PGPASSWORD or ~/.pgpass), beside SQLite")
    cp.add_argument("--agents-in-process", action="store_true",
                    help="run the agents as tasks in the controller's process "
                         "(default: one agent process per GPU type)")


def _add_failover(bench_sub: Any) -> None:
    fo = command(bench_sub, "failover",
                 "a controller pair on PostgreSQL, the leader SIGKILLed again and again "
                 "under load: failover time, and nothing lost or double-booked", _failover)
    fo.add_argument("--kills", type=_count, default=20, help="SIGKILLs of the leader")
    fo.add_argument("--agents", type=_count, default=32, help="modeled agents (default 32)")
    fo.add_argument("--gpus-per-agent", type=_count, default=8)
    fo.add_argument("--lease-ttl", type=positive(float), default=4.0, metavar="SECONDS",
                    help="the controllers' lease_ttl_s (default 4, the config's default)")
    fo.add_argument("--rate", type=positive(float), default=20.0,
                    help="CreateJob calls per second, all clients together (default 20)")
    fo.add_argument("--clients", type=_count, default=4)
    fo.add_argument("--store", default="", metavar="DSN",
                    help="an empty PostgreSQL database (default: a throwaway server on "
                         "this machine, fsync on)")
    fo.add_argument("--json", metavar="OUT", help="also write the results as JSON")


def _add_dashboard(bench_sub: Any) -> None:
    db = command(bench_sub, "dashboard", "the dashboard with many jobs in headless Chromium: "
                                         "page load, and CreateJob to its row on screen",
                 _dashboard)
    db.add_argument("--jobs", type=_count, default=1000, help="jobs first (default 1000)")
    db.add_argument("--samples", type=_count, default=30,
                    help="jobs then created one at a time, each timed (default 30)")
    db.add_argument("--json", action="store_true")


def _add_slurm(bench_sub: Any) -> None:
    sl = command(bench_sub, "slurm", "a trace on a throwaway Slurm cluster: Sia through the "
                                     "sia-slurm bridge beside Slurm alone (FIFO with "
                                     "backfill)", _slurm, prefix="sia bench slurm",
                 usage=(ValueError,))
    sl.add_argument("workload", nargs="?", default="saturn/workload-1", metavar="WORKLOAD",
                    help="a CSV file or shipped workload (default saturn/workload-1)")
    sl.add_argument("--first", type=_count, default=30, help="the first N jobs (default 30)")
    sl.add_argument("--time-scale", type=positive(float), default=360.0,
                    help="trace (and modeled training) seconds per real second (default 360)")
    sl.add_argument("--interval", type=positive(float), default=1.0, metavar="SECONDS",
                    help="seconds between the bridge's rounds (default 1)")
    sl.add_argument("--timeout", type=positive(float), default=900.0, metavar="SECONDS",
                    help="give up on an arm after this long (default 900)")
    sl.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    sl.add_argument("-q", "--quiet", action="store_true",
                    help="no progress on stderr (bars on a terminal, a line every 30 s "
                         "elsewhere)")


def _add_replay(sub: Any) -> None:
    rp = command(sub, "replay", "submit a trace to a live controller with modeled agents, "
                                "and compare with the simulator", _replay)
    rp.add_argument("workload", metavar="WORKLOAD",
                    help="a CSV file or shipped workload (saturn/workload-1, ...)")
    rp.add_argument("--time-scale", type=positive(float), default=300.0,
                    help="cluster seconds per real second (default 300)")
    rp.add_argument("--policy", default="sia", help="the controller's policy (default sia)")
    rp.add_argument("--cluster", default="hetero64",
                    help="hetero64, homo64, or a cluster TOML file (default hetero64)")
    rp.add_argument("--first", type=int, help="only the first N jobs by arrival")
    rp.add_argument("--no-compare", action="store_true", help="skip the simulation")
    rp.add_argument("--no-profile-reuse", action="store_true",
                    help="profile every job afresh (the controller's reuse_profiles = false)")
    rp.add_argument("--json", help="write the comparison as JSON")


def add_commands(sub: Any) -> None:
    """`sia bench BENCHMARK` (each benchmark's parser from its `_add_...`, in the order
    `sia bench --help` lists them) and `sia replay`."""
    bench = subcommand(sub, "bench", "benchmarks of the policy, simulator, control plane "
                                     "and training back-end (docs/benchmarks.md)")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    for add in (_add_policy, _add_sim, _add_load, _add_training, _add_isolation,
                _add_control_plane, _add_failover, _add_dashboard, _add_slurm):
        add(bench_sub)
    _add_replay(sub)
