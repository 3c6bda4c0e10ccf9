"""The lease in the store (leader election's foundation) and fencing, on both
back-ends: terms only grow, expiry is the database's clock, and a store fenced at
a term it no longer holds writes nothing."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_backends import Backend

from sia_grpc.api import pb
from sia_grpc.controller.stores import MAX_TERM, EventQuery, Fenced, Lease, StoreError


def job(job_id: str) -> pb.Job:
    return pb.Job(job_id=job_id, spec=pb.JobSpec(name=job_id))


def until_acquired(store, holder: str, ttl_s: float = 60.0, timeout: float = 10.0) -> int:
    """Poll until `holder` takes the lease (it expires by the database's clock)."""
    deadline = time.monotonic() + timeout
    while (term := store.try_acquire(holder, ttl_s)) is None:
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.002)
    return term


@pytest.fixture
def pair(backend: Backend):
    """Two controllers' stores on one database."""
    a, b = backend.open(), backend.open()
    yield a, b
    a.close()
    b.close()


def test_one_holder_at_a_time_and_terms_only_grow(pair):
    a, b = pair
    assert a.leader() is None
    assert a.try_acquire("c1", 30.0, address="10.0.0.1:50051") == 1
    assert b.try_acquire("c2", 30.0) is None  # held
    assert a.try_acquire("c1", 30.0) is None  # a holder renews; it does not acquire twice
    held = b.leader()
    assert isinstance(held, Lease) and held[:3] == ("c1", "10.0.0.1:50051", 1)
    assert 0 < held.expires_in_s <= 30.0
    assert not b.renew("c2", 1, 30.0)  # not the holder
    assert not a.renew("c1", 2, 30.0)  # not its term
    assert a.renew("c1", 1, 30.0)
    assert not b.release("c2", 1)
    assert a.release("c1", 1)
    assert not a.release("c1", 1)  # once
    assert b.leader() is None
    assert not a.renew("c1", 1, 30.0)  # released: acquire again
    assert b.try_acquire("c2", 30.0, address="10.0.0.2:50051") == 2  # the term goes on
    assert a.leader()[:3] == ("c2", "10.0.0.2:50051", 2)
    assert a.try_acquire("c1", 30.0) is None


def test_an_expired_lease_is_taken_at_the_next_term_and_cannot_be_renewed(pair):
    a, b = pair
    assert a.try_acquire("c1", 0.001) == 1  # expires at once, by the database's clock
    assert until_acquired(b, "c2") == 2
    assert not a.renew("c1", 1, 30.0)
    assert not a.release("c1", 1)
    assert b.leader().holder == "c2"
    # An expired lease that nobody took cannot be renewed either: its holder may
    # have stepped down already, and must acquire again (a new term).
    b.release("c2", 2)
    assert a.try_acquire("c1", 0.001) == 3
    deadline = time.monotonic() + 10
    while a.leader() is not None:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert not a.renew("c1", 3, 30.0)
    assert until_acquired(a, "c1") == 4


def test_a_lease_survives_a_reopen(backend: Backend):
    with backend.open() as store:
        assert store.try_acquire("c1", 60.0, address="h:1") == 1
    with backend.open() as store:
        assert store.leader()[:3] == ("c1", "h:1", 1)
        assert store.renew("c1", 1, 60.0)


def test_bad_lease_arguments_are_value_errors(pair):
    a, _ = pair
    for ttl in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^ttl_s: "):
            a.try_acquire("c1", ttl)
    with pytest.raises(ValueError, match="^holder: "):
        a.try_acquire("", 1.0)


