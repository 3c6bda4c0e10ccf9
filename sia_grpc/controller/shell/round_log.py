"""Publishing rounds: a round is published once every directive it caused is
acknowledged, or its agent is gone (its `total_ms` is tick to last ack), kept in the
history (saved to the store with the batch that published it), streamed to
WatchRounds, logged, recorded (ROUND_FINISHED) and traced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import structlog

from sia_grpc.api import pb
from sia_grpc.controller.shell.base import ShellBase
from sia_grpc.policy import gcpause

log = structlog.get_logger("sia.controller")
ROUNDS_KEPT = 1000  # published rounds kept (in memory and in the store) for ListRounds
# The longest a round holds the cyclic collector off (`_pause_collector`).
ROUND_COLLECTOR_PAUSE_S = 10.0


class RoundLog(ShellBase):
    """A part of `Controller`: publishing rounds (the module docstring)."""

    def _pause_collector(self) -> None:
        """From a round's tick until no round is in flight (its last ack), or for at
        most `ROUND_COLLECTOR_PAUSE_S`, Python's cyclic collector waits.

        Why: a controller of 1,000 jobs holds a large heap of long-lived records, and
        a round allocates thousands of objects (its jobs for the solver, directives,
        writes); that set off full collections inside the round, 250-300 ms each on
        the event loop, and ~0.3 s of young ones (measured with `gc.callbacks` in the
        1,000-agent bench: two full collections in six rounds). Paused, a collection
        that falls due runs just after the round. Reference counting frees acyclic
        garbage meanwhile; the cap bounds what cyclic garbage can pile up while a slow
        agent's acknowledgement keeps a round open."""
        if self._collector_release is None:
            self._collector_release = gcpause.hold()
            self._collector_cap = asyncio.get_running_loop().call_later(
                ROUND_COLLECTOR_PAUSE_S, self._resume_collector)

    def _resume_collector(self) -> None:
        release, self._collector_release = self._collector_release, None
        if release is not None:
            release()
            assert self._collector_cap is not None  # set with the release
            self._collector_cap.cancel()

    def _round_done(self, rnd: pb.Round) -> None:
        """The round's decisions are made and its directives sent; it is published
        once they are all acknowledged (`_round_acked`)."""
        clock = self._round_clock.get(rnd.round)
        if clock is not None:
            clock[1] = time.time_ns()
        self._unacked_rounds[rnd.round] = rnd

    def _publish_round(self, rnd: pb.Round) -> None:
        """Into the round history (saved to the store with the batch that published
        it, with its ROUND_FINISHED event), in (term, round) order, and to WatchRounds
        streams."""
        if not rnd.HasField("end_time"):
            rnd.end_time.FromNanoseconds(int(self.clock.time() * 1e9))
        rnd.term = self.term
        self._note(pb.EVENT_KIND_ROUND_FINISHED, round_summary(rnd), round_no=rnd.round)
        # In order, though rounds finish out of order (one waiting on a slow agent's
        # acknowledgements): a later round published first is passed.
        self.rounds.append(rnd)
        k = len(self.rounds) - 1
        while k > 0 and (self.rounds[k - 1].term, self.rounds[k - 1].round) > (rnd.term, rnd.round):
            self.rounds[k] = self.rounds[k - 1]
            k -= 1
        self.rounds[k] = rnd
        self._unsaved_rounds.append(rnd)
        for q in list(self._round_watchers):
            q.put_nowait(rnd)

    async def watch_rounds(self) -> AsyncIterator[pb.Round]:
        """Every round published from now on, while the controller serves."""
        q: asyncio.Queue = asyncio.Queue()
        self._round_watchers.add(q)
        try:
            while self.serving:
                rnd = await q.get()
                if rnd is None:  # the controller stopped leading (or closes)
                    break
                yield rnd
            self._check_office()
        finally:
            self._round_watchers.discard(q)

    def _round_acked(self, round_no: int, interrupted: str = "") -> None:
        rnd = self._unacked_rounds.pop(round_no, None)
        clock = self._round_clock.pop(round_no, None)
        if rnd is None or clock is None:
            return  # a late directive of an already published round
        if interrupted:
            rnd.note = f"{rnd.note}; {interrupted}" if rnd.note else interrupted
        tick, solved = clock
        end = time.time_ns()
        rnd.dispatch_ms = (end - solved) / 1e6
        rnd.total_ms = (end - tick) / 1e6
        if not self._round_clock:  # no round in flight any more
            self._resume_collector()
        self._publish_round(rnd)
        log.info("round", round=rnd.round, trigger=rnd.trigger, jobs=rnd.jobs,
                 gpus=rnd.gpus_allocated, moved=rnd.jobs_moved, solve_ms=round(rnd.solve_ms, 1),
                 total_ms=round(rnd.total_ms, 1), note=rnd.note or None,
                 binding=list(rnd.binding_rows) or None, reclaims=rnd.reclaims or None)
        if self.telemetry is not None:
            # estimate, solve and place ran in the solver process: laid end to end from
            # the tick; the rest of the solve wait is queueing and transfer. A solve that
            # timed out or failed reported no timings: its phase is the whole wait (else
            # the solve histogram would count the slowest solves as 0 s).
            solve_ms = rnd.solve_ms
            if rnd.note and not (rnd.estimate_ms or solve_ms or rnd.place_ms):
                solve_ms = (solved - tick) / 1e6
            phases, t = [], tick
            for name, ms in (("estimate", rnd.estimate_ms), ("solve", solve_ms),
                             ("place", rnd.place_ms)):
                phases.append((name, t, t + int(ms * 1e6)))
                t += int(ms * 1e6)
            phases.append(("dispatch", max(t, solved), max(t, end)))
            self.telemetry.record_round(
                rnd.round, trigger=rnd.trigger, start_ns=tick, phases=phases,
                attributes={"jobs": rnd.jobs, "gpus": rnd.gpus_allocated,
                            "jobs_moved": rnd.jobs_moved, "objective": rnd.objective,
                            # queues: the guarantee rows that decided the allocation
                            "binding_rows": list(rnd.binding_rows) or None,
                            "reclaims": rnd.reclaims or None},
                error=rnd.note or None, end_ns=end)


def round_summary(rnd: pb.Round) -> str:
    """A round in words, as its ROUND_FINISHED event says it."""
    name = f"round {rnd.round}" if rnd.round else "a round"  # (a skipped one has no number)
    head = f"{name} (term {rnd.term}, {rnd.trigger or 'timer'})"
    if rnd.note.startswith("skipped"):
        return f"{head} {rnd.note}"
    said = (f"{head} finished: {rnd.jobs} jobs, {rnd.gpus_allocated} GPUs allocated, "
            f"{rnd.jobs_moved} moved")
    if rnd.reclaims:
        said += f", {rnd.reclaims} reclaimed"
    if rnd.total_ms:
        said += f", {rnd.total_ms:.0f} ms"
    return f"{said}; {rnd.note}" if rnd.note else said
