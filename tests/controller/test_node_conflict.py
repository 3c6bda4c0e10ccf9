"""Two agents with one node id: the second is refused (ALREADY_EXISTS, naming the
node and the connected peer) while the first one's stream is alive, and the first
and its jobs never notice. The same agent reconnecting, or a newcomer after the
first fell silent past the heartbeat timeout, replaces the old stream."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from sia_grpc.api import AgentServiceStub, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient
from sia_grpc.clock import WallClock
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.nodeagent import AgentStatus, NodeAgent
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = pytest.mark.timeout(120)

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)


class HeldClock(WallClock):
    """Controller time that moves only when the test says (timers sleep for real,
    and the config's are far longer than the test)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def time(self) -> float:
        return self.now


async def _open(channel: grpc.aio.Channel, node: str, instance: str):
    """A Connect stream that has sent Register; its first reply (or the error)."""
    call = AgentServiceStub(channel).Connect(timeout=30)
    await call.write(pb.AgentMessage(register=pb.Register(
        node_id=node, gpus=[pb.GpuInventory(gpu_type="rtx", count=4)], agent_version="t",
        instance_id=instance)))
    return call, await call.read()


async def test_second_stream_refused_while_the_first_is_alive_then_replaced_once_silent():
    clock = HeldClock()
    async with Controller(CONFIG, clock=clock) as c, \
            grpc.aio.insecure_channel(f"127.0.0.1:{c.port}") as ch:
        first, reply = await _open(ch, "n3", "agent-a")
        assert reply.WhichOneof("kind") == "registered"
        held = c.agents["n3"]

        second = AgentServiceStub(ch).Connect(timeout=30)
        await second.write(pb.AgentMessage(register=pb.Register(
            node_id="n3", gpus=[pb.GpuInventory(gpu_type="rtx", count=4)],
            instance_id="agent-b")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await second.read()
        err = ApiError.from_rpc_error(info.value)
        assert err.code == grpc.StatusCode.ALREADY_EXISTS and err.reason == "NODE_CONNECTED"
        peer = held.peer
        assert peer.startswith("ipv4:127.0.0.1:")
        assert err.metadata == {"node": "n3", "peer": peer}
        assert f"node 'n3' is already connected from {peer}" in err.message

        # The first stream is untouched: still the node's, and still talking.
        assert c.agents["n3"] is held and held.outbox.empty()
        clock.now += 1.0
        await first.write(pb.AgentMessage(heartbeat=pb.Heartbeat()))  # heard: alive
        async with asyncio.timeout(10):
            while held.heard < clock.now:
                await asyncio.sleep(0.01)

        # Silent for longer than heartbeat_timeout (a crashed agent's half-open
        # stream): a newcomer takes the node over, and the old stream is ended.
        clock.now += CONFIG.heartbeat_timeout + 1.0
        third, reply = await _open(ch, "n3", "agent-c")
        assert reply.WhichOneof("kind") == "registered"
        assert c.agents["n3"].instance_id == "agent-c"
        async with asyncio.timeout(10):
            assert await first.read() is grpc.aio.EOF
        third.cancel()


async def test_the_same_agent_reconnecting_replaces_its_own_stream_at_once():
    async with Controller(CONFIG, clock=HeldClock()) as c, \
            grpc.aio.insecure_channel(f"127.0.0.1:{c.port}") as ch:
        old, _ = await _open(ch, "n3", "agent-a")  # its agent thinks it dead; we do not
        new, reply = await _open(ch, "n3", "agent-a")
        assert reply.WhichOneof("kind") == "registered"
        async with asyncio.timeout(10):
            assert await old.read() is grpc.aio.EOF
        new.cancel()


async def test_a_second_real_agent_is_refused_and_the_first_ones_job_never_notices():
    cfg = replace(CONFIG, heartbeat_timeout=120.0)
    async with LocalCluster({"rtx": (1, 4)}, rate=60.0, config=cfg,
                            telemetry_interval=0.05) as lc, \
            AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(1)
        first = lc.agents["rtx-0"]
        h = await client.submit(pb.JobSpec(name="long", application="imagenet",
                                           adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4,
                                           batch_size=1024))
        async with asyncio.timeout(60):
            async for job in h.watch():
                if job.status.state == pb.JOB_STATE_RUNNING and job.status.progress > 0:
                    break
        before = [(r.job_id, r.generation) for r in first.backend.running()]
        assert before == [(job.job_id, job.status.generation)]

        attempts: list[int] = []

        def backoff(attempt: int) -> float:
            attempts.append(attempt)
            return 0.05

        second = NodeAgent(lc.agent_config("rtx-0", "rtx", 4), backoff=backoff)
        await second.start()
        try:
            async with asyncio.timeout(30):
                while second.conflicts < 3:
                    await asyncio.sleep(0.02)
            assert second.registrations == 0 and second.status is not AgentStatus.REGISTERED
            assert attempts[:3] == [0, 1, 2]  # the backoff grows: never reset by a refusal
            assert lc.controller.agents["rtx-0"].instance_id == first.instance_id
            assert first.registrations == 1 and first.status is AgentStatus.REGISTERED
            assert [(r.job_id, r.generation) for r in first.backend.running()] == before
            now = await h.job()
            assert now.status.state == pb.JOB_STATE_RUNNING
            assert now.status.generation == job.status.generation
            assert now.status.restarts == 0 and now.status.progress >= job.status.progress

            # Once the first agent is gone, the second (still retrying) takes over.
            await first.close()
            async with asyncio.timeout(30):
                while second.registrations == 0:
                    await asyncio.sleep(0.02)
            assert lc.controller.agents["rtx-0"].instance_id == second.instance_id
        finally:
            await second.close()
