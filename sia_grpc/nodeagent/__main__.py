"""`python -m sia_grpc.nodeagent --controller HOST:PORT --node-id NAME --gpus rtx:8`

Runs one node agent until SIGTERM or SIGINT, which close it gracefully (running
jobs checkpointed and reported); a second signal kills.

`--backend modeled` (the default): workers modeled from the profile data, no GPUs.
`--backend torch`: real worker processes running each job's command on the
node's GPUs (NVML, or `--gpus`), or, with `--emulate TYPE:COUNT`, on the CPU as
an EMULATION of that GPU type (see docs/agent.md).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog

from sia_grpc import signals
from sia_grpc.nodeagent.agent import AgentConfig, AgentConfigError, NodeAgent
from sia_grpc.nodeagent.gpus import (
    NodeGpus,
    parse_gpu_spec,
    resolve_inventory,
    unknown_type_warning,
)
from sia_grpc.observability import add_logging_arguments, configure_logging


def _gpus(text: str) -> tuple[str, int]:
    try:
        return parse_gpu_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sia-nodeagent",
                                description="sia node agent: one node, one GPU type")
    p.add_argument("--controller", required=True, metavar="HOST:PORT[,HOST:PORT]",
                   help="the controller; a pair's addresses comma-separated, or one DNS "
                        "name with several records (the agent finds the leader and "
                        "follows it over a failover)")
    p.add_argument("--node-id", default=socket.gethostname(),
                   help="this node's name (default: the host name)")
    p.add_argument("--backend", choices=("modeled", "torch"), default="modeled",
                   help="modeled: workers modeled from the profiles, no GPUs (default); "
                        "torch: real worker processes running each job's command")
    p.add_argument("--gpus", type=_gpus, metavar="TYPE:COUNT",
                   help="the node's GPU inventory, e.g. rtx:8 (required with the modeled "
                        "back-end; with torch: found through NVML when it is installed, "
                        "which this renames or limits)")
    p.add_argument("--emulate", type=_gpus, metavar="TYPE:COUNT",
                   help="torch back-end without GPUs: EMULATE COUNT GPUs of TYPE by running "
                        "workers on the CPU, paced to TYPE's relative speed")
    p.add_argument("--workdir", type=Path, metavar="DIR",
                   help="torch: worker socket, logs and default checkpoints "
                        "(default: <tmp>/sia-nodeagent-<node-id>)")
    p.add_argument("--checkpoint-root", type=Path, metavar="DIR",
                   help="torch: per-job checkpoint directories when a directive names none "
                        "(default: <workdir>/checkpoints)")
    p.add_argument("--stop-grace", type=_seconds, default=30.0, metavar="SECONDS",
                   help="torch: SIGTERM to SIGKILL when stopping workers (default 30)")
    p.add_argument("--profile-timeout", type=_seconds, default=600.0, metavar="SECONDS",
                   help="torch: longest profiling pass (default 600)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="modeled: modeled seconds per real second (default 1; 60 runs a "
                        "minute a second)")
    p.add_argument("--telemetry-interval", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--keepalive", type=_seconds, default=20.0, metavar="SECONDS",
                   help="ping the controller after this long without a message; no answer "
                        "for as long again ends the stream and it reconnects (default 20)")
    p.add_argument("--count", type=int, default=1, metavar="N",
                   help="modeled: run N agents in this process, named NODE-ID-0 .. "
                        "NODE-ID-(N-1) (load tests: many nodes, few processes)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="CA certificate (PEM) of the controller: connect with TLS")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="this node's client certificate (PEM; CN or SAN = --node-id)")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    add_logging_arguments(p)
    return p


class _StartupError(Exception):
    pass


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.backend == "modeled":
        torch_only = [f for f, v in (("--emulate", args.emulate), ("--workdir", args.workdir),
                                     ("--checkpoint-root", args.checkpoint_root)) if v]
        if torch_only:
            p.error(f"{', '.join(torch_only)}: only with --backend torch")
        if args.gpus is None:
            p.error("--gpus TYPE:COUNT is required with --backend modeled")
    elif args.count != 1:
        p.error("--count: only with --backend modeled (one torch agent per node)")
    if args.count < 1:
        p.error("--count: must be at least 1")
    elif args.emulate is not None and args.gpus is not None:
        p.error("give either --gpus (real GPUs) or --emulate (CPU emulation), not both")
    if args.profile_timeout <= 0:
        p.error("--profile-timeout: must be positive")


def _torch_backend(args: argparse.Namespace, inventory: NodeGpus) -> Any:
    from sia_grpc.nodeagent.torchbackend import TorchBackend, safe_name

    workdir = args.workdir or (
        Path(tempfile.gettempdir()) / f"sia-nodeagent-{safe_name(args.node_id)}")
    return TorchBackend(inventory.gpu_type, inventory.count, workdir=workdir,
                        checkpoint_root=args.checkpoint_root, emulate=inventory.emulated,
                        stop_grace_s=args.stop_grace, profile_timeout_s=args.profile_timeout,
                        node_id=args.node_id)


async def _serve(configs: list[AgentConfig], backend: Any = None,
                 inventory: NodeGpus | None = None) -> None:
    loop = asyncio.get_running_loop()
    log = structlog.get_logger().bind(node_id=configs[0].node_id)
    if inventory is not None and inventory.emulated:
        log.warning("EMULATION: this agent has no GPUs; it runs workers on the CPU and "
                    f"registers them as {inventory.count} {inventory.gpu_type!r} GPUs",
                    gpu_type=inventory.gpu_type, count=inventory.count)
    elif inventory is not None:
        log.info("GPUs", gpu_type=inventory.gpu_type, count=inventory.count,
                 source=inventory.source, names=list(inventory.names))
    if inventory is not None and (warning := unknown_type_warning(inventory.gpu_type)):
        log.warning(warning, gpu_type=inventory.gpu_type)
    if backend is not None:
        try:
            await backend.open()  # fail fast: the workdir and its lock, the socket
        except (RuntimeError, OSError) as exc:
            raise _StartupError(str(exc)) from None
    agents = [NodeAgent(c, backend) for c in configs]
    closing: list[asyncio.Task[Any]] = []

    async def close_all() -> None:
        await asyncio.gather(*(a.close() for a in agents))

    def on_signal(sig: signal.Signals) -> None:
        # Act first, then log: the log line is the part that can go wrong.
        for s in (signal.SIGTERM, signal.SIGINT):  # a second one takes the default action
            loop.remove_signal_handler(s)
        closing.append(asyncio.create_task(close_all()))
        structlog.get_logger().info("signal: closing", signal=sig.name)

    handlers = {sig: functools.partial(on_signal, sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with signals.handled(loop, handlers):
        try:
            await asyncio.gather(*(a.run() for a in agents))
        finally:
            await close_all()


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    inventory = None
    try:
        if args.backend == "torch":
            inventory = resolve_inventory(declared=args.gpus, emulate=args.emulate)
            gpu_type, num_gpus = inventory.gpu_type, inventory.count
        else:
            gpu_type, num_gpus = args.gpus
            inventory = NodeGpus(gpu_type, num_gpus, "declared")
        for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert),
                           ("--tls-key", args.tls_key)):
            if path and not Path(path).is_file():
                raise ValueError(f"{flag}: cannot read {path}")
        names = ([args.node_id] if args.count == 1
                 else [f"{args.node_id}-{i}" for i in range(args.count)])
        configs = [AgentConfig(node_id=name, controller=args.controller, gpu_type=gpu_type,
                               num_gpus=num_gpus, time_scale=args.time_scale,
                               telemetry_interval_s=args.telemetry_interval,
                               keepalive_s=args.keepalive, tls_ca=args.tls_ca,
                               tls_cert=args.tls_cert, tls_key=args.tls_key)
                   for name in names]
        # Before the back-end is built: it binds its logger to the configuration then.
        configure_logging(fmt=args.log_format, level=args.log_level)
        backend = _torch_backend(args, inventory) if args.backend == "torch" else None
    except ValueError as exc:  # also a bad SIA_LOG_FORMAT / SIA_LOG_LEVEL
        print(f"sia nodeagent: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            runner.run(_serve(configs, backend, inventory))
        except _StartupError as exc:  # e.g. the workdir is another agent's
            print(f"sia nodeagent: {exc}", file=sys.stderr)
            return 1
        except AgentConfigError as exc:  # e.g. a client certificate the controller refuses
            print(f"sia nodeagent: {exc}", file=sys.stderr)
            return 2  # a configuration error: systemd does not restart it (deploy/systemd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
