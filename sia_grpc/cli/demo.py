"""`sia demo`: real training (the default, what `make demo` runs), modeled agents
(--modeled), or policy rounds only (--offline)."""

from __future__ import annotations

import argparse
from typing import Any

from sia_grpc.cli.argparsing import command, positive


def _demo(args: argparse.Namespace) -> int:
    if args.offline:
        from sia_grpc.demo.modeled import run_demo

        return run_demo(num_jobs=args.jobs, rounds=args.rounds, seed=args.seed)
    if args.modeled:
        import asyncio

        from sia_grpc.demo.modeled import live_demo
        from sia_grpc.observability import configure_logging

        configure_logging(level="error")
        return asyncio.run(live_demo(rate=args.time_scale, dashboard=args.dashboard))
    from sia_grpc.demo.training import main

    return main(keep=args.keep, dashboard=args.dashboard)


def add_commands(sub: Any) -> None:
    demo = command(sub, "demo", "real PyTorch jobs scheduled by a live controller and two "
                                "emulated-GPU agents (--modeled: modeled agents running a "
                                "trace; --offline: policy rounds only)", _demo)
    mode = demo.add_mutually_exclusive_group()
    mode.add_argument("--modeled", action="store_true",
                      help="modeled agents of three GPU types running a small trace, "
                           "faster than real time")
    mode.add_argument("--offline", action="store_true",
                      help="only solve Sia rounds on the paper's 64-GPU cluster, no services")
    demo.add_argument("--keep", metavar="DIR",
                      help="real training: keep the work files (logs, checkpoints) in DIR")
    demo.add_argument("--time-scale", type=positive(float), default=120.0,
                      help="modeled: cluster seconds per real second (default 120)")
    demo.add_argument("--dashboard", metavar="HOST:PORT", default="127.0.0.1:8080",
                      help="serve `sia dashboard` there while the demo runs (default "
                           "127.0.0.1:8080, or a free port if that one is taken)")
    demo.add_argument("--no-dashboard", dest="dashboard", action="store_const", const=None,
                      help="no dashboard")
    demo.add_argument("--jobs", type=int, default=16, help="offline: sample jobs (default 16)")
    demo.add_argument("--rounds", type=int, default=4, help="offline: rounds (default 4)")
    demo.add_argument("--seed", type=int, default=1)
