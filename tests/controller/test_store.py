"""The controller's store, on both back-ends (SQLite and PostgreSQL, the `backend`
fixture of conftest.py): idempotent creates, revisions, paging, changelog,
durability, schema upgrades; the lease and fencing are in test_lease.py."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from store_backends import Backend

from sia_grpc.api import pb
from sia_grpc.controller.stores import (
    SCHEMA_VERSION,
    Compacted,
    EventQuery,
    Fenced,
    JobExists,
    NotFound,
    RequestConflict,
    StoreError,
    open_store,
)
from sia_grpc.controller.stores import SqliteStore as Store
from sia_grpc.testing.postgres import stalled_mid_pipeline

CREATED, UPDATED, DELETED = (pb.JobEvent.KIND_CREATED, pb.JobEvent.KIND_UPDATED,
                             pb.JobEvent.KIND_DELETED)
REPO = Path(__file__).resolve().parents[2]


def job(job_id: str, *, name: str = "", state: int = pb.JOB_STATE_QUEUED, tenant: str = "",
        batch: int = 0) -> pb.Job:
    spec = pb.JobSpec(name=name or job_id, application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE,
                      tenant=tenant, batch_size=batch, labels={"team": "x"})
    return pb.Job(job_id=job_id, spec=spec, status=pb.JobStatus(state=state))


def created(result) -> pb.Job:
    assert not isinstance(result, StoreError), result
    stored, is_new = result
    assert is_new
    return stored


@pytest.fixture
def store(backend: Backend):
    with backend.open() as s:
        yield s


def test_create_get_roundtrip(store: Store):
    assert store.revision == 0
    original = job("a", state=pb.JOB_STATE_RUNNING, tenant="t1")
    stored = created(store.create_jobs([(original, "")])[0])

    assert stored.revision == 1 and store.revision == 1
    assert original.revision == 0  # the caller's message is not modified
    got = store.get_job("a")
    assert got is not None and got.extra == b""
    assert got.job == stored
    expected = pb.Job()
    expected.CopyFrom(original)
    expected.revision = 1
    assert got.job == expected
    assert store.get_job("missing") is None
    assert store.create_jobs([]) == [] and store.revision == 1


def test_create_is_idempotent_per_request_and_items_fail_alone(store: Store):
    first = created(store.create_jobs([(job("a", batch=64), "req-a")])[0])

    results = store.create_jobs([
        (job("a-retry", name="a", batch=64), "req-a"),  # a retry: the server generated a fresh id
        (job("a-other", name="a", batch=128), "req-a"),  # same request_id, different spec
        (job("a"), "req-new"),  # job_id taken by another request
        (job("b"), "req-b"),
        (job("b-retry", name="b"), "req-b"),  # duplicate within the same batch
    ])

    assert results[0] == (first, False)
    assert isinstance(results[1], RequestConflict) and "req-a" in str(results[1])
    assert isinstance(results[2], JobExists) and "'a'" in str(results[2])
    b = created(results[3])
    assert b.revision == 2  # failed and repeated items take no revision
    assert results[4] == (b, False)
    assert store.revision == 2
    assert [s.job.job_id for s in store.all_jobs()] == ["a", "b"]
    assert [rev for rev, _, _ in store.events_since(0)] == [1, 2]
    # Empty request ids never match each other.
    assert created(store.create_jobs([(job("c"), "")])[0]).revision == 3
    assert created(store.create_jobs([(job("d"), "")])[0]).revision == 4


def test_revisions_increase_across_create_put_delete(store: Store):
    a, b = (created(r) for r in store.create_jobs([(job("a"), ""), (job("b"), "")]))
    assert (a.revision, b.revision) == (1, 2)

    running = job("a", state=pb.JOB_STATE_RUNNING)
    assert store.put_jobs([(running, b"telemetry")]) == [3]
    assert running.revision == 0
    got = store.get_job("a")
    assert got.job.revision == 3 and got.job.status.state == pb.JOB_STATE_RUNNING
    assert got.extra == b"telemetry"
    # extra=None keeps what was stored.
    assert store.put_jobs([(job("a", state=pb.JOB_STATE_SUCCEEDED), None),
                           (job("b", state=pb.JOB_STATE_RUNNING), b"")]) == [4, 5]
    assert store.get_job("a").extra == b"telemetry"
    assert store.get_job("a").job.status.state == pb.JOB_STATE_SUCCEEDED

    assert store.delete_job("a") == 6 and store.revision == 6
    assert store.get_job("a") is None
    with pytest.raises(NotFound):
        store.delete_job("a")
    # An unknown job fails the whole batch: b's update is not written either.
    with pytest.raises(NotFound, match="'ghost'"):
        store.put_jobs([(job("b", state=pb.JOB_STATE_FAILED), b"x"), (job("ghost"), None)])
    assert store.revision == 6
    assert store.get_job("b").job.status.state == pb.JOB_STATE_RUNNING
    assert store.get_job("b").job.revision == 5
    assert created(store.create_jobs([(job("c"), "")])[0]).revision == 7


def test_paging_returns_each_job_once_in_creation_order(store: Store):
    states = (pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING, pb.JOB_STATE_SUCCEEDED)
    # Ids sort opposite to creation order, so ordering by id would fail.
    specs = [job(f"job-{249 - i:03d}", state=states[i % 3], tenant=f"t{i % 2}")
             for i in range(250)]
    store.create_jobs([(j, "") for j in specs])
    order = [j.job_id for j in specs]

    def page_all(**filters) -> list[str]:
        ids, token, pages = [], "", 0
        while True:
            page, token = store.list_jobs(page_token=token, **filters)
            ids += [j.job_id for j in page]
            pages += 1
            if not token:
                return ids
            assert pages < 100, "paging does not terminate"

    assert page_all(page_size=100) == order
    pages = [store.list_jobs(page_size=100)]
    while pages[-1][1]:
        pages.append(store.list_jobs(page_size=100, page_token=pages[-1][1]))
    assert [len(p) for p, _ in pages] == [100, 100, 50]
    assert page_all(page_size=250) == order  # an exact fit ends without an empty page

    running = [j.job_id for j in specs if j.status.state == pb.JOB_STATE_RUNNING]
    assert page_all(page_size=7, states=[pb.JOB_STATE_RUNNING]) == running
    t1_done = [j.job_id for j in specs if j.spec.tenant == "t1"
               and j.status.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_QUEUED)]
    assert page_all(page_size=9, tenant="t1",
                    states={pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_QUEUED}) == t1_done
    assert store.list_jobs(tenant="nobody") == ([], "")

    # A token stays valid when the job it points at is deleted meanwhile.
    first, token = store.list_jobs(page_size=10)
    store.delete_job(first[-1].job_id)
    rest, _ = store.list_jobs(page_size=5, page_token=token)
    assert [j.job_id for j in rest] == order[10:15]


@pytest.mark.parametrize("token", ["garbage!", "c2VxOng", "bm9wZTox", "é",
                                   "c2VxOjk5OTk5OTk5OTk5OTk5OTk5OTk"])
def test_malformed_page_token_is_value_error(store: Store, token: str):
    with pytest.raises(ValueError, match="^page_token: "):
        store.list_jobs(page_token=token)


def test_events_since_in_order_then_compacted(backend: Backend):
    with backend.open(changelog_limit=2) as store:
        store.create_jobs([(job("a"), ""), (job("b"), "")])
        store.put_jobs([(job("a", state=pb.JOB_STATE_RUNNING), None)])
        store.delete_job("b")

        events = store.events_since(0)
        assert [(rev, kind, j.job_id) for rev, kind, j in events] == [
            (1, CREATED, "a"), (2, CREATED, "b"), (3, UPDATED, "a"), (4, DELETED, "b")]
        assert all(j.revision == rev for rev, _, j in events)
        assert events[2][2].status.state == pb.JOB_STATE_RUNNING
        assert [rev for rev, _, _ in store.events_since(2)] == [3, 4]
        assert [rev for rev, _, _ in store.events_since(0, limit=3)] == [1, 2, 3]
        assert store.events_since(4) == []

        assert store.compact() == 2
        assert store.compact() == 0
        assert [rev for rev, _, _ in store.events_since(2)] == [3, 4]
        for stale in (0, 1):
            with pytest.raises(Compacted):
                store.events_since(stale)
        assert store.revision == 4  # compaction never moves the revision back


def test_reopened_store_sees_everything(backend: Backend):
    with backend.open() as store:
        store.create_jobs([(job(f"j{i}", tenant="t"), f"r{i}") for i in range(5)])
        store.put_jobs([(job("j1", state=pb.JOB_STATE_RUNNING, tenant="t"), b"\x00fit\xff")])
        store.delete_job("j3")
        before = store.all_jobs()
        _, token = store.list_jobs(page_size=2)

    with backend.open() as store:  # a restart
        assert store.revision == 7
        assert store.all_jobs() == before
        assert store.get_job("j1").extra == b"\x00fit\xff"
        kinds = [kind for _, kind, _ in store.events_since(0)]
        assert kinds == [CREATED] * 5 + [UPDATED, DELETED]
        page, _ = store.list_jobs(page_size=2, page_token=token)
        assert [j.job_id for j in page] == ["j2", "j4"]
        # Idempotency survives the restart, and revisions continue.
        retry = job("retry", name="j0", tenant="t")
        assert store.create_jobs([(retry, "r0")]) == [(before[0].job, False)]
        assert created(store.create_jobs([(job("new"), "")])[0]).revision == 8


CHILD = """
import sys
from sia_grpc.api import pb
from sia_grpc.controller.stores import open_store

