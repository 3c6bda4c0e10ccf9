"""Fixtures: a scripted controller on an ephemeral port, a manual clock, an agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from nodeagent_support import ScriptedController, started_agent

from sia_grpc.api import add_AgentServiceServicer_to_server
from sia_grpc.nodeagent import ManualClock, NodeAgent


@pytest.fixture
async def controller() -> AsyncIterator[tuple[ScriptedController, int]]:
    servicer = ScriptedController()
    server = grpc.aio.server()
    add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, port
    await server.stop(None)
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert left == [], left  # nothing of the agent's, the servicer's or the test's


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def agent(controller: tuple[ScriptedController, int],
                clock: ManualClock) -> AsyncIterator[NodeAgent]:
    """A started agent on the manual clock (default config: rtx×8, time_scale 60)."""
    async with started_agent(controller[1], clock) as a:
        yield a
