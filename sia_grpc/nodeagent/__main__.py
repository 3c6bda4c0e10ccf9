"""`python -m sia_grpc.nodeagent --controller HOST:PORT --node-id NAME --gpus rtx:8`

Runs one node agent with modeled workers until SIGTERM or SIGINT, which close it
gracefully (running jobs checkpointed and reported); a second signal kills.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys

import structlog

from sia_grpc.nodeagent.agent import AgentConfig, NodeAgent


def _gpus(text: str) -> tuple[str, int]:
    gpu_type, sep, count = text.rpartition(":")
    if not sep or not gpu_type or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected TYPE:COUNT such as rtx:8, got {text!r}")
    return gpu_type, int(count)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sia_grpc.nodeagent",
                                description="sia node agent (modeled workers)")
    p.add_argument("--controller", required=True, metavar="HOST:PORT")
    p.add_argument("--node-id", default=socket.gethostname(),
                   help="this node's name (default: the host name)")
    p.add_argument("--gpus", required=True, type=_gpus, metavar="TYPE:COUNT",
                   help="the node's GPU inventory, e.g. rtx:8")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="modeled seconds per real second (default 1; 60 runs a minute a second)")
    p.add_argument("--telemetry-interval", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--log-format", choices=("auto", "console", "json"), default="auto",
                   help="auto: console on a terminal, JSON otherwise")
    return p


def _configure_logging(fmt: str) -> None:
    """The process's logging: only the entry point configures structlog."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer = (structlog.dev.ConsoleRenderer() if fmt == "console"
                else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info, renderer],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr))


async def _serve(config: AgentConfig) -> None:
    loop = asyncio.get_running_loop()
    agent = NodeAgent(config)
    closing: list[asyncio.Task[None]] = []

    def on_signal(sig: signal.Signals) -> None:
        structlog.get_logger().info("signal: closing", signal=sig.name)
        for s in (signal.SIGTERM, signal.SIGINT):  # a second one takes the default action
            loop.remove_signal_handler(s)
        closing.append(asyncio.create_task(agent.close()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        await agent.run()
    finally:
        await agent.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    gpu_type, num_gpus = args.gpus
    try:
        config = AgentConfig(node_id=args.node_id, controller=args.controller,
                             gpu_type=gpu_type, num_gpus=num_gpus, time_scale=args.time_scale,
                             telemetry_interval_s=args.telemetry_interval)
    except ValueError as exc:
        print(f"sia nodeagent: {exc}", file=sys.stderr)
        return 2
    _configure_logging(args.log_format)
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