store = open_store(sys.argv[1])
i = 0
while True:
    ids = [f"c{i + k}" for k in range(5)]
    store.create_jobs([(pb.Job(job_id=x, spec=pb.JobSpec(name=x)), "r" + x) for x in ids])
    print("committed", *ids, flush=True)
    i += 5
"""


def test_committed_jobs_survive_sigkill(backend: Backend):
    backend.open().close()  # the schema first: the child's open must not be killed midway
    child = subprocess.Popen([sys.executable, "-c", CHILD, backend.target], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while len(lines) < 10:
            line = child.stdout.readline()
            assert line, f"child exited early: {child.stderr.read()}"
            lines.append(line)
        os.kill(child.pid, signal.SIGKILL)  # mid-loop: possibly inside a transaction
        out, _ = child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == -signal.SIGKILL
    lines += out.splitlines(keepends=True)
    reported = [x for line in lines if line.endswith("\n") for x in line.split()[1:]]
    assert len(reported) >= 50

    with backend.open() as store:
        stored = {s.job.job_id: s.job for s in store.all_jobs()}
        assert store.revision == len(stored)
    missing = [x for x in reported if x not in stored]
    assert not missing
    assert all(stored[x].spec.name == x for x in reported)


def test_full_disk_is_store_error_and_rolls_back(tmp_path: Path):
    store = Store(tmp_path / "sia.db")
    created(store.create_jobs([(job("a"), "")])[0])
    # A database that cannot grow stands in for a full disk.
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    big = [job(f"big{i}") for i in range(3)]
    for j in big:
        j.spec.command.append("x" * 20_000)

    with pytest.raises(StoreError, match="cannot commit 3 new jobs: .*full") as err:
        store.create_jobs([(j, "") for j in big])
    assert not isinstance(err.value, sqlite3.Error)
    with pytest.raises(StoreError, match="cannot commit updates to 1 jobs: .*full"):
        store.put_jobs([(job("a"), b"y" * 50_000)])
    # Nothing half-written, and the store works again once there is room.
    assert store.revision == 1 and store.get_job("big0") is None
    assert store.get_job("a").extra == b""
    store._conn.execute(f"PRAGMA max_page_count = {pages * 100}")
    assert [created(r).revision for r in store.create_jobs([(j, "") for j in big])] == [2, 3, 4]
    store.close()


def test_unopenable_path_is_store_error(tmp_path: Path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")  # works as root too, unlike a read-only directory
    with pytest.raises(StoreError, match="cannot open"):
        Store(not_a_dir / "sia.db")


def test_unreachable_postgres_is_store_error_without_the_password(tmp_path: Path):
    from sia_grpc.testing.ports import free_port

    dsn = f"postgresql://sia:s3cret@127.0.0.1:{free_port()}/sia"  # nothing listens there
    with pytest.raises(StoreError, match="cannot open postgresql://sia:\\*\\*\\*@127") as err:
        open_store(dsn)
    assert "s3cret" not in str(err.value)


def test_wrong_password_is_store_error_without_it(postgres_server):
    with pytest.raises(StoreError, match="password authentication failed") as err:
        open_store(postgres_server.dsn(password=False), password="wrong-one")
    assert "wrong-one" not in str(err.value)
    with open_store(postgres_server.dsn(password=False),
                    password=postgres_server.password) as store:  # store_password_file's way
        assert store.revision == 0


def test_a_restarted_postgres_costs_no_failed_call(postgres_server, postgres_dsn):
    with open_store(postgres_dsn) as store:
        created(store.create_jobs([(job("a"), "")])[0])
        postgres_server.restart()  # the pooled connection is cut
        assert created(store.create_jobs([(job("b"), "")])[0]).revision == 2
        assert [s.job.job_id for s in store.all_jobs()] == ["a", "b"]


def test_locked_database_is_store_error(backend: Backend):
    # busy_timeout: SQLite's busy timeout, PostgreSQL's lock_timeout
    with backend.open(busy_timeout=0.05) as store:
        with backend.writer_waiting(), pytest.raises(  # another writer holds the lock
                StoreError, match="cannot commit 1 new jobs: (database is locked|.*lock timeout)"):
            store.create_jobs([(job("a"), "")])
        assert created(store.create_jobs([(job("a"), "")])[0]).revision == 1


def test_newer_schema_is_refused(backend: Backend):
    backend.open().close()
    backend.set_schema_version(SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than "
                                         f"the {SCHEMA_VERSION}"):
        backend.open()


# The tables each schema version added: a store of version v lacks those of later ones.
_ADDED_IN = {2: "drains", 3: "rounds", 4: "lease", 5: "events"}


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_older_store_is_upgraded_in_place_keeping_its_jobs(backend: Backend, version: int):
    """An older controller's store (version 1: no drains, rounds or lease; 2: no
    rounds or lease; 3: no lease) opens with a newer one, which adds what is missing."""
    with backend.open() as store:
        store.create_jobs([(job("a"), "req-a")])
        if version >= 2:
            store.set_drain("rtx-1", "kept")
    for v, table in _ADDED_IN.items():
        if v > version:
            backend.sql(f"DROP TABLE {table}")
    if version < 5:  # (the rows of meta that version 5 added)
        backend.sql("DELETE FROM meta WHERE key IN ('event_id', 'events_compacted_through')")
    backend.set_schema_version(version)
    with backend.open() as store:
        assert [s.job.job_id for s in store.all_jobs()] == ["a"]
        assert store.drains() == ({"rtx-1": "kept"} if version >= 2 else {})
        assert store.rounds() == []
        store.set_drain("rtx-0", "replace GPU 3")
        store.put_jobs([], rounds=[pb.Round(round=7, trigger="timer")])
        assert store.try_acquire("c1", 60.0) == 1
    with backend.open() as store:  # durable, and the upgrade is not run twice
        assert store.drains()["rtx-0"] == "replace GPU 3"
        store.set_drain("rtx-0", None)
        assert "rtx-0" not in store.drains()
        assert [r.round for r in store.rounds()] == [7]
        assert store.leader().term == 1
        assert store.cluster_events(EventQuery()) == []  # (5: the event history)
    assert backend.schema_version() == SCHEMA_VERSION == 5


def test_rounds_keep_the_newest_few_across_a_reopen(backend: Backend):
    rounds = []
    for r in range(1, 7):
        rnd = pb.Round(round=r, trigger="timer", note="skipped: no jobs" if r == 5 else "")
        rnd.start_time.FromSeconds(1_700_000_000 + r)
        rounds.append(rnd)
    with backend.open(rounds_limit=3) as store:
        store.put_jobs([], rounds=rounds[:2])
        store.put_jobs([], rounds=[])
        assert [r.round for r in store.rounds()] == [1, 2]
        store.put_jobs([], rounds=rounds[2:5])  # a batch that pushes older ones out
        assert [r.round for r in store.rounds()] == [3, 4, 5]
        assert [r.round for r in store.rounds(2)] == [4, 5]
    with backend.open(rounds_limit=3) as store:
        rounds = store.rounds()
        assert [r.round for r in rounds] == [3, 4, 5]
        assert rounds[-1].note == "skipped: no jobs"
        assert rounds[0].start_time.seconds == 1_700_000_003
    assert backend.sql("SELECT count(*) FROM rounds") == [(3,)]  # trimmed as they come
    with pytest.raises(ValueError, match="rounds_limit"):
        backend.open(rounds_limit=0)


def test_closed_store_raises_store_error(backend: Backend):
    store = backend.open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.get_job("a")
    with pytest.raises(StoreError, match="closed"):
        store.create_jobs([(job("a"), "")])


def test_concurrent_writers_and_readers_share_the_connection(store: Store):
    def work(t: int) -> list[int]:
        revs = []
        for i in range(15):
            revs.append(created(store.create_jobs([(job(f"t{t}-{i}"), "")])[0]).revision)
            store.list_jobs(page_size=5)
        return revs

    with ThreadPoolExecutor(4) as pool:
        revisions = [r for revs in pool.map(work, range(4)) for r in revs]
    assert sorted(revisions) == list(range(1, 61))


def test_two_stores_on_one_database_take_revisions_in_turn(backend: Backend):
    """Two controllers' stores on one database (a failover's old and new leader):
    every revision is taken once, and the changelog has no gap."""
    stores = [backend.open(busy_timeout=30.0) for _ in range(2)]
    try:
        def work(t: int) -> list[int]:
            return [created(stores[t].create_jobs([(job(f"s{t}-{i}"), "")])[0]).revision
                    for i in range(20)]

        with ThreadPoolExecutor(2) as pool:
            revisions = [r for revs in pool.map(work, range(2)) for r in revs]
        assert sorted(revisions) == list(range(1, 41))
        assert [rev for rev, _, _ in stores[0].events_since(0)] == list(range(1, 41))
        assert stores[1].put_jobs([(job("s0-0", state=pb.JOB_STATE_RUNNING), None)]) == [41]
    finally:
        for s in stores:
            s.close()


def test_a_writer_stopped_inside_its_write_does_not_lock_out_the_other(postgres_dsn):
    """A controller paused mid-write (SIGSTOP) holds the revision's row lock; the
    server ends its idle transaction, so the other controller's writes go through
    (before: every one failed with a lock timeout until the paused one resumed)."""
    import psycopg
    with open_store(postgres_dsn, busy_timeout=1.0) as paused, \
            open_store(postgres_dsn, busy_timeout=1.0) as other:
        created(paused.create_jobs([(job("a"), "")])[0])
        conn = psycopg.connect(postgres_dsn, autocommit=True)
        paused._configure(conn)  # a connection of the paused controller's pool
        conn.execute("BEGIN")
        conn.execute("SELECT value FROM meta WHERE key = 'revision' FOR UPDATE")
        # ... and it stops there. The other writes; a try may wait out its lock.
        failed = []
        for _ in range(3):
            try:
                created(other.create_jobs([(job("b"), "b")])[0])
                break
            except StoreError as err:
                failed.append(err)
        assert len(failed) < 3, failed
        with pytest.raises(psycopg.Error, match="idle-in-transaction"):  # ended by the server
            conn.execute("SELECT 1")
        conn.close()
        assert sorted(s.job.job_id for s in other.all_jobs()) == ["a", "b"]


def test_a_new_leader_ends_a_deposed_writers_transaction_cut_off_inside_a_pipeline(
        postgres_dsn):
    """The rule: a deposed leader's open transaction never holds its successor's writes.
    Before: one cut off inside an `executemany` kept the revision's row lock, the
    server never ended it (not idle), and every write of the new leader failed with a
    lock timeout until the old one's connection was seen dead (a CI failover test:
    CreateJob DEADLINE_EXCEEDED on the new leader)."""
    with open_store(postgres_dsn, busy_timeout=0.5) as deposed, \
            open_store(postgres_dsn, busy_timeout=0.5) as leader:
        created(deposed.create_jobs([(job("a"), "")])[0])
        stalled = stalled_mid_pipeline(postgres_dsn, deposed._application)
        time.sleep(0.5)  # past its idle timeout: still there
        with pytest.raises(StoreError, match="lock timeout"):
            leader.create_jobs([(job("b"), "b")])
        term = leader.try_acquire("new", 30.0)
        leader.fence(term)
        assert leader.end_deposed() == 1
        created(leader.create_jobs([(job("b"), "b")])[0])  # (may wait for the exit)
        assert sorted(s.job.job_id for s in leader.all_jobs()) == ["a", "b"]
        assert leader.end_deposed() == 0  # its own sessions, and nothing left
        stalled.close()


def test_a_leaders_write_that_waits_out_a_deposed_writers_lock_ends_it(postgres_dsn):
    """The same rule once in office: a deposed leader stalled inside a write after the
    new one took office (stopped again, cut off again) holds the lock; the leader's
    write that waits it out ends that transaction, so its next try goes through.
    Before: every try failed until the other connection was seen dead."""
    with open_store(postgres_dsn, busy_timeout=0.5) as deposed, \
            open_store(postgres_dsn, busy_timeout=0.5) as leader:
        leader.fence(leader.try_acquire("new", 30.0))
        assert leader.end_deposed() == 0  # taking office: nothing open yet
        stalled = stalled_mid_pipeline(postgres_dsn, deposed._application)
        with pytest.raises(StoreError, match="lock timeout.*ended 1 transaction"):
            leader.create_jobs([(job("b"), "b")])
        created(leader.create_jobs([(job("b"), "b")])[0])
        stalled.close()
        unfenced = stalled_mid_pipeline(postgres_dsn, deposed._application)
        leader.fence(None)  # not a leader: it ends nobody's, the lock timeout stands
        with pytest.raises(StoreError, match="lock timeout") as info:
            leader.create_jobs([(job("c"), "c")])
        assert "ended" not in str(info.value)
        unfenced.close()


def test_ending_a_deposed_writer_needs_the_lease_and_spares_other_clients(postgres_dsn):
    """Only a leader ends transactions (a deposed one's fence check fails first), and
    only controllers': an operator's session holding a lock is left alone."""
    import psycopg
    with open_store(postgres_dsn, busy_timeout=0.5) as store:
        with pytest.raises(StoreError, match="needs a fenced store"):
            store.end_deposed()  # not fenced: not a leader
        term = store.try_acquire("me", 30.0)
        store.fence(term + 1)  # a term it does not hold
        with pytest.raises(Fenced):
            store.end_deposed()
        store.fence(term)
        operator = stalled_mid_pipeline(postgres_dsn, "psql")
        assert store.end_deposed() == 0
        assert operator.pgconn.status == psycopg.pq.ConnStatus.OK
        operator.close()


def test_the_servers_end_of_a_store_connection_probes_its_peer(postgres_dsn):
    """A controller gone without a FIN (a cable, a dead host) inside a transaction: the
    server sees the connection dead in seconds (its keepalives, as the client's), not
    after the kernel's two hours, and the transaction's locks go with it."""
    with open_store(postgres_dsn) as store, store._read("show") as conn:
        shown = [conn.execute(f"SHOW tcp_keepalives_{s}").fetchone()[0]
                 for s in ("idle", "interval", "count")]
    assert shown == ["5", "1", "3"]
