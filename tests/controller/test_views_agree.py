"""Issue 37's rule as a property on a live controller: after random operator steps
(submits, cancels, drains and undrains, an agent killed and another added, a
controller restart), once the cluster is quiet every view tells the store's story:
`sia get` and `sia ls` show each job's stored state and reason, its last event in
the history says the same, and the rounds of `sia cluster` are in (term, round)
order, each finished one in the history. Bounded here (60 steps, seconds);
`SIA_CHAOS_SCALE=N` runs N times as many."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import replace

import pytest

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = pytest.mark.xdist_group("heavy")

SCALE = int(os.environ.get("SIA_CHAOS_SCALE", "1"))
CONFIG = ControllerConfig(listen="127.0.0.1:0", round_duration=60.0, early_round_delay=5.0,
                          heartbeat_interval=30.0, heartbeat_timeout=120.0,
                          inline_solver=True)
JOB = dict(application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE, max_gpus=4)
JOB_KINDS = (pb.EVENT_KIND_JOB_SUBMITTED, pb.EVENT_KIND_JOB_CHANGED)


async def _step(rng: random.Random, lc: LocalCluster, sia: AsyncSiaClient,
                jobs: list[str], k: int) -> str:
    op = rng.choice(["submit", "submit", "submit", "cancel", "drain", "undrain", "agent",
                     "restart", "wait"])
    if op == "submit":
        jobs.append((await sia.submit(pb.JobSpec(name=f"j{k}", **JOB))).job_id)
    elif op == "cancel" and jobs:
        await sia.cancel(rng.choice(jobs))
    elif op in ("drain", "undrain"):
        nodes = [n.name for n in (await sia.cluster()).nodes
                 if n.state != pb.NODE_STATE_LOST]
        if nodes:
            node = rng.choice(nodes)
            await (sia.drain(node, "test") if op == "drain" else sia.undrain(node))
    elif op == "agent" and lc.agents:
        name = rng.choice(sorted(lc.agents))
        await lc.agents.pop(name).close()
        await lc.add_agent(f"rtx-{k}", "rtx", 4)
    elif op == "restart":
        await lc.restart_controller()
    else:
        await asyncio.sleep(0.2)
    return op


async def _agree(lc: LocalCluster, sia: AsyncSiaClient) -> str:
    """'' when every view agrees with the store, else what disagrees. Each view is
    read before the store (its reads queue behind the writes of what was shown), so
    the store is never behind it; a round in between makes it ahead: the caller
    reads again."""
    c = lc.controller
    assert c is not None
    listed = {j.job_id: j.proto async for j in sia.list()}
    for job_id in listed:
        got = (await sia.get(job_id)).proto
        last = (await sia.events(job_id=job_id, kinds=list(JOB_KINDS), limit=1))[-1]
        stored = await c._in_store(c._store.get_job, job_id)
        assert stored is not None, job_id  # (listed: stored)
        said = (stored.job.status.state, stored.job.status.reason)
        for view, state, reason in (
                ("get", got.status.state, got.status.reason),
                ("ls", listed[job_id].status.state, listed[job_id].status.reason),
                ("its last event", last.state, last.reason)):
            if (state, reason) != said:
                return f"{job_id}: {view} {(state, reason)}, the store {said}"
    rounds = [(r.term, r.round) for r in await sia.rounds(limit=1000) if r.round]
    if rounds != sorted(rounds):
        return f"rounds out of order: {rounds}"
    finished = {(e.term, e.round) for e in await sia.events(
        kinds=[pb.EVENT_KIND_ROUND_FINISHED], limit=1000) if e.round}
    missing = [r for r in rounds[-20:] if r not in finished]
    return f"rounds not in the history: {missing}" if missing else ""


@pytest.mark.timeout(60 + 120 * SCALE)  # (60 steps take ~10 s here, ~70 s on a loaded machine)
async def test_every_view_tells_the_stores_story_after_random_operator_steps(tmp_path):
    rng = random.Random(37)
    config = replace(CONFIG, db_path=str(tmp_path / "sia.db"))
    async with LocalCluster({"rtx": (2, 4)}, rate=300.0, config=config,
                            telemetry_interval=0.05) as lc, \
            AsyncSiaClient(lc.target, timeout=15.0) as sia:
        await lc.wait_registered(2)
        jobs: list[str] = []
        for k in range(60 * SCALE):
            op = await _step(rng, lc, sia, jobs, k)
            # Quiet: the views converge (each change is written before it is shown).
            deadline = asyncio.get_running_loop().time() + 20.0
            while (problem := await _agree(lc, sia)) and \
                    asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            assert not problem, (k, op, problem)