def test_a_deposed_writer_is_fenced_and_writes_nothing(pair):
    old, new = pair
    term = old.try_acquire("c1", 0.001)
    old.fence(term)
    new_term = until_acquired(new, "c2")  # c1's lease expired; c2 is the leader now
    new.fence(new_term)
    created = new.create_jobs([(job("kept"), "r-kept")])
    assert created[0][1] is True
    revision = new.revision

    writes = {
        "create_jobs": lambda: old.create_jobs([(job("lost"), "r-lost")]),
        "put_jobs": lambda: old.put_jobs([(job("kept"), b"x")]),
        "delete_job": lambda: old.delete_job("kept"),
        "compact": old.compact,
        "set_drain": lambda: old.set_drain("rtx-0", "x"),
        "put_jobs (rounds)": lambda: old.put_jobs([], rounds=[pb.Round(round=1)]),
    }
    for name, write in writes.items():
        with pytest.raises(Fenced, match=f"fenced at term {term} .* at term {new_term} \\(c2\\)"):
            write()
        assert isinstance(Fenced("x"), StoreError), name  # the server's UNAVAILABLE
    assert [s.job.job_id for s in new.all_jobs()] == ["kept"]
    assert new.get_job("kept").extra == b"" and new.get_job("kept").job.revision == revision
    assert [rev for rev, _, _ in new.events_since(0)] == [revision]
    assert new.drains() == {} and new.rounds() == []
    # The leader's own writes go on; an unfenced store is not checked at all.
    assert new.put_jobs([(job("kept"), b"mine")]) == [revision + 1]
    assert [e.kind for e in new.cluster_events(EventQuery())] == [pb.EVENT_KIND_JOB_SUBMITTED]
    old.fence(None)
    assert old.set_drain("rtx-0", "unfenced") is None


def test_a_store_fenced_at_an_expired_or_never_taken_lease_writes_nothing(pair):
    a, _ = pair
    a.fence(1)
    with pytest.raises(Fenced, match="never taken"):
        a.create_jobs([(job("x"), "")])
    a.fence(None)
    a.fence(a.try_acquire("c1", 0.001))
    deadline = time.monotonic() + 10
    while a.leader() is not None:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    with pytest.raises(Fenced, match="expired"):  # expired, though nobody took it
        a.create_jobs([(job("x"), "")])
    assert a.get_job("x") is None and a.revision == 0


def test_a_release_raises_the_term_for_the_next_acquire_but_never_lowers_it(pair):
    """After a restore the lease row holds an old term: its holder raises it to the
    highest an agent has seen as it lets go, and the next leader's term is above."""
    a, b = pair
    assert a.try_acquire("c1", 30.0) == 1
    assert not b.release("c2", 1, raise_to=50)  # not the holder: nothing changes
    assert not a.release("c1", 2, raise_to=50)  # not its term: nothing changes
    assert b.leader()[:3] == ("c1", "", 1)
    for bad in (-1, MAX_TERM):
        with pytest.raises(ValueError, match="^raise_to: "):
            a.release("c1", 1, raise_to=bad)
    assert a.release("c1", 1, raise_to=41)
    assert b.leader() is None  # released, at once
    assert b.try_acquire("c2", 30.0) == 42
    assert not a.release("c1", 1, raise_to=99)  # a released lease is not raised again
    assert b.release("c2", 42, raise_to=7)  # below: the term stays
    assert a.try_acquire("c1", 30.0) == 43
    # A writer fenced at the raised-over term stays deposed.
    b.fence(42)
    with pytest.raises(Fenced, match="fenced at term 42 .* at term 43"):
        b.set_drain("n0", "x")


OPS = st.lists(st.tuples(st.sampled_from(["acquire", "renew", "release"]),
                         st.sampled_from([0, 1]), st.integers(-1, 1), st.integers(-2, 3)),
               max_size=25)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_the_lease_follows_its_model_and_terms_are_never_reused(pair, ops):
    """Against a model: one holder at a time; renew and release only by the holder
    at its term; every acquire a term above all before, and above what a release
    raised the term to (below, the same or above the holder's). (A fresh lease name per
    example: the database is the fixture's.)"""
    stores = pair
    name = uuid.uuid4().hex
    holder, term, top = None, 0, 0  # the model: who holds it, at which term
    for op, who, skew, lift in ops:
        me, store = f"c{who}", stores[who]
        if op == "acquire":
            got = store.try_acquire(me, 60.0, name=name)
            if holder is None:
                assert got == top + 1
                holder, term, top = me, got, got
            else:
                assert got is None
        elif op == "renew":
            ok = holder == me and skew == 0
            assert store.renew(me, term + skew, 60.0, name=name) is ok
        else:
            ok = holder == me and skew == 0
            raise_to = max(0, term + lift)
            assert store.release(me, term + skew, raise_to=raise_to, name=name) is ok
            if ok:
                holder, top = None, max(top, raise_to)
        seen = stores[1 - who].leader(name=name)
        assert (seen and seen[:1] + seen[2:3]) == ((holder, term) if holder else None)
