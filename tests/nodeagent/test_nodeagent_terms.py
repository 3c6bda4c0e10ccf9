"""Leaders' terms at the agent (ControllerMessage.term): a message from a deposed
leader (a term below the highest seen) changes nothing, and an agent given a
controller pair finds the leader (a standby's NOT_LEADER names it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc
import pytest
from nodeagent_support import ScriptedController, run, started_agent, until

from sia_grpc.api import add_AgentServiceServicer_to_server, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.nodeagent import AgentStatus
from sia_grpc.testing.tls import self_signed


@contextlib.asynccontextmanager
async def scripted(creds: grpc.ServerCredentials | None = None):
    servicer = ScriptedController()
    server = grpc.aio.server()
    add_AgentServiceServicer_to_server(servicer, server)
    port = (server.add_insecure_port("127.0.0.1:0") if creds is None
            else server.add_secure_port("127.0.0.1:0", creds))
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


async def test_an_agent_given_one_name_with_several_records_finds_the_leader(clock):
    # ctl.test's records: a standby, then the leader; the standby names the leader by
    # the IP:PORT that is one of the records, so the agent goes straight there.
    async with scripted() as (standby, s_port), scripted() as (leader, l_port):
        where = f"127.0.0.1:{l_port}"
        standby.refuse, standby.refuse_with = 1, ApiError(
            grpc.StatusCode.UNAVAILABLE, "standby", reason="NOT_LEADER",
            metadata={"leader": where}).to_status()
        table = {"ctl.test": [("127.0.0.1", s_port), ("127.0.0.1", l_port)]}
        backoffs: list[int] = []

        def backoff(attempt: int) -> float:
            backoffs.append(attempt)
            return 0.0
        async with started_agent(s_port, clock, backoff=backoff, controller="ctl.test:50052",
                                 resolve=lambda host, port: table[host]) as a:
            await leader.stream()
            await until(lambda: a.status is AgentStatus.REGISTERED)
            assert standby.attempts == 1 and backoffs == []


async def test_an_agent_resolves_the_name_again_once_every_record_failed(clock):
    # The controller pods were replaced: the old records refuse, the new one serves.
    async with scripted() as (old_a, a_port), scripted() as (old_b, b_port), \
            scripted() as (new, n_port):
        old_a.refuse = old_b.refuse = 10**6  # for ever
        table = {"ctl.test": [("127.0.0.1", a_port), ("127.0.0.1", b_port)]}
        asked: list[str] = []

        def resolve(host: str, port: int) -> list[tuple[str, int]]:
            asked.append(host)
            return table[host]
        async with started_agent(a_port, clock, controller="dns:///ctl.test:50052",
                                 resolve=resolve) as a:
            await until(lambda: old_a.attempts and old_b.attempts)
            table["ctl.test"] = [("127.0.0.1", n_port), ("127.0.0.1", b_port)]
            await new.stream()
            await until(lambda: a.status is AgentStatus.REGISTERED)
            assert len(asked) >= 2 and old_a.attempts >= 1


async def test_tls_to_a_record_of_the_name_verifies_the_certificate_against_the_name(
        clock, tmp_path):
    # The certificate names localhost only; the agent dials the records' IPs.
    cert, key = self_signed("localhost")
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    files = {"tls_ca": str(tmp_path / "c.pem"), "tls_cert": str(tmp_path / "c.pem"),
             "tls_key": str(tmp_path / "k.pem")}  # (a client certificate: not checked here)
    with socket.socket() as down:  # bound, not listening: refused
        down.bind(("127.0.0.1", 0))
        refused = down.getsockname()[1]
    async with scripted(grpc.ssl_server_credentials([(key, cert)])) as (ctl, port):
        table = {"localhost": [("127.0.0.1", refused), ("127.0.0.1", port)]}
        async with started_agent(port, clock, controller=f"localhost:{port}",
                                 resolve=lambda host, p: table[host], **files) as a:
            await ctl.stream()
            await until(lambda: a.status is AgentStatus.REGISTERED)
            assert a.fatal is None
