"""Issue 37's rule through failovers: a controller pair as real `sia-controller`
processes on one throwaway PostgreSQL store, modeled agents, and random operator
steps (submits, cancels, drains and undrains, and the leader SIGKILLed: the standby
takes office, the killed one comes back as the new standby). At each quiet point
every view of the new leader tells the store's story, checked by the same
`views_check.agree` as the one-controller test (tests/controller/test_views_agree.py):
`sia get`, `sia ls` and each job's last event say its stored state and reason, so do
a `sia watch` stream opened at the start (resumed through every failover after the
last revision it saw: nothing repeated, nothing skipped) and the dashboard's jobs
table; rounds are in (term, round) order and in the history, and no (term, round)
is ever named twice, across all the terms. Bounded (24 steps, under two minutes);
`SIA_CHAOS_SCALE=N` runs N times as many; skipped, saying why, without PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random

import pytest
from test_failover import CALL_S, SPEC, cluster, until
from views_check import DashboardJobs, RoundNames, WatchReplay, common_step, until_agreed

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.stores import open_store
from sia_grpc.dashboard import Dashboard
from sia_grpc.testing.controllers import ControllerNode, ControllerPair

SCALE = int(os.environ.get("SIA_CHAOS_SCALE", "1"))
STEPS = 24

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(60 + 150 * SCALE)]


async def _kill_the_leader(pair: ControllerPair, dsn: str) -> None:
    """SIGKILL the leader; once the standby leads, start the killed one again (it
    comes back as the standby) and wait until it answers."""
    leader = await until(pair.leader, "one leader")
    await leader.stop()
    await until(lambda: _leads(pair.other(leader)), "the standby to take office")
    await leader.start(dsn)
    await until(lambda: _answers(leader), "the killed controller back as the standby")


async def _leads(node: ControllerNode) -> bool:
    return await node.health() == 1  # (SERVING)


async def _answers(node: ControllerNode) -> bool:
    return await node.health() is not None


async def _step(rng: random.Random, pair: ControllerPair, dsn: str, sia: AsyncSiaClient,
                jobs: list[str]) -> str:
    op = rng.choice(["submit", "submit", "submit", "cancel", "drain", "undrain", "kill",
                     "kill", "wait"])
    if await common_step(op, rng, sia, jobs, SPEC):
        pass
    elif op == "kill":
        await _kill_the_leader(pair, dsn)
    else:
        await asyncio.sleep(0.3)
    return op


async def test_every_view_of_the_new_leader_tells_the_stores_story(postgres_dsn):
    """At every quiet point after a random step, the leaders killed along the way
    included, each view agrees with the PostgreSQL store, the resumed watch neither
    repeats nor skips a change, and no round's (term, round) is named twice."""
    rng = random.Random(3737)
    tasks: list[asyncio.Task] = []
    async with contextlib.AsyncExitStack() as stack:
        # (modeled agents 100x faster than the clock: jobs profile in a round or two,
        # so rounds are numbered, not skipped "no job has a profile yet")
        pair, _agents = await stack.enter_async_context(cluster(postgres_dsn,
                                                                time_scale=100.0))
        sia = await stack.enter_async_context(AsyncSiaClient(pair.target, timeout=CALL_S))
        dash_client = await stack.enter_async_context(
            AsyncSiaClient(pair.target, timeout=CALL_S))
        await until(pair.leader, "one leader")
        # The store as the leaders write it, read straight from the database (after
        # every view: it is never behind them).
        store = open_store(postgres_dsn)
        stack.callback(store.close)

        async def stored(job_id: str) -> pb.Job | None:
            found = await asyncio.to_thread(store.get_job, job_id)
            return None if found is None else found.job

        dash = await stack.enter_async_context(Dashboard(dash_client, listen="127.0.0.1:0"))
        stack.callback(lambda: [t.cancel() for t in tasks])
        watch, page = WatchReplay(sia), DashboardJobs(dash.url)
        tasks += [asyncio.create_task(watch.run()), asyncio.create_task(page.run())]
        async with asyncio.timeout(30):
            await page.opened.wait()
        names = RoundNames()
        jobs: list[str] = []
        kills = 0
        for k in range(STEPS * SCALE):
            op = await _step(rng, pair, postgres_dsn, sia, jobs)
            kills += op == "kill"
            problem = await until_agreed(sia, stored, (watch, page), names, timeout=30.0)
            assert not problem, (k, op, problem)
        assert kills, "the leader was killed at least once"
        assert len(names.terms) >= 2, f"numbered rounds in one term only: {names.starts}"
        assert pair.both_serving == [], "the two never led at once"
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
