"""Store errors surface as UNAVAILABLE and nothing is silently dropped: a create
that could not be made durable is refused, never half-accepted (on both back-ends);
and the controller on a PostgreSQL store."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest
import structlog
from store_backends import Backend

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster


def spec(name: str) -> pb.JobSpec:
    return pb.JobSpec(name=name, application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)


@pytest.mark.timeout(60)
async def test_a_locked_store_refuses_creates_with_unavailable_then_recovers(backend: Backend):
    config = replace(ControllerConfig(listen="127.0.0.1:0"), store=backend.target)
    async with LocalCluster({}, config=config) as lc, AsyncSiaClient(lc.target) as client:
        before = await client.submit(spec("before"))
        # Its first update (the reason it waits: no node) written first: this test is
        # about CreateJob, not about a create queued behind another write.
        c = lc.controller
        async with asyncio.timeout(10):
            while (await c._in_store(c._store.get_job, before.job_id)).job.status.reason \
                    != c.state.job(before.job_id).status.reason:
                await asyncio.sleep(0.01)
        with backend.writer_waiting():  # another writer holds the database
            with pytest.raises(ApiError) as err:
                await client.submit(spec("during"))
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert "store" in err.value.message
        await client.submit(spec("after"))
        names = sorted([j.spec.name async for j in client.list()])
    assert names == ["after", "before"]  # the refused one was not kept anywhere


@pytest.mark.timeout(90)
async def test_the_controller_on_postgres_keeps_jobs_across_a_restart(postgres_server, tmp_path):
    """Create, list and watch on a PostgreSQL store, the password from
    store_password_file (never logged); a restarted controller has every job and
    its changelog, and revisions go on."""
    secret = tmp_path / "pgpass"
    secret.write_text(postgres_server.password + "\n")
    dsn = postgres_server.database().replace(f":{postgres_server.password}@", "@")
    config = ControllerConfig(listen="127.0.0.1:0", store=dsn,
                              store_password_file=str(secret))
    with structlog.testing.capture_logs() as logs:
        async with LocalCluster({}, config=config) as lc, AsyncSiaClient(lc.target) as client:
            handles = [await client.submit(spec(f"j{i}"), request_id=f"r{i}") for i in range(3)]
            ids = [h.job_id for h in handles]
            assert sorted([j.job_id async for j in client.list()]) == sorted(ids)
            events = client.watch()
            first = [await anext(events) for _ in range(3)]
            await events.aclose()
            assert [e.job.job_id for e in first] == ids
            last = max(e.job.revision for e in first)

            await lc.restart_controller()
            assert sorted([j.job_id async for j in client.list()]) == sorted(ids)
            retry = await client.submit(spec("j0"), request_id="r0")  # idempotent, still
            assert retry.job_id == ids[0]
            more = await client.submit(spec("j3"))
            events = client.watch(since_revision=last)
            async with asyncio.timeout(10):
                async for ev in events:
                    if ev.job.job_id == more.job_id:
                        assert ev.job.revision > last
                        break
            await events.aclose()
    started = [e for e in logs if e["event"] == "controller started"]
    assert [e["store"] for e in started] == [dsn, dsn]  # (no password in this DSN)
    assert postgres_server.password not in repr(logs)


def test_a_dsn_password_is_never_logged_or_shown():
    from sia_grpc.controller.stores import describe

    dsn = "postgresql://sia:pa55@db.example:5432/sia?sslmode=require&password=pa55"
    assert describe(dsn) == ("postgresql://sia:***@db.example:5432/sia?sslmode=require"
                             "&password=***")
    assert describe("postgres://db/sia") == "postgres://db/sia"
    assert describe("/var/lib/sia/sia.db") == "/var/lib/sia/sia.db"
    config = ControllerConfig(store=dsn)
    assert "pa55" not in repr(config)
