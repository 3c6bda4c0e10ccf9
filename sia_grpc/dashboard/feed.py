"""The dashboard's one connection to the controller, fanned out to every browser.

`Feed` keeps the `Model` current from the controller's API alone: one WatchJobs stream
(a snapshot, then every change), one WatchRounds stream, and GetCluster / ListQueues
read again after each round and each change of a job's allocation (GetCluster has no
watch), and every `backstop` seconds for what changes without either (a node lost,
drained). Each change is published to the `Hub` as a rendered fragment, which every
open page receives as a server-sent event. When the controller goes away (a restart,
a failover) each stream is reopened with backoff; the job watch then starts again
from a snapshot, and the jobs deleted meanwhile are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from typing import Any

import grpc

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client.sdk import AsyncSiaClient
from sia_grpc.dashboard import render
from sia_grpc.dashboard.model import MAX_ROUNDS, Model

SUBSCRIBER_BACKLOG = 2000  # events a slow browser may fall behind by before it is dropped
# Answers that no retry changes: the token (or certificate) is refused.
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class Hub:
    """Server-sent events to every subscribed page. Each event is encoded once; a
    subscriber that falls `SUBSCRIBER_BACKLOG` events behind is closed, and its page
    reconnects and reloads (static/dashboard.js)."""

    def __init__(self) -> None:
        self._subs: set[asyncio.Queue[bytes | None]] = set()
        self.published = 0

    def subscribe(self) -> asyncio.Queue[bytes | None]:
        q: asyncio.Queue[bytes | None] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self._subs.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[bytes | None]) -> None:
        self._subs.discard(q)

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        self.published += 1
        frame = encode(kind, data)
        for q in list(self._subs):
            try:
                q.put_nowait(frame)
            except asyncio.QueueFull:
                self._subs.discard(q)
                q.get_nowait()  # room for the end-of-stream mark
                q.put_nowait(None)

    def close(self) -> None:
        for q in self._subs:
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)


def encode(kind: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (JSON data: a single line, as the format needs)."""
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Feed:
    def __init__(self, client: AsyncSiaClient, model: Model, hub: Hub, *,
                 clock: Callable[[], float] = time.time, backstop: float = 5.0,
                 retry_cap: float = 2.0) -> None:
        self.client, self.model, self.hub = client, model, hub
        self.clock, self.backstop, self.retry_cap = clock, backstop, retry_cap
        self._dirty = asyncio.Event()  # the cluster and queues are worth reading again
        self._drawn: pb.Cluster | None = None  # the cluster the pages were last sent
        # Consecutive failures of each loop ("jobs", "rounds", "cluster").
        self.failures: dict[str, int] = {}

    async def run(self) -> None:
        """Forever (until cancelled): the three loops."""
        await asyncio.gather(self._forever("jobs", self._jobs),
                             self._forever("rounds", self._rounds),
                             self._forever("cluster", self._cluster))

    async def _forever(self, name: str, loop: Callable[[], Any]) -> None:
        """Run `loop` again whenever it fails, with capped full-jitter backoff; a
        token the controller refuses ends the feed (retrying cannot help)."""
        while True:
            try:
                await loop()
            except ApiError as err:
                if err.code in REFUSED:
                    raise
                self._down(err)
            n = self.failures[name] = self.failures.get(name, 0) + 1
            await asyncio.sleep(random.random() * min(self.retry_cap, 0.1 * 2 ** n))

    def _live(self, name: str) -> None:
        self.failures[name] = 0
        if self.model.upstream != "live":
            self.model.upstream = "live"
            self.hub.publish("upstream", {"state": "live"})

    def _down(self, err: ApiError) -> None:
        why = f"reconnecting: {err.code.name}"
        if self.model.upstream != why:
            self.model.upstream = why
            self.hub.publish("upstream", {"state": why, "detail": str(err)})

    # -- jobs --

    async def _jobs(self) -> None:
        if self.model.jobs:  # a reconnect: forget the jobs deleted while we were away
            ids = {j.job_id async for j in self.client.list(page_size=1000)}
            for job_id in self.model.keep_only(ids):
                self.hub.publish("job", {"id": job_id, "deleted": True})
        async for ev in self.client.watch():
            self._live("jobs")
            self.job_event(ev)

    def job_event(self, ev: pb.JobEvent) -> None:
        before = self.model.jobs.get(ev.job.job_id)
        held = before.allocation() if before else ("", 0)
        now = self.clock()
        rec = self.model.apply(ev, now)
        if rec is None:
            self.hub.publish("job", {"id": ev.job.job_id, "deleted": True})
        else:
            self.hub.publish("job", {"id": rec.job.job_id, "row": render.job_row(rec, now)})
        if rec is None or rec.allocation() != held:
            self._dirty.set()

    # -- rounds --

    async def _rounds(self) -> None:
        self.model.set_rounds(await self.client.rounds(limit=MAX_ROUNDS))
        self.hub.publish("rounds", {"rows": "".join(
            render.round_row(r) for r in reversed(self.model.rounds))})
        async for rnd in self.client.watch_rounds():
            self._live("rounds")
            if self.model.add_round(rnd):
                self.hub.publish("round", {"round": rnd.round, "row": render.round_row(rnd)})
            self._dirty.set()

    # -- cluster and queues --

    async def _cluster(self) -> None:
        while True:
            cluster, queues = await self.client.cluster(), await self.client.queues()
            self._live("cluster")
            self.model.cluster = cluster
            if self.model.sample(self.clock()) or cluster != self._drawn:
                self._drawn = cluster
                self.hub.publish("cluster", {"html": render.cluster_section(self.model,
                                                                            self.clock())})
            fresh, self.model.queues = queues != self.model.queues, queues
            if self.model.sample_queues(self.clock()) or fresh:
                self.hub.publish("queues", {"html": render.queues_section(self.model,
                                                                          self.clock())})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.backstop)
            self._dirty.clear()
            await asyncio.sleep(0.05)  # (a burst of changes: one read)
