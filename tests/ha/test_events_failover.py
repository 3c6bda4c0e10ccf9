"""The event history across a failover (issue 37): a controller pair as real
`sia-controller` processes on one PostgreSQL store, the leader SIGKILLed. The new
leader's events go on after the old one's (ids increase, never reused; terms say
who wrote what; the new leader's first is its taking office), a watch opened before
the failover resumes through it by id with nothing missed and nothing twice, rounds
are named by (term, round), and `sia events`/`sia describe` read it all."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from test_failover import CALL_S, SPEC, cluster, start_and_load, until

from sia_grpc.api import pb
from sia_grpc.api.story import kind_name
from sia_grpc.cli import main
from sia_grpc.client import AsyncSiaClient

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(180)]


async def test_the_history_goes_on_through_a_failover_and_a_watch_resumes(postgres_dsn,
                                                                          capsys):
    async with cluster(postgres_dsn) as (pair, agents), \
            AsyncSiaClient(pair.target, timeout=CALL_S) as sia:
        leader, accepted = await start_and_load(pair, agents, sia)
        watched: list[pb.Event] = []
        # (after the newest so far, as `sia events -w` does: 0 would be "from whenever
        # the stream opens", which on a loaded machine may be after the failover)
        start = (await sia.events(limit=1))[-1].id

        async def watch() -> None:
            async for event in sia.watch_events(after_id=start):
                watched.append(event)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)  # (the stream is open)
        before = await sia.events(limit=1000)
        leader.proc.kill()
        accepted.append((await sia.submit(SPEC)).job_id)  # on the new leader
        await until(lambda: _took_office(sia, 2), "the new leader's Leader event")
        await until(lambda: _events_of_term(sia, 2, "RoundFinished"), "a round of term 2")
        after = await sia.events(limit=1000)
        await until(lambda: _watched_up_to(watched, after[-1].id), "the watch to catch up")
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        rounds = await sia.rounds(limit=1000)
        await asyncio.to_thread(main, ["events", "--controller", pair.target, "-o", "wide",
                                       "--limit", "1000"])
        await asyncio.to_thread(main, ["describe", accepted[-1], "--controller", pair.target])
    ids = [e.id for e in after]
    assert ids == sorted(set(ids)), "ids increase and are never reused"
    assert {e.id for e in before} <= set(ids), "nothing of the old leader's is lost"
    terms = [e.term for e in after]
    assert terms == sorted(terms) and set(terms) == {1, 2}, terms
    first_of_2 = next(e for e in after if e.term == 2)
    assert kind_name(first_of_2.kind) == "Leader" and "term 2" in first_of_2.message
    # The watch opened before the failover: every event after it opened, once, in order.
    seen = [e.id for e in watched]
    assert seen == sorted(set(seen)), "none twice, in order"
    seen = [i for i in seen if i <= ids[-1]]  # (up to the list read: more came since)
    assert seen == [i for i in ids if i > start], "none missed"
    # Rounds carry their term; (term, round) names each and orders the list.
    named = [(r.term, r.round) for r in rounds]
    assert named == sorted(set(named)) and {t for t, _ in named} >= {2}
    out = capsys.readouterr().out
    assert "Leader" in out and "JobSubmitted" in out and "Job:" in out


async def _took_office(sia: AsyncSiaClient, term: int) -> bool:
    return any(e.term == term for e in await sia.events(kinds=[pb.EVENT_KIND_LEADER]))


async def _events_of_term(sia: AsyncSiaClient, term: int, kind: str) -> bool:
    return any(e.term == term and kind_name(e.kind) == kind
               for e in await sia.events(limit=1000))


async def _watched_up_to(watched: list[pb.Event], last: int) -> bool:
    return bool(watched) and watched[-1].id >= last
