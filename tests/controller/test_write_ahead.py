"""Write-ahead: a round's RUN leaves the controller only once the store write of the
state it follows from has committed (`Controller._process`). A leader killed between
the two would otherwise leave a worker running that the store does not know of, and
the next leader would stop it (a needless restart). With the write held, a real
NodeAgent hears no RUN until it commits; with the write failing, none at all."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from dataclasses import replace

import pytest

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.stores import StoreError
from sia_grpc.controller.stores.contract import Fenced
from sia_grpc.nodeagent import NodeAgent
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = pytest.mark.timeout(90)

# No round but the one the test posts: the timer's and the early rounds are far off.
CONFIG = ControllerConfig(listen="127.0.0.1:0", round_duration=1e6,
                          early_round_delay=1e6, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)
RATE = 100.0  # cluster seconds per real second: the profiling pass is quick
RIGID = pb.JobSpec(name="w", application="cifar10", adaptivity=pb.ADAPTIVITY_RIGID,
                   num_gpus=2, batch_size=256, epochs=1000)


class HeldWrite:
    """The store's `put_jobs`, held (or failing with `fail`) for any write that
    records a job in `state` (RUNNING: the round's) until `heal()`; others pass."""

    def __init__(self, store, *, state: int = pb.JOB_STATE_RUNNING,
                 fail: Exception | None = None) -> None:
        self.put_jobs, self.state, self.fail = store.put_jobs, state, fail
        self.tries = 0
        self.entered = threading.Event()
        self.healed = threading.Event()
        store.put_jobs = self

    def __call__(self, items, events=(), rounds=()):
        if not self.healed.is_set() and any(j.status.state == self.state
                                            for j, _ in items):
            self.tries += 1
            self.entered.set()
            if self.fail is not None:
                raise self.fail
            self.healed.wait(30)
        return self.put_jobs(items, events, rounds)

    def heal(self) -> None:
        self.healed.set()

    async def wait_tries(self, n: int) -> None:
        async with asyncio.timeout(30):
            while self.tries < n:
                await asyncio.sleep(0.01)


async def _until(what, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not what():
            await asyncio.sleep(0.01)


def _runs(agent: NodeAgent, job_id: str) -> list[pb.Directive]:
    return [d for _, d in agent.received
            if d.job_id == job_id and d.action == pb.Directive.ACTION_RUN]


async def _heard_all(lc: LocalCluster, agent: NodeAgent) -> None:
    """Everything the controller had queued to `agent` has arrived: a message put
    behind it in its stream's outbox (a copy of the Registered it sent first,
    harmless to the agent) has."""
    c = lc.controller
    heard = len(agent.terms)
    c.agents[agent.config.node_id].outbox.put_nowait(pb.ControllerMessage(
        registered=pb.Registered(heartbeat_interval_s=c.config.heartbeat_interval / RATE)))
    await _until(lambda: len(agent.terms) > heard)


async def _queued_job(lc: LocalCluster, sia: AsyncSiaClient) -> str:
    """A rigid job, profiled and waiting for the round that places it."""
    await lc.wait_registered(1)
    job = await sia.submit(RIGID)
    await _until(lambda: lc.controller.state.job(job.job_id).status.state
                 == pb.JOB_STATE_QUEUED)
    return job.job_id


def _stored_state(lc: LocalCluster, job_id: str) -> int:
    """The job's state in the store's file, read behind the controller's back (its
    writer thread is the one held)."""
    with contextlib.closing(sqlite3.connect(lc.config.db_path)) as conn:
        return conn.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]


@pytest.fixture
def config(tmp_path) -> ControllerConfig:
    return replace(CONFIG, db_path=str(tmp_path / "sia.db"))


async def test_a_rounds_run_waits_for_its_write_to_commit(config):
    async with LocalCluster({"rtx": (1, 4)}, rate=RATE, config=config) as lc, \
            AsyncSiaClient(lc.target) as sia:
        job_id = await _queued_job(lc, sia)
        (agent,) = lc.agents.values()
        c = lc.controller
        held = HeldWrite(c._store)
        c.post(sm.Tick(c.clock.time(), "test"))
        await asyncio.to_thread(held.entered.wait, 30)  # the round decided, its write held
        assert c.state.job(job_id).status.state == pb.JOB_STATE_RUNNING
        await _heard_all(lc, agent)
        assert _runs(agent, job_id) == []  # not before the commit
        assert _stored_state(lc, job_id) == pb.JOB_STATE_QUEUED
        held.heal()
        await _until(lambda: _runs(agent, job_id))
        assert _stored_state(lc, job_id) == pb.JOB_STATE_RUNNING
        await _until(lambda: [r.job_id for r in agent.backend.running()] == [job_id])
        assert held.tries == 1


@pytest.mark.parametrize("error", [StoreError("store: disk I/O error (injected)"),
                                   Fenced("store: fenced (injected)")],
                         ids=["store-error", "fenced"])
async def test_a_rounds_run_is_never_sent_while_its_write_fails(error, config):
    async with LocalCluster({"rtx": (1, 4)}, rate=RATE, config=config) as lc, \
            AsyncSiaClient(lc.target) as sia:
        job_id = await _queued_job(lc, sia)
        (agent,) = lc.agents.values()
        c = lc.controller
        failing = HeldWrite(c._store, fail=error)
        c.post(sm.Tick(c.clock.time(), "test"))
        await failing.wait_tries(1)
        await _heard_all(lc, agent)
        assert _runs(agent, job_id) == []
        # Retried (a second on), failing again: still nothing sent, to this job or any.
        await failing.wait_tries(2)
        await _heard_all(lc, agent)
        assert [d for _, d in agent.received if d.action == pb.Directive.ACTION_RUN] == []
        assert _stored_state(lc, job_id) == pb.JOB_STATE_QUEUED
        # Once a retry commits, the RUN follows it.
        failing.heal()
        await _until(lambda: _runs(agent, job_id))
        assert _stored_state(lc, job_id) == pb.JOB_STATE_RUNNING


async def test_a_cancel_stops_the_workers_only_once_the_job_is_cancelled_in_the_store(config):
    """A STOP that ends a job's record waits for that record's write too."""
    async with LocalCluster({"rtx": (1, 4)}, rate=RATE,
                            config=replace(config, early_round_delay=0.5)) as lc, \
            AsyncSiaClient(lc.target) as sia:
        # The early round may place the job before a poll sees it QUEUED: wait
        # for its workers alone.
        await lc.wait_registered(1)
        job_id = (await sia.submit(RIGID)).job_id
        (agent,) = lc.agents.values()
        await _until(lambda: [r.job_id for r in agent.backend.running()] == [job_id])
        held = HeldWrite(lc.controller._store, state=pb.JOB_STATE_CANCELLED)
        cancel = asyncio.create_task(sia.cancel(job_id))
        await asyncio.to_thread(held.entered.wait, 30)
        await _heard_all(lc, agent)
        stops = [d for _, d in agent.received
                 if d.job_id == job_id and d.action == pb.Directive.ACTION_STOP]
        assert stops == []
        assert [r.job_id for r in agent.backend.running()] == [job_id]
        assert _stored_state(lc, job_id) == pb.JOB_STATE_RUNNING
        held.heal()
        await cancel
        await _until(lambda: agent.backend.running() == [])
