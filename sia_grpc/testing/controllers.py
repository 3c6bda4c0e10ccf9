"""A controller pair as real `sia-controller` processes on one PostgreSQL store, for
the HA tests (tests/ha, tests/chaos) and `sia bench failover`.

    pair = ControllerPair.on_free_ports(ttl=2.0, env=FAST_ROUNDS)
    for n in pair.nodes: await n.start(dsn)
    leader = await pair.leader()          # the one SERVING, or None
    leader.proc.kill()                    # SIGKILL; `await leader.start(dsn)` again: a standby

A node may reach the database through its own `TcpProxy` (`proxy=`), which a
test cuts to partition that controller from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sia_grpc.testing.ports import free_port
from sia_grpc.testing.tcpproxy import TcpProxy

__all__ = ["FAST_ROUNDS", "SERVING", "ControllerNode", "ControllerPair", "via_proxy"]

SERVING = health_pb2.HealthCheckResponse.SERVING
# Rounds every second, an arrival's round 0.2 s after it, heartbeats twice a second,
# the solver in the controller's process: a cluster that moves in seconds, not minutes.
FAST_ROUNDS = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
               "SIA_ROUND_DURATION": "1", "SIA_EARLY_ROUND_DELAY": "0.2",
               "SIA_HEARTBEAT_INTERVAL": "0.5", "SIA_HEARTBEAT_TIMEOUT": "30",
               "SIA_INLINE_SOLVER": "true"}


def via_proxy(dsn: str, proxy: TcpProxy) -> str:
    """The same database's DSN, through `proxy` (on the same host)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.netloc.rpartition(':')[0]}:{proxy.port}"))


@dataclass
class ControllerNode:
    """One sia-controller process, its address, and (optionally) its own path to
    the database through a proxy that can be cut."""

    port: int
    ttl: float
    env: Mapping[str, str] = field(default_factory=dict)
    proxy: TcpProxy | None = None
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0  # processes started on this port so far
    log: str | None = None  # a file its output is appended to (else discarded)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, dsn: str) -> None:
        if self.proxy is not None:
            dsn = via_proxy(dsn, self.proxy)
        self.starts += 1
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(self.log, "ab")) if self.log \
                else asyncio.subprocess.DEVNULL
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sia_grpc.controller", "--listen", self.address,
                "--store", dsn, "--lease-ttl", str(self.ttl), "--log-format", "json",
                # (faulthandler from the first import on: a native crash's traceback
                # lands in the log even before main() runs)
                stdout=out, stderr=out,
                env={**os.environ, "PYTHONFAULTHANDLER": "1", **self.env})

    async def health(self, timeout: float = 0.5) -> int | None:
        """Its health status (SERVING only on the leader); None if it does not answer."""
        try:
            async with grpc.aio.insecure_channel(self.address) as ch:
                # (the stubs' HealthStub lacks the methods its __init__ sets)
                resp = await health_pb2_grpc.HealthStub(ch).Check(  # type: ignore[attr-defined]
                    health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return None
        return resp.status

    def kill(self) -> None:
        """SIGKILL (a resumed SIGCONT first, should it be stopped)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()

    async def stop(self) -> None:
        self.kill()
        if self.proc is not None:
            await self.proc.wait()


@dataclass
class ControllerPair:
    a: ControllerNode
    b: ControllerNode
    both_serving: list[float] = field(default_factory=list)  # when seen, if ever

    @classmethod
    def on_free_ports(cls, *, ttl: float, env: Mapping[str, str] = FAST_ROUNDS,
                      proxies: tuple[TcpProxy, TcpProxy] | None = None) -> ControllerPair:
        a, b = (ControllerNode(free_port(), ttl, env, proxies[i] if proxies else None)
                for i in range(2))
        return cls(a, b)

    @property
    def nodes(self) -> tuple[ControllerNode, ControllerNode]:
        return self.a, self.b

    @property
    def target(self) -> str:
        """Both addresses, as clients and agents are given them."""
        return f"{self.a.address},{self.b.address}"

    def other(self, node: ControllerNode) -> ControllerNode:
        return self.b if node is self.a else self.a

    async def leader(self) -> ControllerNode | None:
        serving = [n for n in self.nodes if await n.health() == SERVING]
        return serving[0] if len(serving) == 1 else None

    async def watch(self, every: float = 0.02) -> None:
        """Sample both health checks until cancelled; note any moment both serve."""
        while True:
            states = await asyncio.gather(*(n.health() for n in self.nodes))
            if all(s == SERVING for s in states):
                self.both_serving.append(time.monotonic())
            await asyncio.sleep(every)

    async def stop(self) -> None:
        for n in self.nodes:
            await n.stop()
