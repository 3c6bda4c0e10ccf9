"""Store errors surface as UNAVAILABLE and nothing is silently dropped: a create
that could not be made durable is refused, never half-accepted."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace

import grpc
import pytest

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster


def spec(name: str) -> pb.JobSpec:
    return pb.JobSpec(name=name, application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)


@pytest.mark.timeout(60)
async def test_a_locked_store_refuses_creates_with_unavailable_then_recovers(tmp_path):
    db = tmp_path / "sia.db"
    config = replace(ControllerConfig(listen="127.0.0.1:0"), db_path=str(db))
    async with LocalCluster({}, config=config) as lc, AsyncSiaClient(lc.target) as client:
        before = await client.submit(spec("before"))
        # Its first update (the reason it waits: no node) written first: this test is
        # about CreateJob, not about a create queued behind another write.
        c = lc.controller
        async with asyncio.timeout(10):
            while (await c._in_store(c._store.get_job, before.job_id)).job.status.reason \
                    != c.state.job(before.job_id).status.reason:
                await asyncio.sleep(0.01)
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # another writer holds the database
        try:
            with pytest.raises(ApiError) as err:
                await client.submit(spec("during"))
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert "store" in err.value.message
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        await client.submit(spec("after"))
        names = sorted([j.spec.name async for j in client.list()])
    assert names == ["after", "before"]  # the refused one was not kept anywhere
