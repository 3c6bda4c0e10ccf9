"""A database restore sets the lease's term back (the row holds the backup's term,
below terms led since): the pair, real `sia-controller` processes, heals by itself.
The first leader's term is one the agents have seen, or below; an agent's Register
says so (`highest_term`), and that leader steps down raising the store's term; the
next leader's term is above every one the agents know, and they register with it.
No manual step, no agent restart."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from test_failover import cluster, terms_in_order, until

from sia_grpc.controller.stores import open_store
from sia_grpc.nodeagent import AgentStatus, NodeAgent
from sia_grpc.testing.controllers import ControllerPair

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(180)]

LED = 10  # the terms led before the "backup" ended at this one


def lease_term(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT term FROM lease").fetchone()[0]


def set_term(dsn: str, term: int) -> None:
    """The lease row as a restore leaves it: an old term, nobody holding it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE lease SET term = %s, holder = '', expires_at = 0", (term,))


async def restart_at(pair: ControllerPair, dsn: str, term: int) -> None:
    """Both controllers stopped, the lease's term set to `term`, both started again."""
    await pair.stop()
    set_term(dsn, term)
    for n in pair.nodes:
        await n.start(dsn)


async def healed(pair: ControllerPair, dsn: str, agents: list[NodeAgent], seen: int) -> int:
    """Wait until one controller leads, at a term above `seen`, and every agent has
    registered with it; that term."""
    async def done() -> bool:
        if await pair.leader() is None or lease_term(dsn) <= seen:
            return False
        return all(a.status is AgentStatus.REGISTERED and a.term == lease_term(dsn)
                   for a in agents)

    await until(done, f"the agents to register with a leader above term {seen}")
    return lease_term(dsn)


async def test_after_a_restore_the_pair_takes_a_term_above_what_the_agents_saw(
        postgres_dsn, tmp_path):
    open_store(postgres_dsn).close()  # the schema, then terms led up to LED
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO lease (name, holder, address, term, expires_at)"
                     " VALUES ('controller', '', '', %s, 0)", (LED,))
    async with cluster(postgres_dsn) as (pair, agents):
        seen = await healed(pair, postgres_dsn, agents, LED)  # LED + 1, seen by all
        for i, n in enumerate(pair.nodes):
            n.log = str(tmp_path / f"controller-{i}.log")

        # Restored to the term before it: the next leader takes the very term the
        # agents saw, from another controller. Its number is no proof: it steps down.
        # Then restored far below: the next leader's term is one the agents refuse.
        for restored, case in ((seen - 1, "the agents' own term"), (3, "far below")):
            started = time.monotonic()
            await restart_at(pair, postgres_dsn, restored)
            seen = await healed(pair, postgres_dsn, agents, seen)
            print(f"restored {case}: the pair started to every agent registered at "
                  f"term {seen}: {time.monotonic() - started:.2f} s")

        for agent in agents:
            terms_in_order(agent)  # nothing of a reused term was ever sent to them
            assert 4 not in agent.terms
        logs = "".join(Path(n.log).read_text() for n in pair.nodes)
        assert (f"an agent has seen term {seen - 1} >= ours (4): the store's term went back "
                "(a restore?); stepping down to take a higher one") in logs
