"""`sia dashboard --controller ADDR --listen 127.0.0.1:8080`: the web dashboard
(docs/dashboard.md), with the same connection flags as `sia ls`."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from sia_grpc.cli.argparsing import UsageError, command


async def serve(args: argparse.Namespace) -> int:
    from sia_grpc.cli.connection import connect
    from sia_grpc.client.sdk import AsyncSiaClient
    from sia_grpc.dashboard import Dashboard
    from sia_grpc.security.tls import is_loopback

    async with connect(args, AsyncSiaClient) as client:
        try:
            dash = Dashboard(client, listen=args.listen, controller=args.controller)
        except ValueError as err:
            raise UsageError(str(err)) from None
        try:
            await dash.start()
        except OSError as err:
            raise UsageError(f"--listen: cannot listen on {args.listen}: "
                             f"{err.strerror or err}") from None
        print(f"sia dashboard: {dash.url} (controller {args.controller}; Ctrl-C to stop)",
              flush=True)
        if not is_loopback(args.listen):
            print(f"sia dashboard: warning: {args.listen} is not a loopback address, and the "
                  "dashboard asks no one for a password: whoever reaches it sees what its "
                  "token sees (docs/dashboard.md)", file=sys.stderr, flush=True)
        try:
            await dash.wait()
        finally:
            await dash.close()
    return 0


async def _until_signal(args: argparse.Namespace) -> int:
    """`serve`, stopped cleanly by SIGTERM or Ctrl-C (exit 0)."""
    from sia_grpc import signals

    task = asyncio.current_task()
    assert task is not None
    stop = {sig: task.cancel for sig in (signal.SIGTERM, signal.SIGINT)}
    with signals.handled(asyncio.get_running_loop(), stop):
        try:
            return await serve(args)
        except asyncio.CancelledError:
            return 0


def _dashboard(args: argparse.Namespace) -> int:
    return asyncio.run(_until_signal(args))


def add_commands(sub: Any) -> None:
    from sia_grpc.cli.connection import connection_flags

    p = command(sub, "dashboard", "a live web view of the cluster: GPUs by holder, jobs, "
                                  "rounds, queues (docs/dashboard.md)", _dashboard)
    connection_flags(p)
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="where to serve it (default 127.0.0.1:8080; port 0: any free one)")
