"""One way to declare a `sia` subcommand, so that each shows its one-line summary
both in its parent's list of commands and at the top of its own `--help`."""

from __future__ import annotations

import argparse
from typing import Any


def subcommand(subparsers: Any, name: str, summary: str, **kw: Any) -> argparse.ArgumentParser:
    """`subparsers.add_parser(name)` with `summary` as its help and its description."""
    return subparsers.add_parser(name, help=summary, description=summary, **kw)
