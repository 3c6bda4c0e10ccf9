"""The directives the controller sends this node, applied one at a time in arrival
order by one task that outlives streams, and the Drain that stops new RUNs.

Acks of the last `ACK_MEMORY` directive ids are kept, so a re-delivered directive is
answered with the same ack and changes nothing. A JobExit always precedes the ack of
the directive that caused it (or rides inside it: `Registered.acks_carry_exits`).
Profiling requests come in the same queue, so a STOP sent after one also ends it.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from sia_grpc.api import pb
from sia_grpc.nodeagent.backend import Launch, WorkerBackend
from sia_grpc.nodeagent.outbox import Outbox
from sia_grpc.nodeagent.profiling import Profiler

__all__ = ["ACK_MEMORY", "Directives"]

ACK_MEMORY = 1000  # directive ids whose acks are remembered for re-delivery


class Directives:
    """What the controller asks of this node: its directives and profiling requests
    (queued with the number of the stream each came on, `put`, and applied by `run`),
    and whether it is draining."""

    def __init__(self, backend: WorkerBackend, outbox: Outbox, profiler: Profiler, log: Any,
                 rejected: collections.deque[tuple[pb.Directive, str]]) -> None:
        self._backend = backend
        self._outbox = outbox
        self._profiler = profiler
        self._log = log
        self.rejected = rejected  # (directive, error) for every one rejected
        self.drain_reason: str | None = None  # set by Drain: no new RUNs
        # Applied one at a time in the order sent, each with the number of the stream
        # it came on (`stream` is the current one's); `applying` is held while one is
        # applied (`NodeAgent._register_message`).
        self._queue: asyncio.Queue[tuple[int, pb.Directive | pb.ProfileRequest]] = \
            asyncio.Queue()
        self.stream = 0
        self.applying = asyncio.Lock()
        self._acks: collections.OrderedDict[int, pb.DirectiveAck] = collections.OrderedDict()
        # Whether the stream's controller reads a STOP's exit inside its ack
        # (`Registered.acks_carry_exits`), and the exit the directive being applied
        # ended a job with, to go with its ack then (`_stopped`).
        self.acks_carry_exits = False
        self._exit_for_ack: pb.JobExit | None = None
        # Jobs that completed here -> generation (the most recent ACK_MEMORY of them).
        self._completed: collections.OrderedDict[str, int] = collections.OrderedDict()

    @property
    def draining(self) -> bool:
        return self.drain_reason is not None

    def put(self, stream: int, d: pb.Directive | pb.ProfileRequest) -> None:
        """Queue `d`, which came on stream number `stream`."""
        self._queue.put_nowait((stream, d))

    def drain(self, drain: pb.Drain) -> None:
        """A Drain: no new RUNs from now on; with `cancel`, take them again."""
        if drain.cancel:
            if self.drain_reason is not None:
                self._log.warning("drain ended: taking new jobs", was=self.drain_reason)
            self.drain_reason = None
        else:
            self.drain_reason = drain.reason or "unspecified"
            self._log.warning("draining: no new jobs", reason=self.drain_reason)

    async def run(self) -> None:
        """Apply what is queued, for ever; what an older stream sent is dropped."""
        while True:
            stream, d = await self._queue.get()
            async with self.applying:
                if stream == self.stream:
                    await self._process(d)
                else:  # (`NodeAgent._register_message`: its controller sends it again)
                    self._log.info("not begun before the stream ended: dropped",
                                   job_id=d.job_id, kind=type(d).__name__)

    async def _process(self, d: pb.Directive | pb.ProfileRequest) -> None:
        if isinstance(d, pb.ProfileRequest):
            self._profiler.start(d)  # (the pass runs on; the next message is not held up)
            return
        ack = self._acks.get(d.directive_id) if d.directive_id else None
        log = self._log.bind(job_id=d.job_id, generation=d.generation,
                             directive_id=d.directive_id, round=d.round)
        if ack is not None:
            log.info("directive re-delivered: same ack, no change", ok=ack.ok)
        else:
            self._exit_for_ack = None
            try:
                error = await self._apply(d, log)
            except Exception as exc:  # the ack must still go out
                log.exception("directive failed")
                error = f"internal error: {type(exc).__name__}: {exc}"
            ack = pb.DirectiveAck(directive_id=d.directive_id, job_id=d.job_id,
                                  generation=d.generation, ok=not error, error=error,
                                  exit=self._exit_for_ack)
            self._exit_for_ack = None
            if d.directive_id:
                self._acks[d.directive_id] = ack
                while len(self._acks) > ACK_MEMORY:
                    self._acks.popitem(last=False)
            if error:
                self.rejected.append((d, error))
                log.warning("directive rejected", error=error)
        self._outbox.send(ack=ack)

    async def _apply(self, d: pb.Directive, log: Any) -> str:
        """Carry out `d`; the error for its ack, "" if it succeeded."""
        if not d.directive_id:
            return "directive_id: must be set"
        if not d.job_id:
            return "job_id: must be set"
        running = {r.job_id: r for r in self._backend.running()}
        current = running.get(d.job_id)
        if d.action == pb.Directive.ACTION_RUN:
            if current is not None and current.generation == d.generation:
                if d.HasField("allocation") and _batch_of(d.allocation) != _batch_of(
                        self._backend.allocation(d.job_id)):
                    await self._backend.rebatch(d.job_id, d.allocation)
                    log.info("batch changed", batch=d.allocation.batch_size)
                else:
                    log.info("already running this generation")
                return ""
            if current is not None and current.generation > d.generation:
                return f"stale generation {d.generation} (running {current.generation})"
            if current is None and self._completed.get(d.job_id, -1) >= d.generation:
                # A RUN (a batch change) that crossed the job's completion: started
                # again it would hold GPUs the controller gives to others once the
                # exit arrives. Its JobExit is already on its way.
                log.info("already completed this generation here: not started again")
                return ""
            if self.draining:
                return f"node draining ({self.drain_reason})"
            error = self._profiler.check_gpus(d.local_gpus, d.job_id, running)
            if error:
                return error
            launch = Launch.from_directive(d)
            try:
                self._backend.check(launch)
            except ValueError as exc:
                return str(exc)
            if current is not None:
                log.info("stopping the older generation first", old=current.generation)
                self._stopped(await self._backend.stop(d.job_id))
            await self._backend.start(launch, self.on_exit)
            log.info("running", gpus=list(d.local_gpus))
            return ""
        if d.action == pb.Directive.ACTION_STOP:
            # A job cancelled while being profiled: its passes end with it, and the
            # ack goes out only once their GPUs are free (the controller then frees
            # them in its books).
            passes = await self._profiler.stop(d.job_id)
            if current is None:
                log.info("stop: not running here", profiling_passes_stopped=passes or None)
                return ""
            if current.generation > d.generation:
                return f"stale generation {d.generation} (running {current.generation})"
            self._stopped(await self._backend.stop(d.job_id))
            log.info("stopped", generation=current.generation)
            return ""
        return f"action: unsupported ({pb.Directive.Action.Name(d.action)})"

    def _stopped(self, exit_: pb.JobExit) -> None:
        """A job the directive being applied stopped: its exit goes before the ack, in
        the ack itself where the controller reads it there (one message, not two: a
        round that moves 800 jobs sends 800 fewer), else as a message of its own."""
        if not self.acks_carry_exits:
            self._outbox.send(exit=exit_)
            return
        if self._exit_for_ack is not None:  # (an earlier one, in order: not held back)
            self._outbox.send(exit=self._exit_for_ack)
        self._exit_for_ack = exit_

    def on_exit(self, exit_: pb.JobExit) -> None:
        if exit_.kind == pb.JobExit.KIND_COMPLETED:
            self._completed[exit_.job_id] = exit_.generation
            self._completed.move_to_end(exit_.job_id)
            while len(self._completed) > ACK_MEMORY:
                self._completed.popitem(last=False)
        self._log.info("job exited", job_id=exit_.job_id, generation=exit_.generation,
                       kind=pb.JobExit.Kind.Name(exit_.kind), progress=exit_.progress)
        self._outbox.send(exit=exit_)


def _batch_of(a: pb.Allocation) -> tuple[int, int, int]:
    return a.batch_size, a.atomic_batch_size, a.accum_steps
