"""Issue 37's rule as a property on a live controller: after random operator steps
(submits, cancels, drains and undrains, an agent killed and another added, a
controller restart), once the cluster is quiet every view tells the store's story:
`sia get` and `sia ls` show each job's stored state and reason, its last event in
the history says the same, so does a `sia watch` stream opened at the start and
reopened after each restart where it left off (a change repeated or skipped fails),
and so does the dashboard's jobs table as its page reads it (`/jobs`, then the JSON
frames of `/events`); the rounds of `sia cluster` are in (term, round) order, each
finished one in the history, none named twice. The check is tests/views_check.py's,
shared with the PostgreSQL-pair variant (tests/ha/test_views_agree_failover.py).
Bounded here (60 steps, seconds); `SIA_CHAOS_SCALE=N` runs N times as many."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
from dataclasses import replace

import grpc
import pytest
from views_check import DashboardJobs, RoundNames, WatchReplay, common_step, until_agreed

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.dashboard import Dashboard
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = pytest.mark.xdist_group("heavy")

SCALE = int(os.environ.get("SIA_CHAOS_SCALE", "1"))
CONFIG = ControllerConfig(listen="127.0.0.1:0", round_duration=60.0, early_round_delay=5.0,
                          heartbeat_interval=30.0, heartbeat_timeout=120.0,
                          inline_solver=True)
# A channel with subchannels of its own: no connection shared with another client.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
JOB = dict(application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE, max_gpus=4)


async def _step(rng: random.Random, lc: LocalCluster, sia: AsyncSiaClient,
                jobs: list[str], k: int) -> str:
    op = rng.choice(["submit", "submit", "submit", "cancel", "drain", "undrain", "agent",
                     "restart", "wait"])
    if await common_step(op, rng, sia, jobs, pb.JobSpec(name=f"j{k}", **JOB)):
        pass
    elif op == "agent" and lc.agents:
        name = rng.choice(sorted(lc.agents))
        await lc.agents.pop(name).close()
        await lc.add_agent(f"rtx-{k}", "rtx", 4)
    elif op == "restart":
        await lc.restart_controller()
    else:
        await asyncio.sleep(0.2)
    return op


async def _stored(lc: LocalCluster, job_id: str) -> pb.Job | None:
    """The job as the (current) controller's store holds it."""
    c = lc.controller
    assert c is not None and c._store is not None
    stored = await c._in_store(c._store.get_job, job_id)
    return None if stored is None else stored.job


@pytest.mark.timeout(90 + 150 * SCALE)  # (60 steps: ~15 s here, ~80 s on a loaded machine)
async def test_every_view_tells_the_stores_story_after_random_operator_steps(tmp_path):
    """At every quiet point after a random operator step, get, ls, the job's last
    event, a resumed `sia watch` and the dashboard say each job's stored state and
    reason, and the rounds are ordered, in the history, and never named twice."""
    rng = random.Random(37)
    config = replace(CONFIG, db_path=str(tmp_path / "sia.db"))
    tasks: list[asyncio.Task] = []
    async with contextlib.AsyncExitStack() as stack:
        lc = await stack.enter_async_context(
            LocalCluster({"rtx": (2, 4)}, rate=300.0, config=config, telemetry_interval=0.05))
        sia = await stack.enter_async_context(AsyncSiaClient(lc.target, timeout=15.0))
        # The watch and the dashboard each on a client and connection of its own, as
        # `sia watch` and `sia dashboard` run, in processes of their own. (Sharing the
        # steps' connection, a stream reconnecting while the controller was down left it
        # in gRPC's reconnect backoff, about 1 s, longer than a read's retries with one
        # address: the steps' next read failed UNAVAILABLE with the controller back.)
        watch_client, dash_client = [await stack.enter_async_context(AsyncSiaClient(
            lc.target, timeout=15.0, channel=await stack.enter_async_context(
                grpc.aio.insecure_channel(lc.target, options=OWN_CONNECTION))))
            for _ in range(2)]
        dash = await stack.enter_async_context(Dashboard(dash_client, listen="127.0.0.1:0"))
        stack.callback(lambda: [t.cancel() for t in tasks])
        await lc.wait_registered(2)
        watch, page = WatchReplay(watch_client), DashboardJobs(dash.url)
        tasks += [asyncio.create_task(watch.run()), asyncio.create_task(page.run())]
        async with asyncio.timeout(20):
            await page.opened.wait()
        names = RoundNames()
        jobs: list[str] = []
        restarts = 0
        for k in range(60 * SCALE):
            op = await _step(rng, lc, sia, jobs, k)
            restarts += op == "restart"
            # Quiet: the views converge (each change is written before it is shown).
            problem = await until_agreed(sia, functools.partial(_stored, lc), (watch, page),
                                         names)
            assert not problem, (k, op, problem)
        assert jobs and page.frames, "the dashboard's stream sent jobs"
        # Each restart broke the watch (the SDK, or the loop in WatchReplay, reopened it).
        assert restarts == 0 or watch.revision, "the watch followed changes"
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
