"""The `sia` command line."""

from __future__ import annotations

import argparse
import sys


def _scales(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scales: expected e.g. 1,8,32 — got {text!r}") from None
    if not out or any(s < 1 for s in out):
        raise argparse.ArgumentTypeError("--scales: each scale must be a positive integer")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sia", description="sia-grpc command line")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="solve Sia rounds on the paper's 64-GPU cluster")
    demo.add_argument("--jobs", type=int, default=16, help="number of sample jobs (default 16)")
    demo.add_argument("--rounds", type=int, default=4, help="rounds to run (default 4)")
    demo.add_argument("--seed", type=int, default=1)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    pol = bench_sub.add_parser("policy", help="time whole Sia rounds vs the CVXPY+GLPK_MI path")
    pol.add_argument("--scales", type=_scales, default=[1, 8, 32, 128],
                     help="multiples of the 64-GPU cluster (default 1,8,32,128)")
    pol.add_argument("--rounds", type=int, default=10, help="timed rounds per scale")
    pol.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    pol.add_argument("--reference-limit", type=float, default=60.0,
                     help="skip the reference once one solve takes longer (s)")
    pol.add_argument("--no-reference", action="store_true", help="production path only")
    pol.add_argument("--json", metavar="OUT", help="also write results as JSON")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from sia_grpc.demo import run_demo

        return run_demo(num_jobs=args.jobs, rounds=args.rounds, seed=args.seed)
    if args.command == "bench" and args.bench == "policy":
        from sia_grpc.bench import run

        if args.rounds < 1 or args.warmup < 0:
            parser.error("--rounds must be >= 1 and --warmup >= 0")
        return run(args.scales, args.rounds, args.warmup, args.reference_limit,
                   not args.no_reference, args.json)
    parser.error("unknown command")
    return 2


if __name__ == "__main__":
    sys.exit(main())
