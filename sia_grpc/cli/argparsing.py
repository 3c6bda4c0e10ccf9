"""How every `sia` subcommand is declared: one summary shown both in its parent's
list of commands and at the top of its own `--help`, the function it runs with what
its failures mean (`command`), and its examples (`examples`: the end of its `--help`
and of its section in docs/cli.md). `sia_grpc.cli.main` runs it through the one
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


EXAMPLES = "examples:"  # the line an epilog's examples follow (`examples`, cli/reference.py)


def examples(parser: argparse.ArgumentParser, *lines: tuple[str, str]) -> argparse.ArgumentParser:
    """Give `parser` an epilog of examples, each (command line, what it does), shown
    as written at the end of its `--help` (as kubectl's: what it does as a comment,
    then the command) and in the CLI reference (docs/cli.md, which `cli/reference.py`
    renders from the parsers; the docs' tests parse each command line)."""
    body = "\n".join(f"  # {what}\n  {cmd}" if what else f"  {cmd}" for cmd, what in lines)
    parser.epilog = f"{EXAMPLES}\n{body}"
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # (the epilog as written)
    return parser


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


# The flags `sia` takes before its subcommand as well as after it (`sia --controller
# A,B ls` and `sia ls --controller A,B`), by dest: the connection flags and -o.
GLOBAL_FLAGS = ("controller", "token_file", "ca", "cert", "key", "output")


class GlobalFlagsFirst(argparse._SubParsersAction):
    """Subcommands that take the global flags (`GLOBAL_FLAGS`) before them too.

    The top-level parser declares them with no default (argparse.SUPPRESS), so the
    namespace holds only those given before the subcommand. Those become the
    subcommand's defaults while it parses: given again after it, its value wins; its
    own choices still apply (`sia -o wide queues` is refused). A global flag given to a
    command that does not take it is an error, not silently dropped."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = {dest: getattr(namespace, dest) for dest in GLOBAL_FLAGS
                 if hasattr(namespace, dest)}
        sub = self._name_parser_map.get(values[0]) if values else None
        if not given or sub is None:  # (an unknown command: the base class says so)
            return super().__call__(parser, namespace, values, option_string)
        for dest in given:
            delattr(namespace, dest)  # the subcommand's parse sets them again
        actions = {a.dest: a for a in sub._actions
                   if a.dest in given and isinstance(a, argparse._StoreAction)}
        for dest, value in given.items():
            action = actions.get(dest)
            if action is None:
                flag = "--" + dest.replace("_", "-")
                raise argparse.ArgumentError(None, f"{flag}: 'sia {values[0]}' does not "
                                                   f"take it")
            if action.choices is not None and value not in action.choices:
                choices = ", ".join(map(repr, action.choices))
                raise argparse.ArgumentError(action, f"invalid choice for 'sia {values[0]}': "
                                                     f"{value!r} (choose from {choices})")
        saved = {dest: a.default for dest, a in actions.items()}
        try:
            for dest, action in actions.items():
                action.default = given[dest]
            super().__call__(parser, namespace, values, option_string)
        finally:
            for dest, action in actions.items():
                action.default = saved[dest]
