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
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog

from sia_grpc import signals
from sia_grpc.nodeagent.agent import NodeAgent
from sia_grpc.nodeagent.config import AgentConfig, AgentConfigError
from sia_grpc.nodeagent.gpus import (
    NodeGpus,
    parse_gpu_spec,
    resolve_inventory,
    unknown_type_warning,
)
from sia_grpc.nodeagent.isolation.identity import (
    DEFAULT_UID_RANGE,
    parse_uid_range,
    parse_user,
)
from sia_grpc.nodeagent.isolation.levels import REQUESTS
from sia_grpc.nodeagent.torchworkers.environment import DEFAULT_PASS_ENV
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
    _add_node_arguments(p)
    _add_worker_arguments(p)
    _add_isolation_arguments(p)
    _add_tls_arguments(p)
    add_logging_arguments(p)
    return p


def _add_node_arguments(p: argparse.ArgumentParser) -> None:
    """The node: its controller, its name, its workers' kind and its GPUs."""
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


def _add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """How workers run (torch's folders and time limits, modeled pacing), and the stream."""
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


def _add_isolation_arguments(p: argparse.ArgumentParser) -> None:
    iso = p.add_argument_group(
        "isolation (torch back-end)",
        "how a job is kept apart from the agent and from other tenants' jobs "
        "(docs/security.md, \"Node isolation\"): sandbox = user + a bubblewrap sandbox "
        "per worker (own pid/IPC/mount namespaces, read-only system and Python, private "
        "/tmp); user = a uid per job (no new privileges, no groups), a cgroup per job "
        "(memory, pids, cpuset, devices), private 0700 folders, an allow-listed "
        "environment and an authenticated worker channel; none = workers run as the "
        "agent (one user's own machine only)")
    iso.add_argument("--isolation", choices=REQUESTS, default=os.environ.get(
        "SIA_ISOLATION", "strict"),
        help="strict (default): the strongest level this host allows, at least user; "
             "refuse to start without it. auto: the strongest level, none included "
             "(make demo, local clusters). sandbox|user|none: exactly that "
             "(env SIA_ISOLATION)")
    iso.add_argument("--uid-range", type=_uid_range, default=DEFAULT_UID_RANGE,
                     metavar="FIRST-LAST",
                     help="per-job uids for tenants without a fixed one (default "
                          f"{DEFAULT_UID_RANGE[0]}-{DEFAULT_UID_RANGE[1]})")
    iso.add_argument("--tenant-user", type=_tenant_user, action="append", default=[],
                     metavar="TENANT=UID[:GID]",
                     help="run every job of TENANT as this uid/gid (repeatable; the Slurm "
                          "way: its files keep one owner on every node)")
    iso.add_argument("--memory-per-gpu", type=_mib, metavar="MIB",
                     help="host memory limit per GPU a job holds here, unless its spec "
                          "sets memory_mib_per_gpu (default: an equal share of 90%% of the "
                          "host's memory)")
    iso.add_argument("--pids-max", type=int, default=4096, metavar="N",
                     help="processes and threads a job may have on this node (default 4096)")
    iso.add_argument("--sandbox-ro", action="append", default=[], metavar="PATH",
                     help="sandbox: also show the jobs PATH, read-only (e.g. the shared "
                          "folder of training code; repeatable)")
    iso.add_argument("--worker-env", action="append", default=[], metavar="PATTERN",
                     help="pass the agent's variables matching PATTERN to workers, beside "
                          f"{' '.join(DEFAULT_PASS_ENV)} (repeatable; never SIA_*)")


def _add_tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca", metavar="FILE",
                   help="CA certificate (PEM) of the controller: connect with TLS")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="this node's client certificate (PEM; CN or SAN = --node-id)")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")


def _uid_range(text: str) -> tuple[int, int]:
    try:
        return parse_uid_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tenant_user(text: str) -> tuple[str, tuple[int, int]]:
    tenant, sep, user = text.partition("=")
    if not sep or not tenant:
        raise argparse.ArgumentTypeError(f"expected TENANT=UID[:GID], got {text!r}")
    try:
        return tenant, parse_user(user)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected MiB >= 1, got {text!r}")
    return value


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
    from sia_grpc.nodeagent.isolation.levels import IsolationUnavailable
    from sia_grpc.nodeagent.isolation.node import Limits, default_memory_per_gpu
    from sia_grpc.nodeagent.isolation.setup import build_isolation
    from sia_grpc.nodeagent.torchbackend import TorchBackend, safe_name

    workdir = (args.workdir or (
        Path(tempfile.gettempdir()) / f"sia-nodeagent-{safe_name(args.node_id)}")).absolute()
    memory = (args.memory_per_gpu << 20 if args.memory_per_gpu
              else default_memory_per_gpu(inventory.count))
    log = structlog.get_logger().bind(node_id=args.node_id)
    try:
        isolation = build_isolation(
            args.isolation, run_root=workdir / "run", node_id=args.node_id,
            tenants=dict(args.tenant_user), uid_range=args.uid_range,
            limits=Limits(memory_per_gpu=memory, pids_max=args.pids_max,
                          sandbox_ro=tuple(args.sandbox_ro)), log=log)
    except IsolationUnavailable as exc:
        raise _StartupError(str(exc)) from None
    log.info(f"isolation: {isolation.describe()}", isolation=str(isolation.level),
             requested=args.isolation)
    return TorchBackend(inventory.gpu_type, inventory.count, workdir=workdir,
                        checkpoint_root=args.checkpoint_root, emulate=inventory.emulated,
                        stop_grace_s=args.stop_grace, profile_timeout_s=args.profile_timeout,
                        node_id=args.node_id, isolation=isolation,
                        pass_env=(*DEFAULT_PASS_ENV, *args.worker_env))


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
    except _StartupError as exc:  # no isolation to be had: refused (fail closed)
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
