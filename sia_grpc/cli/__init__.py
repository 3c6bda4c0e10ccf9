"""The `sia` command line: one parser, one way to declare a command
(`argparsing.command`), one error wrapper (`main`).

Each module registers its commands: `demo` (the demos), `sim` (simulate, report,
policy-settings), `bench` (benchmarks, replay), `jobs` (submit, ls, get, cancel,
delete, watch) and `cluster` (cluster, queues, drain, undrain, forget), which talk to
a controller (`connection`), `dashboard` (the web view), `security` (certs, tokens)
and `slurm` (`sia slurm submit`). `reference` renders the whole parser as the command
reference, docs/cli.md (`make docs`)."""

from __future__ import annotations

import argparse
import os
import sys

from sia_grpc import __version__
from sia_grpc.api.errors import ApiError


def build_parser() -> argparse.ArgumentParser:
    """The whole `sia` command line (every subcommand registered)."""
    from sia_grpc.cli import (
        argparsing,
        bench,
        cluster,
        connection,
        dashboard,
        demo,
        events,
        jobs,
        security,
        sim,
        slurm,
    )

    parser = argparse.ArgumentParser(
        prog="sia", description="sia-grpc: the Sia scheduler's command line ('sia COMMAND "
                                "--help' for each command)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # The connection flags and -o, before COMMAND too (`argparsing.GlobalFlagsFirst`).
    flags = parser.add_argument_group(
        "global flags", "also accepted after COMMAND (given in both places, the one after "
                        "COMMAND wins); only for the commands that take them")
    connection.connection_flags(flags, defaults=False)
    flags.add_argument("-o", "--output", choices=("json", "yaml", "wide"),
                       default=argparse.SUPPRESS,
                       help="output format of ls, get, cluster, queues (see their --help)")
    parser.register("action", "parsers", argparsing.GlobalFlagsFirst)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (demo, sim, bench, jobs, cluster, events, dashboard, security, slurm):
        module.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command: its failures are one line on stderr and an exit code
    (2: the input is wrong; 1: the controller refused, or it timed out), never a
    traceback."""
    try:
        return args.func(args)
    except ApiError as err:  # (only commands that talk to a controller)
        from sia_grpc.cli.connection import api_error_line

        print(api_error_line(err, args), file=sys.stderr)
        return 1
    except args.usage_errors as err:
        print(f"{args.error_prefix}: {err}", file=sys.stderr)
        return 2
    except TimeoutError as err:
        print(f"{args.error_prefix}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `sia ls -o json | head`: the reader has gone
        # Point stdout at /dev/null so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a process killed by SIGPIPE (128 + 13)


if __name__ == "__main__":
    sys.exit(main())
