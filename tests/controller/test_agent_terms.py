"""The term an agent's Register carries (`highest_term`), on a SQLite controller,
whose term is always 1: an agent that has seen no more registers; one that has
seen a higher term (it followed controllers on a shared store) is refused with
what the operator must do, and the controller leads on; a term no database holds
is refused naming the field."""

from __future__ import annotations

import grpc
import pytest

from sia_grpc.api import AgentServiceStub, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.leadership import SQLITE_TERM
from sia_grpc.controller.shell.server import Controller
from sia_grpc.controller.stores import MAX_TERM

pytestmark = pytest.mark.timeout(60)

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          inline_solver=True)


async def _register(channel: grpc.aio.Channel, node: str, highest_term: int):
    """A Connect stream's first reply to a Register carrying `highest_term`."""
    call = AgentServiceStub(channel).Connect(timeout=30)
    await call.write(pb.AgentMessage(register=pb.Register(
        node_id=node, gpus=[pb.GpuInventory(gpu_type="rtx", count=4)], agent_version="t",
        highest_term=highest_term)))
    try:
        return await call.read()
    finally:
        call.cancel()


async def _refusal(channel: grpc.aio.Channel, node: str, highest_term: int) -> ApiError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _register(channel, node, highest_term)
    return ApiError.from_rpc_error(info.value)


async def test_a_sqlite_controller_refuses_an_agent_that_saw_a_higher_term_saying_why():
    async with Controller(CONFIG) as c, \
            grpc.aio.insecure_channel(f"127.0.0.1:{c.port}") as ch:
        for seen in (0, SQLITE_TERM):  # a new agent, and one that saw this controller
            reply = await _register(ch, f"n{seen}", seen)
            assert reply.WhichOneof("kind") == "registered" and reply.term == SQLITE_TERM

        err = await _refusal(ch, "n7", 7)
        assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "TERM_AHEAD"
        assert err.metadata == {"seen": "7", "term": str(SQLITE_TERM)}
        assert "has seen term 7" in err.message and "restart the agent" in err.message
        assert "n7" not in c.agents and c.leading and c.term == SQLITE_TERM

        err = await _refusal(ch, "n8", MAX_TERM)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.field == "register.highest_term"
