"""Two controllers on one PostgreSQL store, in this process: one leads, the other
is a standby that refuses calls naming the leader and reports NOT_SERVING; a
clean stop hands over at once; clients with both addresses follow the leader;
a retried CreateJob is never a second job across the failover."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sia_grpc.api import ClusterServiceStub, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.controller.stores import Fenced
from sia_grpc.nodeagent import AgentConfig, NodeAgent
from sia_grpc.testing.postgres import stalled_mid_pipeline

SPEC = pb.JobSpec(name="c10", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)
WAIT_S = 20.0  # real seconds a condition may take (a lease's TTL is 1.5 s here)


def config(dsn: str, **kw) -> ControllerConfig:
    return ControllerConfig(listen="127.0.0.1:0", store=dsn, round_duration=60.0,
                            inline_solver=True, lease_ttl_s=1.5, **kw)


async def until(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return value


@contextlib.asynccontextmanager
async def pair(dsn: str):
    a, b = Controller(config(dsn)), Controller(config(dsn))
    try:
        await a.start()
        await b.start()
        yield a, b
    finally:
        await a.close(grace=0)
        await b.close(grace=0)


def stuck(gate: threading.Event, call, *args, **kw):
    """`call` once `gate` opens (a store call over a connection that hangs)."""
    gate.wait(WAIT_S * 2)
    return call(*args, **kw)


def leaders(*controllers: Controller) -> list[Controller]:
    return [c for c in controllers if c.leading]


async def health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=5)
        return resp.status


async def test_one_leader_and_a_standby_that_names_it(postgres_dsn):
    async with pair(postgres_dsn) as (a, b):
        (leader,) = await until(lambda: leaders(a, b), "a leader")
        standby = b if leader is a else a
        await until(lambda: standby.leader_address == leader.advertised, "the standby to know")
        assert leaders(a, b) == [leader] and leader.term >= 1
        assert await health(leader.port) == health_pb2.HealthCheckResponse.SERVING
        assert await health(standby.port) == health_pb2.HealthCheckResponse.NOT_SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{standby.port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ClusterServiceStub(ch).GetCluster(pb.GetClusterRequest(), timeout=5)
        err = ApiError.from_rpc_error(info.value)
        assert err.code == grpc.StatusCode.UNAVAILABLE and err.reason == "NOT_LEADER"
        assert err.metadata == {"leader": f"127.0.0.1:{leader.port}"}
        assert not standby.state.jobs and not standby.rounds  # it loads nothing


async def test_a_client_with_both_addresses_follows_the_leader_over_a_handover(postgres_dsn):
    async with pair(postgres_dsn) as (a, b):
        (leader,) = await until(lambda: leaders(a, b), "a leader")
        standby = b if leader is a else a
        await until(lambda: standby.leader_address, "the standby to know the leader")
        # The standby first: its NOT_LEADER sends the client on.
        async with AsyncSiaClient(f"127.0.0.1:{standby.port},127.0.0.1:{leader.port}") as sia:
            first = await sia.submit(SPEC, request_id="req-1")
            assert sia._targets.current == f"127.0.0.1:{leader.port}"
            await leader.close()  # releases the lease: the standby need not wait for it
            (new,) = await until(lambda: leaders(a, b), "the standby to lead")
            assert new is standby and new.term > leader.term
            # The same request again (a client retrying a create it saw fail): the same job.
            again = await sia.submit(SPEC, request_id="req-1")
            assert again.job_id == first.job_id
            jobs = [j async for j in sia.list()]
            assert [j.job_id for j in jobs] == [first.job_id]
            assert sia._targets.current == f"127.0.0.1:{standby.port}"


async def test_a_leader_that_cannot_renew_steps_down_and_is_fenced(postgres_dsn):
    async with pair(postgres_dsn) as (a, b):
        (leader,) = await until(lambda: leaders(a, b), "a leader")
        other = b if leader is a else a
        await AsyncSiaClient(f"127.0.0.1:{leader.port}").submit(SPEC)
        old_term = leader.term
        # Its lease calls hang (as over a dead connection): it must stop acting as
        # leader before its lease expires in the database, then be fenced.
        gate = threading.Event()
        saved = {name: getattr(leader._store, name) for name in ("renew", "try_acquire")}
        for name, call in saved.items():
            setattr(leader._store, name, functools.partial(stuck, gate, call))
        try:
            await until(lambda: not leader.leading, "the leader to step down")
            await until(lambda: other.leading, "the other to lead")
            assert other.term == old_term + 1
            assert not leader.state.jobs  # its state dropped
            (old,), (new,) = leader.offices, other.offices
            assert old[0] == old_term and new[0] == other.term
            assert old[2] < new[1]  # it stopped acting before the other began
            with pytest.raises(Fenced):
                leader._store.set_drain("n1", "x")  # a write still in flight: refused
        finally:
            gate.set()
            for name, call in saved.items():
                setattr(leader._store, name, call)
        assert leaders(a, b) == [other]
        (job,) = [j async for j in AsyncSiaClient(f"127.0.0.1:{other.port}").list()]
        assert job.spec.name == "c10"


async def test_the_new_leader_ends_the_old_ones_transaction_left_open_inside_a_write(
        postgres_dsn):
    """The old leader's connection cut off inside a pipelined write (the revision's row
    lock held, the server waiting for the rest): the new leader ends it on taking
    office, so its first create goes through. Before: every write of the new leader
    failed on that lock until the old connection was seen dead (CI: a failover test's
    CreateJob on the new leader ran out its deadline)."""
    async with pair(postgres_dsn) as (a, b):
        (leader,) = await until(lambda: leaders(a, b), "a leader")
        other = b if leader is a else a
        await AsyncSiaClient(f"127.0.0.1:{leader.port}").submit(SPEC)
        stalled = stalled_mid_pipeline(postgres_dsn, leader._store._application)
        try:
            await leader.close()
            await until(lambda: other.leading, "the other to lead")
            async with AsyncSiaClient(f"127.0.0.1:{other.port}", timeout=3.0) as sia:
                await sia.submit(SPEC)
                assert len([j async for j in sia.list()]) == 2
        finally:
            stalled.close()


@pytest.mark.parametrize(("field", "value", "match"), [
    ("lease_ttl_s", 0.0, "lease_ttl_s: must be positive"),
    ("advertise", "ctl-a.internal", "advertise: expected HOST:PORT")])
def test_the_ha_settings_are_checked(field, value, match):
    from sia_grpc.controller.config import ConfigError
    with pytest.raises(ConfigError, match=match):
        ControllerConfig(**{field: value})


async def test_a_sqlite_controller_leads_at_once_at_term_1(tmp_path):
    async with Controller(ControllerConfig(listen="127.0.0.1:0", db_path=str(tmp_path / "s.db"),
                                           inline_solver=True)) as c:
        assert c.leading and c.term == 1
        assert await health(c.port) == health_pb2.HealthCheckResponse.SERVING


async def test_an_agent_reconnecting_to_its_leader_at_its_own_term_leaves_it_leading(
        postgres_dsn):
    """Once registered, an agent's highest term is its leader's own: its reconnect (a
    dropped stream) carries that term, and must not read as a restored store's term
    handed out twice (which would unseat the leader on every reconnect)."""
    async with pair(postgres_dsn) as (a, b):
        (leader,) = await until(lambda: leaders(a, b), "a leader")
        agent = NodeAgent(AgentConfig(node_id="n0", controller=f"127.0.0.1:{leader.port}",
                                      gpu_type="rtx", num_gpus=4, backoff_base_s=0.05,
                                      backoff_cap_s=0.2))
        await agent.start()
        try:
            await until(lambda: agent.registrations == 1, "the agent to register")
            term = leader.term
            assert agent.term == term
            leader.agents["n0"].outbox.put_nowait(None)  # the leader ends its stream
            await until(lambda: agent.registrations == 2, "the agent to register again")
            assert leaders(a, b) == [leader] and leader.term == agent.term == term
            assert [o[0] for o in leader.offices] == [term]  # never stepped down
            assert agent.stale_refused == 0
        finally:
            await agent.close()
