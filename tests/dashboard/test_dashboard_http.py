"""The dashboard over plain HTTP (no browser): its pages and its server-sent events
against a live controller with modeled agents, what a tenant's token lets it show,
and its reconnection when the controller restarts."""

from __future__ import annotations

import asyncio
import contextlib
import re

import aiohttp
import grpc
import pytest
from conftest import WAIT, rigid, spec, until

from sia_grpc.api import OTHER_TENANT
from sia_grpc.api.errors import ApiError

pytestmark = pytest.mark.timeout(90)


async def events(session: aiohttp.ClientSession, url: str):
    """The dashboard's server-sent events as (kind, data) pairs."""
    import json

    async with session.get(url + "events") as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        kind = None
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                yield kind, json.loads(line.removeprefix("data: "))


async def next_event(stream, match, what: str):
    """The first event `match(kind, data)` accepts (hard limit WAIT seconds)."""
    async def scan():
        async for kind, data in stream:
            if match(kind, data):
                return kind, data
        pytest.fail(f"the event stream ended before {what}")
    try:
        return await asyncio.wait_for(scan(), WAIT)
    except TimeoutError:
        pytest.fail(f"timed out after {WAIT:g} s waiting for {what}")


async def text(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_events_carry_each_job_change_and_the_pages_show_them(site):
    dash = await site.dashboard("admin")
    admin = await site.client("admin")
    async with aiohttp.ClientSession() as http:
        stream = events(http, dash.url)
        kind, hello = await next_event(stream, lambda k, d: True, "the hello event")
        assert (kind, hello["upstream"]) == ("hello", "live")
        job = await admin.submit(spec("sse-1"))
        _, ev = await next_event(stream, lambda k, d: k == "job" and d["id"] == job.job_id,
                                 "the new job's event")
        assert f'data-job="{job.job_id}"' in ev["row"]
        await next_event(stream, lambda k, d: k == "round", "a round")
        await admin.cancel(job.job_id)
        await next_event(stream, lambda k, d: k == "job" and d["id"] == job.job_id
                         and 'data-state="CANCELLED"' in d["row"], "the cancel's event")
        await stream.aclose()

        status, body = await text(http, dash.url + "jobs")
        assert status == 200
        (row,) = re.findall(rf'<tr data-job="{job.job_id}" data-state="(\w+)"', body)
        assert row == "CANCELLED"
        status, body = await text(http, dash.url + f"jobs/{job.job_id}")
        assert status == 200 and '<svg class="alloc"' in body and "CANCELLED" in body
        # Its story: the controller's history of it, as `sia describe` tells it.
        story = await admin.events(job_id=job.job_id)
        assert "<h2>Story</h2>" in body and [e.id for e in reversed(story)] == [
            int(i) for i in re.findall(r'<li data-id="(\d+)">', body)]
        assert "JobSubmitted" in body and "cancelled by request" in body
        status, body = await text(http, dash.url + "jobs/no-such-job")
        assert status == 404 and "no job &#x27;no-such-job&#x27;" in body
        status, body = await text(http, dash.url)
        assert status == 200
        assert re.findall(r'class="gputype" data-type="(\w+)" data-gpus="(\d+)"', body) == [
            ("aws", "2"), ("rtx", "8")]
        status, body = await text(http, dash.url + "rounds")
        assert status == 200 and re.search(r'<tbody class="round" data-round="[1-9]', body)
        status, body = await text(http, dash.url + "queues")
        assert status == 200 and 'data-queue="default"' in body
        for asset in ("dashboard.js", "dashboard.css"):
            status, _ = await text(http, dash.url + f"static/{asset}")
            assert status == 200


async def test_a_tenants_dashboard_shows_only_its_jobs(site):
    dash = await site.dashboard("a")
    a, b = await site.client("a"), await site.client("b")
    theirs = (await b.submit(rigid("theirs", 2, "rtx"))).job_id
    ours = (await a.submit(spec("ours"))).job_id
    await until(lambda: ours in dash.model.jobs, "team-a's job on its dashboard")

    async def holds() -> bool:  # team-b's job has its GPUs
        return (await b.get(theirs)).status.allocation.num_gpus == 2
    await until(holds, "team-b's job to run")
    async with aiohttp.ClientSession() as http:
        async def shows_other_tenant() -> bool:
            return f'data-job="{OTHER_TENANT}"' in (await text(http, dash.url))[1]
        await until(shows_other_tenant, "team-b's GPUs drawn as another tenant's")
        _, body = await text(http, dash.url)
        assert theirs not in body
        _, body = await text(http, dash.url + "jobs")
        assert re.findall(r'<tr data-job="([^"]+)"', body) == [ours]
        status, _ = await text(http, dash.url + f"jobs/{theirs}")
        assert status == 404
        # The round that started team-b's job lists it, unnamed, to team-a.
        moved = [m for r in await a.rounds(limit=50) for m in r.moves]
        assert moved and theirs not in {m.job_id for m in moved}
        assert OTHER_TENANT in {m.job_id for m in moved}
        assert theirs in {m.job_id for r in await b.rounds(limit=50) for m in r.moves}
        _, body = await text(http, dash.url + "rounds")
        assert theirs not in body
        assert f'data-job="{OTHER_TENANT}" data-kind="start"' in body
    assert set(dash.model.jobs) == {ours}


async def test_it_reconnects_when_the_controller_restarts(site):
    dash = await site.dashboard("admin")
    admin = await site.client("admin")
    before = (await admin.submit(spec("before"))).job_id
    await until(lambda: before in dash.model.jobs, "the first job")

    async def down_for_good() -> None:  # the client's own retries have given up
        await until(lambda: dash.model.upstream.startswith("reconnecting")
                    and dash.feed.failures.get("jobs") and dash.feed.failures.get("rounds"),
                    "the dashboard's watches to fail")
    await site.lc.restart_controller(while_down=down_for_good)
    q = dash.hub.subscribe()

    async def submitted() -> str | None:  # (the client's channel may still be backing off)
        try:
            return (await admin.submit(spec("after"), request_id="after-1")).job_id
        except ApiError as err:
            assert err.code == grpc.StatusCode.UNAVAILABLE, err
            return None
    after = await until(submitted, "the restarted controller to take a job")
    await until(lambda: after in dash.model.jobs and dash.model.upstream == "live",
                "a job created after the restart")
    assert before in dash.model.jobs

    async def rounds_again() -> bool:  # its rounds feed is back on the new controller:
        while not q.empty():  # its snapshot on reconnecting, or a round since
            if (q.get_nowait() or b"").startswith((b"event: rounds\n", b"event: round\n")):
                return True
        return False
    # (A round event alone raced: both jobs could end, and the rounds with them, before
    # the feed's backoff let it reconnect; seen once in a loaded clean-clone run.)
    await until(rounds_again, "the rounds of the new controller")
    assert dash.model.jobs[after].job.spec.name == "after"


async def test_the_dashboard_command_serves_until_sigterm(site, tmp_path):
    import signal
    import sys

    token = tmp_path / "token"
    token.write_text(site.tokens["admin"] + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.cli", "dashboard", "--controller", site.lc.target,
        "--token-file", str(token), "--listen", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
        found = re.match(r"sia dashboard: (http://127\.0\.0\.1:\d+/) ", line)
        assert found, line
        url = found[1]
        async with aiohttp.ClientSession() as http:
            async def live() -> bool:
                async with http.get(url + "healthz") as resp:
                    return (await resp.json())["upstream"] == "live"
            await until(live, "the dashboard process to reach the controller")
            assert (await text(http, url))[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_dashboard_command_stops_on_a_refused_token(site, tmp_path):
    import sys

    token = tmp_path / "token"
    token.write_text("not-a-token\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.cli", "dashboard", "--controller", site.lc.target,
        "--token-file", str(token), "--listen", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1
    (line,) = err.decode().splitlines()  # one line, no traceback
    assert line.startswith("error: UNAUTHENTICATED: "), line


def test_a_bad_listen_address_is_a_usage_error(capsys):
    from sia_grpc.cli import main

    assert main(["dashboard", "--listen", "8080"]) == 2
    assert capsys.readouterr().err == "error: --listen: expected HOST:PORT, got '8080'\n"


def test_other_tenant_is_the_text_the_controller_writes():
    from sia_grpc.controller.machine import views

    assert views.OTHER_TENANT is OTHER_TENANT


async def test_the_modeled_demo_serves_a_dashboard_while_it_runs():
    import io

    from sia_grpc.demo.modeled import live_demo

    out = io.StringIO()
    demo = asyncio.create_task(live_demo(rate=900.0, refresh=0.5, out=out,
                                         dashboard="127.0.0.1:0"))
    try:
        found = await until(lambda: re.search(r"dashboard: (http://127\.0\.0\.1:\d+/)",
                                              out.getvalue()), "the dashboard's address")
        async with aiohttp.ClientSession() as http:
            async def jobs_shown() -> bool:
                return "<tr data-job=" in (await text(http, found[1] + "jobs"))[1]
            await until(jobs_shown, "the demo's jobs on its dashboard")
    finally:
        demo.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await demo


async def test_a_demo_dashboard_takes_a_free_port_when_its_own_is_taken(site):
    import io
    import socket

    from sia_grpc.dashboard.server import beside

    client = await site.client()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = io.StringIO()
        async with beside(client, f"127.0.0.1:{port}", out) as url:
            assert url.startswith("http://127.0.0.1:") and f":{port}/" not in url
            assert out.getvalue().startswith(f"dashboard: {url} ")
    async with beside(client, None, out) as url:
        assert url == ""
