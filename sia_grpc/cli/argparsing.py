"""How every `sia` subcommand is declared: one summary shown both in its parent's
list of commands and at the top of its own `--help`, and the function it runs with
what its failures mean (`command`). `sia_grpc.cli.main` runs it through the one
error wrapper."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Func = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """Input the user can fix (a flag, a file): one line on stderr, exit 2."""


def subcommand(subparsers: Any, name: str, summary: str, **kw: Any) -> argparse.ArgumentParser:
    """`subparsers.add_parser(name)` with `summary` as its help and its description."""
    return subparsers.add_parser(name, help=summary, description=summary, **kw)


def command(subparsers: Any, name: str, summary: str, func: Func, *, prefix: str = "error",
            usage: tuple[type[BaseException], ...] = ()) -> argparse.ArgumentParser:
    """A subcommand that runs `func` (`runs`)."""
    return runs(subcommand(subparsers, name, summary), func, prefix=prefix, usage=usage)


def runs(parser: argparse.ArgumentParser, func: Func, *, prefix: str = "error",
         usage: tuple[type[BaseException], ...] = ()) -> argparse.ArgumentParser:
    """`parser`'s command runs `func(args) -> exit code`. A `UsageError`, or one of
    `usage` (exceptions that mean the input is wrong), is printed as one line
    `PREFIX: message` with exit status 2 (`sia_grpc.cli.main`)."""
    parser.set_defaults(func=func, error_prefix=prefix, usage_errors=(UsageError, *usage))
    return parser


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: a positive `kind` (int or float)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value
    return parse
