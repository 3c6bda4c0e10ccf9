"""AsyncSiaClient over grpc.aio, against the same fake controller (served by threads)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient, JobState, SpecError

SPEC = pb.JobSpec(name="bert", application="bert", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=2)


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
async def client(target, sleeps):
    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    async with AsyncSiaClient(target, timeout=5, sleep=sleep, rand=lambda: 1.0) as sia:
        yield sia


async def test_submit_takes_a_spec_files_mapping(client, fake):
    handle = await client.submit({"name": "bert", "application": "bert",
                                  "adaptivity": "rigid", "num_gpus": 2})
    assert fake.jobs[handle.job_id].spec == SPEC
    assert str((await handle.job()).state) == "QUEUED"
    with pytest.raises(SpecError) as err:
        await client.submit({"num_gpus": "two"})
    assert err.value.field == "spec.num_gpus"


async def test_submit_get_list_cancel_delete(client, fake):
    handle = await client.submit(SPEC, job_id="bert-1")
    assert handle.job_id == "bert-1"
    assert (await handle.job()).spec == SPEC
    assert (await handle.status()).state == pb.JOB_STATE_QUEUED
    for i in range(4):
        fake.add(f"other-{i}")
    assert [j.job_id async for j in client.list(page_size=2)] == list(fake.jobs)
    assert len(fake.jobs) == 5
    assert fake.calls["ListJobs"] == 3

    cancelled = await handle.cancel()
    assert cancelled.status.state == pb.JOB_STATE_CANCELLED
    assert str(cancelled.status.state) == "CANCELLED" and cancelled.state is JobState.CANCELLED
    await client.delete("bert-1")
    with pytest.raises(ApiError) as err:
        await client.get("bert-1")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


async def test_server_error_names_the_field(client):
    with pytest.raises(ApiError) as err:
        await client.submit(pb.JobSpec(min_gpus=3, max_gpus=1))
    assert err.value.field == "spec.max_gpus"


async def test_reads_retry_but_submit_does_not(client, fake, sleeps):
    fake.fail["GetCluster"] = 2
    assert (await client.cluster()).types[0].gpus == 8
    assert sleeps == pytest.approx([0.1, 0.2])
    assert [r.round for r in await client.rounds(limit=2)] == [2, 3]

    fake.fail["CreateJob"] = 1
    with pytest.raises(ApiError) as err:
        await client.submit(SPEC)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and fake.calls["CreateJob"] == 1


async def test_watch_resumes_after_the_last_revision(client, fake, sleeps):
    for _ in range(4):
        fake.add()
    fake.break_watch_after = [1]
    got = []
    events = client.watch(since_revision=1)
    async with contextlib.aclosing(events):
        async for ev in events:
            got.append(ev.revision)
            if len(got) == 3:
                break
    assert got == [2, 3, 4]
    assert [r.since_revision for r in fake.watch_requests] == [1, 2] and len(sleeps) == 1


async def test_watch_rounds_reopens_a_broken_stream(client, fake, sleeps):
    fake.fail["WatchRounds"] = 1
    rounds = client.watch_rounds()
    async with contextlib.aclosing(rounds):
        got = [(await anext(rounds)).round for _ in range(3)]
    assert got == [1, 2, 3]
    assert fake.calls["WatchRounds"] == 2 and sleeps == pytest.approx([0.1])


async def test_handle_wait_and_watch(client, fake):
    handle = await client.submit(SPEC)
    loop = asyncio.get_running_loop()
    loop.call_later(0.03, fake.set_state, handle.job_id, pb.JOB_STATE_RUNNING)
    loop.call_later(0.06, fake.set_state, handle.job_id, pb.JOB_STATE_SUCCEEDED)
    job = await handle.wait(timeout=5)
    assert job.status.state == pb.JOB_STATE_SUCCEEDED
    # The versions seen again from the start: the current (terminal) one only.
    assert [j.status.state async for j in handle.watch()] == [pb.JOB_STATE_SUCCEEDED]


async def test_wait_times_out_cleanly(client):
    handle = await client.submit(SPEC)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await handle.wait(timeout=0.2)
    assert time.monotonic() - start < 2


async def test_close_is_idempotent(target):
    sia = AsyncSiaClient(target)
    await sia.close()
    await sia.close()
