"""The controller's event loop: events are decided one at a time by the state machine
(`ControllerState.handle`), in batches; a batch's job changes are written in one
transaction, and what it tells agents leaves only once that write has committed
(write-ahead, `_process`)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import structlog

from sia_grpc.api import pb, state_name
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.shell.base import ShellBase
from sia_grpc.controller.shell.leadership import not_leader
from sia_grpc.controller.stores import job_event

log = structlog.get_logger("sia.controller")
P = ParamSpec("P")
T = TypeVar("T")
# At most this many queued events are decided (and committed) as one batch.
BATCH = 1024
# Events an operator should notice in the log (the rest are logged at info).
_WARNINGS = frozenset({pb.EVENT_KIND_NODE_LOST, pb.EVENT_KIND_QUEUE_RECLAIM})
# An event and the future of whoever waits for it to be durable (None: nobody).
Queued = tuple[sm.Event, "asyncio.Future[None] | None"]


class EventLoop(ShellBase):
    """Events in, actions carried out, writes before messages."""

    async def submit(self, event: sm.Event) -> None:
        """Handle `event` and carry out its actions; returns once they are durable."""
        if not self._elected:  # a call that began as the leader stepped down
            raise not_leader(self.leader_address)
        done = asyncio.get_running_loop().create_future()
        await self._events.put((event, done))
        await done

    def post(self, event: sm.Event) -> None:
        if self._elected:  # else: a late event of a term that ended (its state is gone)
            self._events.put_nowait((event, None))

    async def _process(self) -> None:
        """Handle queued events in batches: decide each in order, carry out the
        actions, write every touched job in one transaction, then send what the
        batch decided to tell agents and answer the RPCs waiting on them (group
        commit: 1,000 events cost one fsync, not 1,000).

        Write-ahead, enforced here (it is about I/O order, so not a state-machine
        invariant): no message leaves for an agent before the state it follows from
        is durable. A RUN sent before its round's write commits, by a leader killed
        in between, starts a worker the store does not know of, and the next leader
        stops it again (a needless restart); a STOP that ends a job, the same with
        its record still RUNNING in the store. So the batch's messages wait, in
        order, for the batch's commit (one per batch, not one per directive), and
        while any write is failing nothing is sent at all: a failed write's
        messages go out after it is retried and commits, or never, once the term
        ends (`Fenced`: a deposed leader's decisions are dropped with its state)."""
        while True:
            batch: list[Queued] = [await self._events.get()]
            while not self._events.empty() and len(batch) < BATCH:
                batch.append(self._events.get_nowait())
            touched: dict[str, None] = {}
            failed = {k: exc for k, (event, _) in enumerate(batch)
                      if (exc := self._decide(event, touched)) is not None}
            error = await self._commit(touched)
            if not self._unpersisted:  # everything decided so far is in the store
                self._send_outgoing()
            for k, (_, done) in enumerate(batch):
                if done is not None and not done.done():
                    failure = failed.get(k) or error
                    if failure is None:
                        done.set_result(None)
                    else:
                        done.set_exception(failure)

    def _decide(self, event: sm.Event, touched: dict[str, None]) -> Exception | None:
        """One event through the state machine, its actions carried out (the jobs it
        changed added to `touched`, to be written with the batch); its error, if the
        state machine failed on it."""
        if isinstance(event, sm.JobCreated):  # the state machine counts it now
            self._pending_creates[event.job.spec.tenant] -= 1
        if type(event) is sm.Tick:  # (its round's jobs are built in the pause)
            self._tick_began_ns = time.time_ns()
            self._pause_collector()
        try:
            actions = self.state.handle(event)
        except Exception as exc:  # the loop must survive any one event
            log.exception("event failed", event=type(event).__name__)
            return exc
        for action in actions:
            if isinstance(action, sm.Persist):
                touched.update(dict.fromkeys(action.job_ids))
                continue
            try:
                self._perform(action)
            except Exception:  # one failed action must not stop the controller
                log.exception("action failed", action=type(action).__name__)
        if type(event) is sm.Tick and not self._round_clock:  # no round began
            self._resume_collector()
        return None

    async def _commit(self, touched: dict[str, None]) -> Exception | None:
        """Write the batch's jobs (and, a second after a failed write, the jobs it
        left unwritten); the write's error, if it failed."""
        retry = self._unpersisted and time.monotonic() >= self._persist_retry_at
        if retry:
            touched.update(dict.fromkeys(self._unpersisted))
        try:
            await self._persist(tuple(touched))
        except Exception as exc:
            # Written again later (a second on, with a batch): the store must not
            # stay behind the live state for a job nothing else touches again;
            # not at once, or a locked store would hold every write up.
            log.exception("persist failed; retried later", jobs=len(touched))
            self._unpersisted.update(touched)
            self._persist_retry_at = time.monotonic() + 1.0
            return exc
        if retry:
            self._unpersisted.clear()
        return None

    def _perform(self, action: sm.Action) -> None:
        match action:
            case sm.Send():
                agent = self._agents.get(action.node_id)
                if agent is not None:  # else: re-sent when it reconnects
                    self._outgoing.append((agent, action.message))  # after the commit
            case sm.Solve():  # (from the tick's handling on: it built the round's jobs)
                self._round_clock[action.round_no] = [self._tick_began_ns, 0]
                self._note(pb.EVENT_KIND_ROUND_STARTED,
                           f"round {action.round_no} started ({action.trigger}): "
                           f"{len(action.jobs)} jobs, {len(action.cluster.nodes)} nodes",
                           round_no=action.round_no)
                # Kept, so close() can wait for it (a dropped task may be collected).
                task = asyncio.create_task(self._solve(action), name=f"sia-solve-{action.round_no}")
                self._solves.add(task)
                task.add_done_callback(self._solves.discard)
            case sm.RoundDone():
                self._round_done(action.round)
                self._check_oversubscribed()
                if self.telemetry is not None:
                    self.telemetry.count_preemptions(action.preempted)
            case sm.RoundSkipped():
                self._publish_round(action.round)
                log.info("round skipped", trigger=action.round.trigger,
                         why=action.round.note.removeprefix("skipped: "))
            case sm.RoundAcked():
                self._round_acked(action.round_no, action.interrupted)
            case sm.WantRound():
                self._schedule_early(action.trigger)
            case sm.Happened():
                self._note(action.kind, action.message, at=action.at, node=action.node,
                           job_id=action.job_id, queue=action.queue)
            case sm.Reconnect():
                agent = self._agents.get(action.node_id)
                if agent is not None:  # ends the stream (behind what was decided before)
                    self._outgoing.append((agent, None))  # it registers again

    def _send_outgoing(self) -> None:
        """Hand the messages decided so far to their streams, in order: called once
        the store holds every state change they follow from (`_process`)."""
        outgoing, self._outgoing = self._outgoing, []
        for agent, message in outgoing:
            agent.outbox.put_nowait(message)

    async def _persist(self, job_ids: tuple[str, ...]) -> None:
        """Write the jobs' live versions, and with them, in the same transaction, the
        events decided since the last write and each job's JOB_CHANGED where its state
        or reason differs from what was last written (so a reason is saved and
        published like every other field: no view can show one the history lacks)."""
        assert self._store is not None  # (open from start on)
        items = [(pb.Job.FromString(self.state.jobs[j].job.SerializeToString()),
                  self.state.extra(j)) for j in job_ids if j in self.state.jobs]
        told = {job.job_id: (job.status.state, job.status.reason) for job, _ in items}
        changed = [job_event(job, pb.EVENT_KIND_JOB_CHANGED, self.term,
                             f"{state_name(job.status.state)}: {job.status.reason}")
                   for job, _ in items if self._told.get(job.job_id) != told[job.job_id]]
        now = int(self.clock.time() * 1e9)
        for event in changed:  # (when it was written: a reason alone moves no update_time)
            event.time.FromNanoseconds(now)
        events = [*self._pending_events, *changed]
        rounds = list(self._unsaved_rounds)
        if not items and not events and not rounds:
            return
        revisions = await self._in_store(self._store.put_jobs, items, events, rounds)
        del self._pending_events[:len(events) - len(changed)]  # (more may have come)
        del self._unsaved_rounds[:len(rounds)]
        self._told.update(told)
        for (job, _), revision in zip(items, revisions, strict=True):
            live = self.state.jobs.get(job.job_id)
            if live is not None:  # what GetJob shows is what WatchJobs says
                live.job.revision = revision
        self._notify_watchers()

    def _note(self, kind: pb.EventKind, message: str, *, at: float | None = None,
              node: str = "", job_id: str = "", queue: str = "", round_no: int = 0,
              taking_office: bool = False) -> None:
        """Record an event of the cluster's history with the next write (logged now);
        only logged by a controller not in office (a standby writes nothing), unless
        it is `taking_office` (the term's first event: its LEADER)."""
        level = log.warning if kind in _WARNINGS else log.info
        about = {k: v for k, v in (("node_id", node), ("job_id", job_id), ("queue", queue),
                                   ("round", round_no)) if v}
        level(pb.EventKind.Name(kind).removeprefix("EVENT_KIND_").lower().replace("_", " "),
              message=message, term=self.term, **about)
        if not (self._elected or taking_office):
            return
        event = pb.Event(kind=kind, term=self.term, message=message, node=node,
                         job_id=job_id, queue=queue, round=round_no)
        event.time.FromNanoseconds(int((self.clock.time() if at is None else at) * 1e9))
        self._pending_events.append(event)

    def _notify_watchers(self) -> None:
        for changed in (*self._job_watchers, *self._event_watchers):
            changed.set()

    async def _in_store(self, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self._writer, functools.partial(fn, *args, **kw))
