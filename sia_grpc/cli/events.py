"""`sia events` (the cluster's event history, like `kubectl get events`) and `sia
describe` (a job's story: the job, then its events in order). Both read the one
history the controllers write (ClusterService.ListEvents/WatchEvents), so they tell
what `sia watch`, `sia cluster` and the dashboard tell."""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from sia_grpc.api import pb, seconds
from sia_grpc.api.story import events_table, job_story, parse_kind
from sia_grpc.cli.argparsing import examples
from sia_grpc.cli.connection import connect, controller_command, interruptible
from sia_grpc.cli.output import dump, message_to_data

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """ "90s", "10m", "2h", "1d", "1h30m": seconds."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 10m, 2h or "
                                         f"1h30m, got {text!r}")
    return sum(float(n) * _UNIT[u] for n, u in parts)


def _kind(text: str) -> int:
    try:
        return parse_kind(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {"job_id": args.job or "", "node": args.node or "", "queue": args.queue or "",
            "kinds": args.kind or ()}


def _print(events: list[pb.Event], output: str | None) -> None:
    if output in ("json", "yaml"):
        print(dump([message_to_data(e) for e in events], output))
    elif events:
        print(events_table(events, now=time.time(), wide=output == "wide"))


def _events(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        events = sia.events(after_id=args.after, limit=args.limit, **_filters(args))
        if args.since is not None:
            edge = time.time() - args.since
            events = [e for e in events if seconds(e.time) >= edge]
        if not args.watch:
            if events or args.output in ("json", "yaml"):
                _print(events, args.output)
            else:
                print("no events")
            return 0
        last = events[-1].id if events else args.after
        try:  # (from the first line printed: Ctrl-C may come at any of them)
            _print(events, args.output)
            for event in interruptible(sia.watch_events(after_id=last, **_filters(args))):
                if args.output in ("json", "yaml"):
                    print(dump(message_to_data(event), args.output), flush=True)
                else:
                    print(events_table([event], now=time.time(),
                                       wide=args.output == "wide").splitlines()[-1],
                          flush=True)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends
    return 0


def _describe(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        job = sia.get(args.job).proto
        events = sia.events(job_id=job.job_id, limit=1000)
    if args.output in ("json", "yaml"):
        print(dump({"job": message_to_data(job),
                    "events": [message_to_data(e) for e in events]}, args.output))
    else:
        print(job_story(job, events))
    return 0


def add_commands(subparsers: Any) -> None:
    """Register `events` and `describe` on `parser.add_subparsers()`."""
    p = controller_command(subparsers, "events",
                           "the cluster's event history: jobs, rounds, nodes, queues, "
                           "controllers", _events)
    p.add_argument("--job", metavar="JOB", help="only this job's events")
    p.add_argument("--node", metavar="NODE", help="only this node's events")
    p.add_argument("--queue", metavar="QUEUE", help="only this queue's events")
    p.add_argument("--kind", type=_kind, action="append", metavar="KIND",
                   help="only events of this kind (again for several), e.g. NodeLost, "
                        "JobChanged, RoundFinished, QueueReclaim, Leader")
    p.add_argument("--since", type=parse_duration, metavar="DURATION",
                   help="only events of the last DURATION, e.g. 10m, 2h")
    p.add_argument("--after", type=int, default=0, metavar="ID",
                   help="only events after this id (wide output shows ids): resume a read")
    p.add_argument("--limit", type=int, default=100, metavar="N",
                   help="the newest N that match (default 100, at most 1000)")
    p.add_argument("-w", "--watch", action="store_true",
                   help="then each new event as it happens, until Ctrl-C")
    p.add_argument("-o", "--output", choices=("json", "yaml", "wide"), default=None,
                   help="json or yaml: the proto3 JSON mapping; wide: with ids, terms and "
                        "times (default: a table)")
    examples(p, ("sia events", "the newest 100 events, oldest first"),
             ("sia events --job team-a/train-1", "one job's events"),
             ("sia events --kind NodeLost --since 2h", "nodes lost in the last two hours"),
             ("sia events -w -o wide", "follow the history as it is written"),
             ("sia events --after 1200 -o json", "for scripts: what came after id 1200"))

    p = controller_command(subparsers, "describe",
                           "a job and its story: every event of it, in order", _describe)
    p.add_argument("job", metavar="JOB", help="the job's id (or, for your own, its name)")
    p.add_argument("-o", "--output", choices=("json", "yaml"), default=None,
                   help="json or yaml: the job and its events (default: the story)")
    examples(p, ("sia describe team-a/train-1", "why it waits, where it ran, what moved it"))
