"""A whole cluster in one process: a controller and modeled node agents over
real loopback gRPC, at one time rate (`rate`× faster than real time).

Used by `sia replay`, `make demo`, `sia bench control-plane` and the end-to-end
tests. Agents can also be started as separate processes (`spawn_agent`), which
is how a test kills one with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sia_grpc.clock import ScaledClock
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.nodeagent import AgentConfig, NodeAgent


def node_names(spec: Mapping[str, tuple[int, int]]) -> list[tuple[str, str, int]]:
    """`{"rtx": (3, 8)}` → [("rtx-0", "rtx", 8), ...]: the nodes of a cluster spec."""
    return [(f"{t}-{i}", t, per) for t, (count, per) in spec.items() for i in range(count)]


async def stop_agents(agents: Sequence[subprocess.Popen], grace_s: float = 30.0) -> None:
    """SIGTERM to each agent process (it checkpoints and stops its workers), SIGKILL
    to any still running `grace_s` later (`sia demo`, `make gpu-check`)."""
    for p in agents:
        p.terminate()
    for p in agents:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(p.wait, grace_s)
        if p.poll() is None:
            p.kill()


@dataclass
class LocalCluster:
    nodes: Mapping[str, tuple[int, int]]  # GPU type -> (nodes, GPUs per node)
    rate: float = 1.0  # controller and modeled seconds per real second
    config: ControllerConfig = field(default_factory=lambda: ControllerConfig(
        listen="127.0.0.1:0", db_path=":memory:"))
    telemetry_interval: float | None = None  # real s between reports; None: 20 cluster s
    telemetry: object | None = None
    controller: Controller | None = None
    agents: dict[str, NodeAgent] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def target(self) -> str:
        assert self.controller is not None
        return f"127.0.0.1:{self.controller.port}"

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self, *, agents: bool = True) -> None:
        # Heartbeats at least every 0.1 real seconds apart, and 2 real seconds of
        # silence before an agent is lost, however fast the clock runs.
        self.config = replace(
            self.config, heartbeat_interval=max(self.config.heartbeat_interval, 0.1 * self.rate),
            heartbeat_timeout=max(self.config.heartbeat_timeout, 2.0 * self.rate))
        self.controller = Controller(self.config, clock=ScaledClock(self.rate),
                                     telemetry=self.telemetry)
        await self.controller.start()
        if agents:
            for name, gpu_type, gpus in node_names(self.nodes):
                await self.add_agent(name, gpu_type, gpus)

    @property
    def report_every(self) -> float:
        """Real seconds between agent reports: a third of a 60 s round by default,
        so the controller sees each job's progress every round."""
        return self.telemetry_interval or min(2.0, 20.0 / self.rate)

    def agent_config(self, name: str, gpu_type: str, gpus: int) -> AgentConfig:
        return AgentConfig(node_id=name, controller=self.target, gpu_type=gpu_type,
                           num_gpus=gpus, time_scale=self.rate,
                           telemetry_interval_s=self.report_every,
                           backoff_base_s=0.05, backoff_cap_s=1.0, close_grace_s=0.5)

    async def add_agent(self, name: str, gpu_type: str, gpus: int) -> NodeAgent:
        agent = NodeAgent(self.agent_config(name, gpu_type, gpus))
        await agent.start()
        self.agents[name] = agent
        return agent

    def spawn_agent(self, name: str, gpu_type: str, gpus: int,
                    count: int = 1) -> subprocess.Popen:
        """The same agent as its own process (`python -m sia_grpc.nodeagent`); with
        `count` > 1, that many agents in one process, named NAME-0 .. NAME-(count-1)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "sia_grpc.nodeagent", "--controller", self.target,
             "--node-id", name, "--gpus", f"{gpu_type}:{gpus}", "--time-scale", str(self.rate),
             "--telemetry-interval", str(self.report_every), "--log-format", "json",
             "--count", str(count)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.processes[name] = proc
        return proc

    async def restart_controller(
            self, while_down: Callable[[], Awaitable[object]] | None = None) -> None:
        """Stop the controller and start a new one on the same port and store (after
        `while_down()`, if given: what a test awaits with no controller up)."""
        assert self.controller is not None
        port = self.controller.port
        await self.controller.close(grace=0.2)
        if while_down is not None:
            await while_down()
        self.config = replace(self.config, listen=f"127.0.0.1:{port}")
        self.controller = Controller(self.config, clock=ScaledClock(self.rate),
                                     telemetry=self.telemetry)
        await self.controller.start()

    async def wait_registered(self, count: int, timeout: float = 20.0) -> None:
        assert self.controller is not None
        async with asyncio.timeout(timeout):
            while len(self.controller.agents) < count:
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        await asyncio.gather(*(a.close() for a in self.agents.values()),
                             return_exceptions=True)
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)
        if self.controller is not None:
            await self.controller.close(grace=0.2)
