"""Leaders' terms at the agent (ControllerMessage.term): a message from a deposed
leader (a term below the highest seen) changes nothing, and an agent given a
controller pair finds the leader (a standby's NOT_LEADER names it)."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from nodeagent_support import ScriptedController, run, started_agent, until

from sia_grpc.api import add_AgentServiceServicer_to_server, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.nodeagent import AgentStatus


@contextlib.asynccontextmanager
async def scripted():
    servicer = ScriptedController()
    server = grpc.aio.server()
    add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, port
    finally:
        await server.stop(None)


def directive(term: int, directive_id: int, **kw) -> pb.ControllerMessage:
    return pb.ControllerMessage(term=term, directive=pb.Directive(**run(directive_id, **kw)))


async def test_a_lower_terms_directive_is_refused_and_changes_nothing(controller, clock):
    ctl, port = controller
    ctl.term = 5
    async with started_agent(port, clock) as agent:
        s = await ctl.stream()
        await until(lambda: agent.term == 5)
        s.outbox.put_nowait(directive(4, 1))  # a deposed leader's, late
        s.outbox.put_nowait(directive(5, 2, job_id="job-2"))
        (ack,) = await s.wait("ack")
        assert ack.directive_id == 2 and ack.ok
        assert [r.job_id for r in agent.backend.running()] == ["job-2"]
        assert agent.stale_refused == 1 and list(agent.terms) == [5, 4, 5]
        s.outbox.put_nowait(directive(6, 3, job_id="job-3", gpus=(2,)))  # a newer leader
        await s.wait("ack", count=2)
        assert agent.term == 6


async def test_a_deposed_leaders_registration_is_refused_for_the_other_address(clock):
    async with scripted() as (old, old_port), scripted() as (new, new_port):
        new.term, old.term = 7, 6
        async with started_agent(new_port, clock,
                                 controller=f"127.0.0.1:{new_port},127.0.0.1:{old_port}") as a:
            (await new.stream()).drop()  # the agent moves to the next address: the old one
            await old.stream()
            await new.stream(1)  # refused there (term 6 < 7): back to the leader
            await until(lambda: a.status is AgentStatus.REGISTERED and a.registrations == 2)
            assert a.term == 7 and 6 in a.terms and a.stale_refused == 1


@pytest.mark.parametrize("named", [True, False])
async def test_a_standby_sends_the_agent_to_the_leader(clock, named):
    async with scripted() as (standby, s_port), scripted() as (leader, l_port):
        where = f"127.0.0.1:{l_port}"
        standby.refuse = 1
        standby.refuse_with = ApiError(
            grpc.StatusCode.UNAVAILABLE, "standby", reason="NOT_LEADER",
            metadata={"leader": where} if named else {}).to_status()
        backoffs: list[int] = []

        def backoff(attempt: int) -> float:
            backoffs.append(attempt)
            return 0.0
        async with started_agent(s_port, clock, backoff=backoff,
                                 controller=f"127.0.0.1:{s_port},{where}") as a:
            await leader.stream()
            await until(lambda: a.status is AgentStatus.REGISTERED)
            assert standby.attempts == 1
            # Named: straight there; else the next address, after the backoff.
            assert backoffs == ([] if named else [0])
    await asyncio.sleep(0)
