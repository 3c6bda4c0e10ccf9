"""`sia-controller`: run the controller until SIGTERM / SIGINT (a second one kills)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import io
import signal
import sys

import structlog

from sia_grpc import signals
from sia_grpc.controller.config import ConfigError, load_config
from sia_grpc.controller.shell.server import Controller, loop_factory
from sia_grpc.controller.stores import StoreError
from sia_grpc.observability import add_logging_arguments, configure_logging, setup_telemetry
from sia_grpc.policy import POLICIES


def policy_names() -> str:
    """The registered policies (`sia_grpc.policy.POLICIES`) as --help lists them."""
    names = list(POLICIES)
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sia-controller",
                                description="Sia scheduler controller (gRPC)",
                                epilog="`sia policy-settings` lists the policy settings.")
    p.add_argument("--config", help="TOML file ([controller] table); SIA_* env overrides it")
    p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:50051)")
    p.add_argument("--db", dest="db_path", help="SQLite store path (default sia-controller.db)")
    p.add_argument("--store", metavar="DSN_OR_PATH",
                   help="the store instead: postgresql://USER@HOST/DB (password from "
                        "store_password_file, the DSN, PGPASSWORD or ~/.pgpass) or a path")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="with a postgresql:// store: where clients reach this controller, "
                        "as a standby names the leader (default --listen)")
    p.add_argument("--lease-ttl", dest="lease_ttl_s", type=float, metavar="SECONDS",
                   help="with a postgresql:// store: the leader's lease (default 4; renewed "
                        "every third of it)")
    p.add_argument("--policy", help=f"{policy_names()} (default sia)")
    p.add_argument("--policy-set", action="append", default=[], metavar="POLICY.SETTING=VALUE",
                   help="a policy setting, e.g. sia.p=-1 (repeatable; over [policy.<name>] "
                        "in --config and SIA_POLICY_<NAME>_<SETTING>)")
    p.add_argument("--round-duration", type=float,
                   help="seconds between rounds, and the policy's round (default 60)")
    p.add_argument("--queues", dest="queues_file", metavar="FILE",
                   help="queues TOML ([[queue]] tables; docs/operations.md, \"Queues\"); "
                        "reloaded on SIGHUP")
    sec = p.add_argument_group("security (docs/security.md)")
    sec.add_argument("--tls-cert", help="the controller's TLS certificate (PEM); with --tls-key "
                                        "every port serves TLS")
    sec.add_argument("--tls-key", help="its private key (PEM)")
    sec.add_argument("--tls-client-ca", help="CA bundle (PEM) that signs node-agent client "
                                             "certificates: agents connect with mutual TLS")
    sec.add_argument("--agent-listen", metavar="HOST:PORT",
                     help="the mutual-TLS port for agents (default: --listen's port + 1)")
    sec.add_argument("--tokens", dest="tokens_file", metavar="FILE",
                     help="bearer-token hashes → tenants (TOML; `sia tokens add`); reloaded "
                          "on SIGHUP and when it changes")
    sec.add_argument("--allow-insecure", action="store_true", default=None,
                     help="allow plaintext and/or no tokens on a non-loopback address "
                          "(e.g. behind a TLS-terminating mesh); never on an open network")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (plain HTTP, "
                        "unauthenticated: a private address; default off)")
    add_logging_arguments(p)
    return p


async def serve(controller: Controller) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    seen = 0

    def on_signal() -> None:
        nonlocal seen
        seen += 1
        if seen > 1:  # a second signal: no more waiting
            sys.exit(1)
        stop.set()

    handlers = {signal.SIGTERM: on_signal, signal.SIGINT: on_signal,
                signal.SIGHUP: controller.reload}  # SIGHUP: tokens and queues files
    with signals.handled(loop, handlers):
        async with controller:
            await stop.wait()


def main(argv: list[str] | None = None) -> int:
    # A crash in native code (grpc, psycopg, numpy: a SIGSEGV was seen once in `sia
    # bench failover`) leaves every thread's Python traceback on stderr, i.e. in the
    # log or the journal, where it would otherwise leave only an exit status.
    with contextlib.suppress(io.UnsupportedOperation, ValueError):  # stderr is no file
        faulthandler.enable()
    args = parser().parse_args(argv)
    try:
        config = load_config(args.config, listen=args.listen, db_path=args.db_path,
                             store=args.store, policy=args.policy,
                             advertise=args.advertise, lease_ttl_s=args.lease_ttl_s,
                             round_duration=args.round_duration,
                             tls_cert=args.tls_cert, tls_key=args.tls_key,
                             tls_client_ca=args.tls_client_ca, agent_listen=args.agent_listen,
                             tokens_file=args.tokens_file, allow_insecure=args.allow_insecure,
                             metrics_listen=args.metrics_listen, policy_set=args.policy_set,
                             queues_file=args.queues_file)
        telemetry = setup_telemetry("sia-controller", prometheus=bool(config.metrics_listen))
        # after the config: its errors are plain lines
        configure_logging(fmt=args.log_format, level=args.log_level)
    except (ConfigError, ValueError) as err:  # ValueError: an OTEL_* or SIA_LOG_* setting
        print(f"sia-controller: {err}", file=sys.stderr)
        return 2
    log = structlog.get_logger("sia.controller")
    log.info("telemetry", traces=telemetry.traces_exporter, metrics=telemetry.metrics_exporter)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(Controller(config, telemetry=telemetry)))
    except ConfigError as err:  # e.g. an unreadable certificate, a store path that is a dir
        print(f"sia-controller: {err}", file=sys.stderr)
        return 2
    except (OSError, StoreError) as err:  # e.g. the port or the store is another's
        print(f"sia-controller: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were in place
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
