"""The dashboard's web server (aiohttp): the pages, their static files, and `/events`,
the server-sent events every page listens to.

    async with Dashboard(client, listen="127.0.0.1:0", controller=target) as dash:
        print(dash.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TextIO

from aiohttp import web

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client.sdk import AsyncSiaClient
from sia_grpc.dashboard import job_page, render
from sia_grpc.dashboard.feed import Feed, Hub, encode
from sia_grpc.dashboard.model import Model
from sia_grpc.security.tls import split_host_port

STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0  # a comment line this often, so proxies keep an idle stream open


def split_listen(listen: str) -> tuple[str, int]:
    """"127.0.0.1:8080" → ("127.0.0.1", 8080); "[::1]:0" → ("::1", 0)."""
    host, port = split_host_port(listen)
    if not host or not port.isdigit():
        raise ValueError(f"--listen: expected HOST:PORT, got {listen!r}")
    return host, int(port)


class Dashboard:
    def __init__(self, client: AsyncSiaClient, *, listen: str = "127.0.0.1:8080",
                 controller: str = "", clock: Callable[[], float] = time.time,
                 backstop: float = 5.0) -> None:
        self.host, self.port = split_listen(listen)
        self.controller = controller or client.target
        self.clock = clock
        self.model, self.hub = Model(), Hub()
        self.client = client
        self.feed = Feed(client, self.model, self.hub, clock=clock, backstop=backstop)
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def __aenter__(self) -> Dashboard:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/", self._cluster), web.get("/jobs", self._jobs),
                        # A job id may hold one '/' (`tenant/name`): links quote
                        # it, but a typed `/jobs/team-a/train-1` finds it too.
                        web.get("/jobs/{job:[^/]+(?:/[^/]+)?}/detail", self._job_detail),
                        web.get("/jobs/{job:[^/]+(?:/[^/]+)?}", self._job),
                        web.get("/rounds", self._rounds), web.get("/queues", self._queues),
                        web.get("/events", self._events), web.get("/healthz", self._health),
                        web.static("/static", STATIC)])
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the port bound (for :0)
        self._task = asyncio.create_task(self.feed.run(), name="dashboard-feed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.hub.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait(self) -> None:
        """Until the feed stops (it runs until cancelled, or fails unexpectedly)."""
        assert self._task is not None
        await self._task

    # -- pages --

    def _page(self, title: str, body: str, active: str, job: str = "",
              status: int = 200) -> web.Response:
        return web.Response(text=render.page(title, body, active=active, model=self.model,
                                             controller=self.controller, job=job),
                            content_type="text/html", status=status)

    async def _cluster(self, request: web.Request) -> web.Response:
        return self._page("Cluster", render.cluster_page(self.model, self.clock()), "/")

    async def _jobs(self, request: web.Request) -> web.Response:
        return self._page("Jobs", render.jobs_page(self.model, self.clock()), "/jobs")

    async def _job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job"]
        rec = self.model.jobs.get(job_id)
        if rec is None:
            return self._page("Not found", render.not_found(
                f"no job {job_id!r} (or not one this dashboard's token may see)"), "/jobs",
                status=404)
        story = await self._story(job_id)
        return self._page(f"Job {job_id}",
                          job_page.job_page(rec, self.model, self.clock(), story),
                          "/jobs", job=job_id)

    async def _job_detail(self, request: web.Request) -> web.Response:
        """The job page's live part, fetched by the page when its job changes."""
        rec = self.model.jobs.get(request.match_info["job"])
        if rec is None:
            raise web.HTTPNotFound(text="no such job")
        story = await self._story(rec.job.job_id)
        return web.Response(text=job_page.job_detail(rec, self.model, self.clock(), story),
                            content_type="text/html")

    async def _story(self, job_id: str) -> list[pb.Event] | None:
        """The job's events from the controller's history (None if it cannot say: an
        older controller, or none reachable now)."""
        try:
            return await self.client.events(job_id=job_id, limit=1000)
        except ApiError:
            return None

    async def _rounds(self, request: web.Request) -> web.Response:
        return self._page("Rounds", render.rounds_page(self.model), "/rounds")

    async def _queues(self, request: web.Request) -> web.Response:
        return self._page("Queues", render.queues_page(self.model, self.clock()), "/queues")

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"upstream": self.model.upstream,
                                  "jobs": len(self.model.jobs),
                                  "revision": self.model.revision})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: `hello` (the upstream's state), then every change."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        # Subscribed before the page's stream opens: a page (or a test) that saw it
        # open misses no event published after.
        q = self.hub.subscribe()
        try:
            await resp.prepare(request)
            await resp.write(encode("hello", {"upstream": self.model.upstream,
                                              "revision": self.model.revision}))
            while True:
                try:
                    frame = await asyncio.wait_for(q.get(), KEEPALIVE_S)
                except TimeoutError:
                    frame = b": keepalive\n\n"
                if frame is None:  # fell behind, or the dashboard is closing
                    break
                await resp.write(frame)
        except ConnectionResetError:
            pass  # the page went away
        finally:
            self.hub.unsubscribe(q)
        return resp


@contextlib.asynccontextmanager
async def beside(client: AsyncSiaClient, listen: str | None, out: TextIO, *,
                 clock: Callable[[], float] = time.time) -> AsyncIterator[str]:
    """A dashboard while a demo runs: at `listen`, or on a free port when that one is
    taken (its address printed to `out` either way); the address ("" when `listen` is
    None: no dashboard)."""
    if not listen:
        yield ""
        return
    dash = Dashboard(client, listen=listen, clock=clock)
    try:
        await dash.start()
    except OSError:  # (8080 in use: another dashboard, another demo)
        await dash.close()
        dash = Dashboard(client, listen=f"{dash.host}:0", clock=clock)
        await dash.start()
    print(f"dashboard: {dash.url} (open it in a browser while the demo runs)", file=out,
          flush=True)
    try:
        yield dash.url
    finally:
        await dash.close()
