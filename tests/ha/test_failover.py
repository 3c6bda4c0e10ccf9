"""A controller pair as real `sia-controller` processes on one PostgreSQL store,
modeled agents (in this process) and a client given both addresses: the leader
SIGKILLed, SIGSTOPped past its lease, or cut off from the database. Each time the
standby leads within a few seconds, every accepted job is there, the old leader
comes back (if at all) as a standby, and at no moment do the two both lead: no
agent ever receives a message of a term older than one it has seen, and the health
checks never find both SERVING."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from urllib.parse import urlsplit

import grpc
import pytest

from sia_grpc.api import ClusterServiceStub, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient
from sia_grpc.nodeagent import AgentConfig, AgentStatus, NodeAgent
from sia_grpc.testing.controllers import SERVING, ControllerNode, ControllerPair
from sia_grpc.testing.tcpproxy import TcpProxy

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(180)]

TTL_S = 2.0  # the lease: a failover takes about this long
WAIT_S = 30.0  # real seconds a condition may take before the test fails
CALL_S = 15.0  # the client's deadline per call: a failover fits in it
SPEC = pb.JobSpec(name="c10", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE,
                  max_gpus=2)


async def until(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def cluster(dsn: str, *, proxied: bool = False, agents: int = 2,
                  time_scale: float = 1.0):
    proxies = []
    if proxied:
        pg_port = urlsplit(dsn).port
        proxies = [await TcpProxy.start("127.0.0.1", pg_port) for _ in range(2)]
    pair = ControllerPair.on_free_ports(ttl=TTL_S, proxies=tuple(proxies) or None)
    nodes: list[NodeAgent] = []
    watcher = None
    try:
        for n in pair.nodes:
            await n.start(dsn)
        watcher = asyncio.create_task(pair.watch())
        for i in range(agents):
            agent = NodeAgent(AgentConfig(node_id=f"n{i}", controller=pair.target,
                                          gpu_type="rtx", num_gpus=4, time_scale=time_scale,
                                          backoff_base_s=0.05, backoff_cap_s=0.5))
            await agent.start()
            nodes.append(agent)
        yield pair, nodes
    finally:
        if watcher is not None:
            watcher.cancel()
        for agent in nodes:
            await agent.close()
        await pair.stop()
        for p in proxies:
            await p.close()


def terms_in_order(agent: NodeAgent) -> None:
    """Every message the agent received came in non-decreasing term order: no
    deposed leader spoke after its successor."""
    terms = list(agent.terms)
    assert terms == sorted(terms), terms
    assert agent.stale_refused == 0


async def accepted_jobs(sia: AsyncSiaClient, accepted: list[str]) -> None:
    present = {j.job_id async for j in sia.list()}
    assert set(accepted) <= present, set(accepted) - present


async def start_and_load(pair: ControllerPair, agents: list[NodeAgent], sia: AsyncSiaClient,
                         jobs: int = 4) -> tuple[ControllerNode, list[str]]:
    leader = await until(pair.leader, "one leader")
    await until(lambda: _registered(agents), "the agents to register")
    accepted = [(await sia.submit(SPEC)).job_id for _ in range(jobs)]
    await until(lambda: _some_running(sia), "a job to run")
    return leader, accepted


async def _registered(agents: list[NodeAgent]) -> bool:
    return all(a.status is AgentStatus.REGISTERED for a in agents)


async def _some_running(sia: AsyncSiaClient) -> bool:
    return any([j.state == pb.JOB_STATE_RUNNING async for j in sia.list()])


async def test_sigkill_the_leader_the_standby_leads_and_nothing_is_lost(postgres_dsn):
    async with cluster(postgres_dsn) as (pair, agents), \
            AsyncSiaClient(pair.target, timeout=CALL_S) as sia:
        leader, accepted = await start_and_load(pair, agents, sia)
        request = uuid.uuid4().hex
        first = await sia.submit(SPEC, request_id=request)
        running = {(r.job_id, r.generation) for a in agents for r in a.backend.running()}
        killed = time.monotonic()
        leader.proc.kill()
        # A create right away: the client finds the new leader within its deadline.
        accepted.append((await sia.submit(SPEC)).job_id)
        failover_s = time.monotonic() - killed
        new = await until(pair.leader, "the standby to lead")
        assert new is not leader
        again = await sia.submit(SPEC, request_id=request)  # a retry: the same job
        assert again.job_id == first.job_id
        await accepted_jobs(sia, [*accepted, first.job_id])
        await until(lambda: _registered(agents), "the agents to re-register")
        # Running workers kept running across the failover (no needless restart).
        still = {(r.job_id, r.generation) for a in agents for r in a.backend.running()}
        assert running <= still or not running
        for agent in agents:
            terms_in_order(agent)
            assert agent.term >= 2
        assert pair.both_serving == []
        print(f"failover (SIGKILL to the first CreateJob on the new leader): {failover_s:.2f} s")


async def test_a_paused_leader_comes_back_as_a_standby(postgres_dsn):
    async with cluster(postgres_dsn) as (pair, agents), \
            AsyncSiaClient(pair.target, timeout=CALL_S) as sia:
        leader, accepted = await start_and_load(pair, agents, sia)
        standby = pair.b if leader is pair.a else pair.a
        leader.proc.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: _serving(standby), "the standby to lead")
            # A paused leader does not refuse a call, it hangs: the first try waits
            # out half the deadline there. Paused inside a write, it also held the
            # revision's row lock, and the new leader's writes timed out until it
            # resumed (this create's deadline ran out in the full suite, 3 times on
            # 2026-12-01/02); the server now ends a transaction left idle
            # (stores/postgres.py). A client's retry with the same request_id, as the
            # SDK's callers do, is one job.
            request = f"paused-{uuid.uuid4().hex}"
            try:
                job = await sia.submit(SPEC, request_id=request)
            except ApiError as err:
                if err.code != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                print(f"create after the pause: {err}; retried")
                job = await sia.submit(SPEC, request_id=request)
            accepted.append(job.job_id)
        finally:
            leader.proc.send_signal(signal.SIGCONT)
        # Resumed past its lease: it acts as leader no more (its first look at the
        # clock says so), and steps down.
        await until(lambda: _refuses(leader, standby), "the old leader to name the new one")
        assert await leader.health() != SERVING
        await accepted_jobs(sia, accepted)
        await until(lambda: _registered(agents), "the agents on the new leader")
        for agent in agents:
            terms_in_order(agent)
        assert pair.both_serving == []


async def test_a_leader_cut_off_from_the_database_steps_down_first(postgres_dsn):
    async with cluster(postgres_dsn, proxied=True) as (pair, agents), \
            AsyncSiaClient(pair.target, timeout=CALL_S) as sia:
        leader, accepted = await start_and_load(pair, agents, sia)
        standby = pair.b if leader is pair.a else pair.a
        old_term = agents[0].term
        leader.proxy.partition()  # its renewals hang; the standby's path is intact
        await until(lambda: _serving(standby), "the standby to lead")
        accepted.append((await sia.submit(SPEC)).job_id)
        await until(lambda: _all_above(agents, old_term), "the agents on the new leader")
        leader.proxy.heal()
        await until(lambda: _refuses(leader, standby), "the old leader back as a standby")
        await accepted_jobs(sia, accepted)
        # Every directive's term, as the agents received them: the old leader sent
        # nothing once its successor had spoken, and never after it was cut off.
        for agent in agents:
            terms_in_order(agent)
        assert pair.both_serving == []


async def _serving(node: ControllerNode) -> bool:
    return await node.health() == SERVING


async def _all_above(agents: list[NodeAgent], term: int) -> bool:
    return all(a.term > term and a.status is AgentStatus.REGISTERED for a in agents)


async def _refuses(old: ControllerNode, new: ControllerNode) -> bool:
    """Whether `old` answers as a standby naming `new`."""
    async with grpc.aio.insecure_channel(old.address) as ch:  # no client: it would follow
        try:
            await ClusterServiceStub(ch).GetCluster(pb.GetClusterRequest(), timeout=2)
        except grpc.aio.AioRpcError as exc:
            err = ApiError.from_rpc_error(exc)
            return err.reason == "NOT_LEADER" and err.metadata.get("leader") == new.address
    return False
