"""The `sia` commands about the cluster rather than one's jobs: the views `cluster`
and `queues`, and the admin's `drain`, `undrain` and `forget` of a node.

`add_commands` registers them after the job commands (`cli/jobs.py`); they reach the
controller and report its errors the same way (`cli/connection.py`). The `cluster`
and `queues` tables are `api/present.py`'s, shared with the dashboard, so both say
the same.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sia_grpc.api import node_state_name
from sia_grpc.api.present import cluster_report, format_time, queues_table
from sia_grpc.cli.argparsing import examples
from sia_grpc.cli.connection import connect, controller_command
from sia_grpc.cli.output import dump, message_to_data, output_flag


def _cluster(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        cluster, rounds = sia.cluster(), sia.rounds(limit=args.rounds)
    if args.output in ("json", "yaml"):
        print(dump({"cluster": message_to_data(cluster),
                    "rounds": [message_to_data(r) for r in rounds]}, args.output))
    else:
        print(cluster_report(cluster, rounds, wide=args.output == "wide"))
    return 0


def _queues(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        resp = sia.queues()
    if args.output in ("json", "yaml"):
        print(dump(message_to_data(resp), args.output))
    else:
        print(queues_table(resp))
    return 0


def _drain(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        node = sia.drain(args.node, args.reason or "")
        print(f"{node.name} draining: {node.drain_reason}")
        if not args.wait:
            return 0
        deadline = time.monotonic() + args.timeout
        while True:
            (node,) = [n for n in sia.cluster().nodes if n.name == args.node] or [node]
            jobs = sorted({g.job_id for g in node.gpus if g.job_id})
            if not jobs:
                print(f"{node.name} drained: no job holds its GPUs")
                return 0
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node.name} still holds {', '.join(jobs)} after "
                                   f"{args.timeout:g} s")
            print(f"  waiting for {len(jobs)} job(s) to move: {', '.join(jobs)}", flush=True)
            time.sleep(2.0)


def _undrain(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        node = sia.undrain(args.node)
    print(f"{node.name} {node_state_name(node.state).lower()}")
    return 0


def _forget(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        node = sia.forget_node(args.node)
    print(f"{node.name} forgotten ({node.gpu_type or 'unknown type'}, {node.num_gpus} GPUs, "
          f"last heartbeat {format_time(node.last_heartbeat)})")
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_commands(subparsers: Any) -> None:
    """Register the cluster views and the node admin commands on
    `parser.add_subparsers()`."""
    p = controller_command(subparsers, "cluster",
                           "nodes, GPUs by type, and the last scheduling rounds", _cluster)
    p.add_argument("--rounds", type=_positive, default=20, metavar="N",
                   help="how many recent rounds (default 20; the controller keeps 1000)")
    output_flag(p, "tables")
    examples(p, ("sia cluster", "GPU types, nodes, the last 20 rounds"),
             ("sia cluster --rounds 100 -o wide", "with each round's phases"))

    p = controller_command(subparsers, "queues",
                           "queues: guarantees, GPUs held and borrowed, waiting jobs", _queues)
    p.add_argument("-o", "--output", choices=("json", "yaml"), default=None,
                   help="json or yaml: the proto3 JSON mapping, for scripts (default: a table)")
    examples(p, ("sia queues", "each queue's guarantee, what it holds and borrows"),
             ("sia queues -o json", "for scripts"))

    p = controller_command(subparsers, "drain",
                           "admin: take a node out of scheduling; its jobs move elsewhere",
                           _drain)
    p.add_argument("node", metavar="NODE", help="the node's id (as 'sia cluster' lists it)")
    p.add_argument("--reason", metavar="TEXT", help="shown in 'sia cluster' and the agent's log")
    p.add_argument("--wait", action="store_true", help="return once no job holds its GPUs")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up after S seconds (default 600)")
    examples(p, ('sia drain rtx-3 --reason "replace GPU 2"', "its jobs move at the next round"),
             ("sia drain rtx-3 --wait --timeout 900", "and return once its GPUs are free"),
             ("sia undrain rtx-3", "let it take work again"))

    p = controller_command(subparsers, "undrain", "admin: let a drained node take work again",
                           _undrain)
    p.add_argument("node", metavar="NODE", help="the node's id")

    p = controller_command(subparsers, "forget",
                           "admin: remove a LOST node (its agent gone for good) and its drain",
                           _forget)
    p.add_argument("node", metavar="NODE", help="the node's id; it must be LOST")
