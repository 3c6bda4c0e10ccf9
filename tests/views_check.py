"""Issue 37's rule, "every operator view tells the same story", as one check shared by
the live property tests (tests/controller/test_views_agree.py on one controller,
tests/ha/test_views_agree_failover.py on a PostgreSQL pair): at a quiet point, each
view of each job says what the store says.

The views: `sia get` (GetJob), `sia ls` (ListJobs), the job's last event in the
history (ListEvents), and, where the test follows them, two that run all along:

- `WatchReplay`: `sia watch`'s stream (WatchJobs from revision 0, as the CLI opens
  it) replayed into job -> (state, reason). When the stream breaks (a restart, a
  failover) it is reopened after the last revision seen, which promises exactly the
  changes missed: a change repeated, or one skipped (the store's revisions count up
  by one per change), is a broken promise and fails the check for good.
- `DashboardJobs`: the dashboard's jobs as its web page reads them: the `/jobs`
  page's rows, then every `job` frame (JSON) of its `/events` stream.

And the rounds: ListRounds in (term, round) order, each of the last ones finished
in the history, and no (term, round) finished twice: a round's name is never reused,
not by the next term, not by a restart (`RoundNames` also remembers the names seen
across the checks of one test).

`agree` returns '' when all agree, else what disagrees: the caller reads again until
a deadline (a round between two reads moves the store on), since every view is read
before the store and so is never ahead of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import random
import re
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp

from sia_grpc.api import pb, seconds, state_name
from sia_grpc.api.errors import ApiError
from sia_grpc.api.present import job_reason
from sia_grpc.client import AsyncSiaClient

JOB_KINDS = (pb.EVENT_KIND_JOB_SUBMITTED, pb.EVENT_KIND_JOB_CHANGED)

# The store's copy of a job (None: no such job), read after the views.
Stored = Callable[[str], Awaitable[pb.Job | None]]


class Follower(Protocol):
    """A view that follows the jobs on its own (a watch, the dashboard)."""

    name: str
    broken: list[str]  # promises it found broken (these fail the check for good)

    def said(self, job_id: str) -> tuple[str, str] | None:
        """What it shows of the job: (state, reason) as it words them; None: nothing."""

    def expected(self, job: pb.Job) -> tuple[str, str]:
        """What it should show of the store's `job`."""


class WatchReplay:
    """`sia watch`, replayed (`run`, a task of the test's): see the module docstring."""

    name = "sia watch"

    def __init__(self, sia: AsyncSiaClient) -> None:
        self.sia = sia
        self.jobs: dict[str, pb.Job] = {}
        self.revision = 0  # the last change seen (0: none yet, a snapshot is asked for)
        self.reopened = 0  # streams that ended or failed, and were opened again
        self.broken: list[str] = []
        self.opened = asyncio.Event()  # the first stream sent its first message, or ended

    async def run(self) -> None:
        while True:
            since = self.revision
            try:
                async for ev in self.sia.watch(since_revision=since):
                    self._take(ev)
                    self.opened.set()
            except ApiError:
                pass  # (the SDK gave up reconnecting: reopened here, after `revision`)
            self.opened.set()
            self.reopened += 1
            await asyncio.sleep(0.05)

    def _take(self, ev: pb.JobEvent) -> None:
        job = ev.job
        if ev.kind == pb.JobEvent.KIND_SNAPSHOT:
            if job.revision >= self.jobs.get(job.job_id, pb.Job()).revision:
                self.jobs[job.job_id] = job
            return
        if self.revision and ev.revision != self.revision + 1:
            self.broken.append(f"after revision {self.revision} came {ev.revision} "
                               f"({'a repeat' if ev.revision <= self.revision else 'a gap'}; "
                               f"stream {self.reopened + 1})")
        self.revision = max(self.revision, ev.revision)
        if ev.kind == pb.JobEvent.KIND_DELETED:
            self.jobs.pop(job.job_id, None)
        else:
            self.jobs[job.job_id] = job

    def said(self, job_id: str) -> tuple[str, str] | None:
        job = self.jobs.get(job_id)
        return None if job is None else self.expected(job)

    def expected(self, job: pb.Job) -> tuple[str, str]:
        return state_name(job.status.state), job.status.reason


_ROW = re.compile(r'<tr data-job="([^"]*)" data-state="([^"]*)"[^>]*>(.*?)</tr>', re.S)
_REASON = re.compile(r'<td class="reason" data-sort="[^"]*">(.*?)</td>', re.S)


class DashboardJobs:
    """The dashboard's jobs as its page reads them (`run`, a task of the test's): the
    `/jobs` page's rows once subscribed to `/events`, then each `job` frame, JSON
    holding the row the page puts in place (or `deleted`). A stream the dashboard
    ends (a subscriber too far behind) is opened again, the page read again."""

    name = "the dashboard"

    def __init__(self, url: str) -> None:
        self.url = url  # the dashboard's, ending in '/'
        self.rows: dict[str, tuple[str, str]] = {}
        self.frames = 0
        self.broken: list[str] = []
        self.opened = asyncio.Event()

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    await self._follow(session)
                await asyncio.sleep(0.1)

    async def _follow(self, session: aiohttp.ClientSession) -> None:
        async with session.get(f"{self.url}events") as resp:
            resp.raise_for_status()
            buffered = b""
            loaded = False
            async for chunk in resp.content.iter_any():
                buffered += chunk
                *frames, buffered = buffered.split(b"\n\n")
                for frame in frames:
                    kind, data = _frame(frame.decode())
                    if kind == "hello" and not loaded:  # subscribed: now the page
                        async with session.get(f"{self.url}jobs") as page:
                            self.rows = dict(_rows(await page.text()))
                        loaded = True
                        self.opened.set()
                    elif kind == "job" and data is not None:
                        self.frames += 1
                        if data.get("deleted"):
                            self.rows.pop(data["id"], None)
                        else:
                            ((job_id, shown),) = _rows(data["row"])
                            if job_id != data["id"]:
                                self.broken.append(f"a job frame for {data['id']!r} holds "
                                                   f"the row of {job_id!r}")
                            self.rows[job_id] = shown

    def said(self, job_id: str) -> tuple[str, str] | None:
        return self.rows.get(job_id)

    def expected(self, job: pb.Job) -> tuple[str, str]:
        return state_name(job.status.state), job_reason(job)


