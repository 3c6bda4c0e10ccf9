"""`sia-controller`: run the controller until SIGTERM / SIGINT (a second one kills)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import structlog

from sia_grpc.controller.config import ConfigError, load_config
from sia_grpc.controller.server import Controller, loop_factory
from sia_grpc.observability import configure_logging, setup_telemetry


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sia-controller",
                                description="Sia scheduler controller (gRPC)")
    p.add_argument("--config", help="TOML file ([controller] table); SIA_* env overrides it")
    p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:50051)")
    p.add_argument("--db", dest="db_path", help="SQLite store path (default sia-controller.db)")
    p.add_argument("--policy", help="sia, pollux, gavel or fifo (default sia)")
    p.add_argument("--round-duration", type=float, help="seconds between rounds (default 60)")
    p.add_argument("--log-format", choices=("json", "console"), help="default: console on a TTY")
    return p


async def serve(controller: Controller) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:  # a second signal: no more waiting
            sys.exit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    async with controller:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(fmt=args.log_format)
    log = structlog.get_logger("sia.controller")
    try:
        config = load_config(args.config, listen=args.listen, db_path=args.db_path,
                             policy=args.policy, round_duration=args.round_duration)
    except ConfigError as err:
        print(f"sia-controller: {err}", file=sys.stderr)
        return 2
    telemetry = setup_telemetry("sia-controller")
    log.info("telemetry", traces=telemetry.traces_exporter, metrics=telemetry.metrics_exporter)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(Controller(config, telemetry=telemetry)))
    except OSError as err:
        print(f"sia-controller: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