def _frame(text: str) -> tuple[str, dict | None]:
    kind, data = "", None
    for line in text.splitlines():
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
    return kind, data


def _rows(page: str) -> list[tuple[str, tuple[str, str]]]:
    """The jobs table's rows: (job id, (state, reason as shown))."""
    out = []
    for job_id, state, cells in _ROW.findall(page):
        reason = _REASON.search(cells)
        out.append((html.unescape(job_id),
                    (state, html.unescape(reason.group(1)) if reason else "")))
    return out


class RoundNames:
    """The (term, round) names of the rounds seen over a test, with each one's start:
    a name seen again must be the same round (never reused by another term, nor by a
    controller restarted in the same term)."""

    def __init__(self) -> None:
        self.starts: dict[tuple[int, int], float] = {}

    def check(self, rounds: list[pb.Round]) -> str:
        for r in rounds:
            name, start = (r.term, r.round), seconds(r.start_time)
            if self.starts.setdefault(name, start) != start:
                return (f"round (term {r.term}, round {r.round}) named twice: started at "
                        f"{self.starts[name]} and at {start}")
        return ""

    @property
    def terms(self) -> set[int]:
        return {term for term, _ in self.starts}


async def common_step(op: str, rng: random.Random, sia: AsyncSiaClient, jobs: list[str],
                      spec: pb.JobSpec) -> bool:
    """The random operator steps both property tests take (`op`: submit `spec`,
    cancel one of `jobs`, drain or undrain a node that is not lost); False for
    another op (the test's own), or a cancel with no jobs."""
    if op == "submit":
        jobs.append((await sia.submit(spec)).job_id)
    elif op == "cancel" and jobs:
        await sia.cancel(rng.choice(jobs))
    elif op in ("drain", "undrain"):
        nodes = [n.name for n in (await sia.cluster()).nodes
                 if n.state != pb.NODE_STATE_LOST]
        if nodes:
            node = rng.choice(nodes)
            await (sia.drain(node, "test") if op == "drain" else sia.undrain(node))
    else:
        return False
    return True


async def agree(sia: AsyncSiaClient, stored: Stored, followers: tuple[Follower, ...] = (),
                names: RoundNames | None = None) -> str:
    """'' when every view agrees with the store, else what disagrees. Each view is
    read before the store (its reads queue behind the writes of what was shown), so
    the store is never behind it; a round in between makes it ahead: the caller
    reads again."""
    for follower in followers:
        if follower.broken:
            return f"{follower.name}: {follower.broken[0]}"
    listed = {j.job_id: j.proto async for j in sia.list()}
    for job_id in listed:
        got = (await sia.get(job_id)).proto
        last = (await sia.events(job_id=job_id, kinds=list(JOB_KINDS), limit=1))[-1]
        following = [(f, f.said(job_id)) for f in followers]
        job = await stored(job_id)
        assert job is not None, job_id  # (listed: stored)
        said = (job.status.state, job.status.reason)
        for view, state, reason in (
                ("get", got.status.state, got.status.reason),
                ("ls", listed[job_id].status.state, listed[job_id].status.reason),
                ("its last event", last.state, last.reason)):
            if (state, reason) != said:
                return f"{job_id}: {view} {(state, reason)}, the store {said}"
        for follower, shown in following:
            if shown != follower.expected(job):
                return (f"{job_id}: {follower.name} {shown}, the store "
                        f"{follower.expected(job)}")
    got_rounds = await sia.rounds(limit=1000)
    rounds = [(r.term, r.round) for r in got_rounds if r.round]
    if rounds != sorted(rounds):
        return f"rounds out of order: {rounds}"
    if names is not None and (problem := names.check([r for r in got_rounds if r.round])):
        return problem
    finished = [(e.term, e.round) for e in await sia.events(
        kinds=[pb.EVENT_KIND_ROUND_FINISHED], limit=1000) if e.round]
    if len(set(finished)) != len(finished):
        twice = sorted({r for r in finished if finished.count(r) > 1})
        return f"rounds finished twice in the history: {twice}"
    missing = [r for r in rounds[-20:] if r not in set(finished)]
    return f"rounds not in the history: {missing}" if missing else ""


async def until_agreed(sia: AsyncSiaClient, stored: Stored, followers: tuple[Follower, ...] = (),
                       names: RoundNames | None = None, timeout: float = 20.0) -> str:
    """`agree`, again every 0.1 s until it does or `timeout` seconds pass; the last
    disagreement ('' for none)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (problem := await agree(sia, stored, followers, names)) and loop.time() < deadline:
        await asyncio.sleep(0.1)
    return problem
