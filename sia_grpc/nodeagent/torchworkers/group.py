"""A worker group: one generation of a job on this node, launched and supervised.

One process per local GPU (`workers.spawn_worker`: own session, killed with the
agent). A stop is SIGTERM to every live worker, then SIGKILL after the grace
period. The supervisor waits for the group to end: when a rank fails it stops
the others at once; when ranks complete, the others get the grace period to
follow. Then it sweeps what the workers forked, and says how the group ended
(`exits.group_exit`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sia_grpc.api import pb
from sia_grpc.nodeagent.backend import ExitCallback, Launch
from sia_grpc.nodeagent.torchworkers.exits import group_exit
from sia_grpc.nodeagent.workers import Confinement, WorkerProcess, describe_exit, spawn_worker
from sia_grpc.nodeagent.workerservice import TelemetryAccumulator
from sia_grpc.train import contract as c

__all__ = ["WorkerGroup", "cannot_start", "spawn_ranks"]


def cannot_start(command: Sequence[str], exc: OSError) -> ValueError:
    """A command that could not be started, as the error a directive's ack carries."""
    return ValueError(f"spec.command: cannot start {command[0]!r}: {exc.strerror or exc}")


def spawn_ranks(command: list[str], envs: Sequence[tuple[int, int, Mapping[str, str]]],
                log_dir: Path, cpus: Callable[[int], list[int] | None],
                confine: Confinement | None = None) -> list[WorkerProcess]:
    """One worker per (rank, local GPU, environment), logging to `rank-<r>.log`, on
    `cpus(gpu)`, confined by `confine`; ValueError (none left running) if one
    cannot start."""
    procs: list[WorkerProcess] = []
    try:
        for i, (rank, gpu, env) in enumerate(envs):
            procs.append(spawn_worker(command, env, log_dir / f"rank-{rank}.log", rank=rank,
                                      local_rank=i, cpus=cpus(gpu), confine=confine))
    except OSError as exc:
        for p in procs:
            p.kill_and_reap()
        raise cannot_start(command, exc) from None
    return procs


@dataclass(eq=False)
class WorkerGroup:
    """One generation of a job on this node: its workers and what they said."""

    launch: Launch
    procs: list[WorkerProcess]
    checkpoint_dir: str
    log_dir: Path
    accum: TelemetryAccumulator
    log: Any
    on_exit: ExitCallback | None
    result: asyncio.Future[pb.JobExit]
    stop_grace_s: float  # SIGTERM to SIGKILL
    pending: pb.Allocation | None = None  # a new batch for the next reply
    stop_requested: bool = False  # stop(): exit 75 means checkpointed
    stopping: bool = False  # stop() or close(): no on_exit
    exits: list[WorkerProcess] = field(default_factory=list)  # in exit order
    all_exited: asyncio.Event = field(default_factory=asyncio.Event)
    terminator: asyncio.Task[None] | None = None
    term_delayed: bool = False
    killed_after_grace: set[int] = field(default_factory=set)  # ranks
    oom: pb.OomEvent | None = None
    restore_noted: bool = False
    supervisor: asyncio.Task[None] | None = None
    # Isolation: the run's space (`isolation.node.Space`), its gate to WorkerService
    # and the secret its workers report with; `leave` ends what is left of the run
    # and says what the exit must add (e.g. killed for memory) and whether its GPUs
    # are free (`TorchBackend._leave`).
    space: Any = None
    gate: Any = None
    token: str = ""
    leave: Callable[[WorkerGroup], Awaitable[tuple[str, bool]]] | None = None

    def kill(self) -> None:
        """SIGKILL every worker's process group now (close: nothing is reported)."""
        self.stopping = True
        for p in self.procs:
            p.signal_group(signal.SIGKILL)

    def terminate(self, delay: float = 0.0) -> None:
        """SIGTERM the live workers (after `delay`), SIGKILL after the grace.
        A delayed termination is replaced by an immediate one."""
        if self.terminator is not None:
            if not self.term_delayed or delay:
                return
            self.terminator.cancel()
        self.term_delayed = delay > 0
        self.terminator = asyncio.create_task(
            self._terminate_after(delay), name=f"nodeagent:torch:stop:{self.launch.job_id}")

    async def _terminate_after(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
            self.term_delayed = False
        live = [p for p in self.procs if p.returncode is None]
        if not live:
            return
        self.log.info("stopping workers: SIGTERM", ranks=[p.rank for p in live],
                      grace_s=self.stop_grace_s)
        for p in live:
            p.signal_group(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.stop_grace_s):
                await self.all_exited.wait()
        except TimeoutError:
            late = [p for p in self.procs if p.returncode is None]
            self.log.warning("workers still running after the stop grace: SIGKILL",
                             ranks=[p.rank for p in late], grace_s=self.stop_grace_s)
            self.killed_after_grace.update(p.rank for p in late)
            for p in late:
                p.signal_group(signal.SIGKILL)

    async def supervise(self, release: Callable[[WorkerGroup], None]) -> None:
        """Wait for the group to end, stop the rest when a rank fails, and report.
        `release(self)` frees its GPUs before anyone hears of the end."""
        try:
            await self._wait()
        finally:
            if self.terminator is not None:
                self.terminator.cancel()
            for p in self.procs:
                if p.returncode is None:  # only when cancelled
                    p.kill_and_reap()
                else:
                    p.signal_group(signal.SIGKILL)  # sweep what it forked
            note, free = ("", True) if self.leave is None else await self.leave(self)
            exit_ = group_exit(self, note)
            if free:
                release(self)
            if not self.result.done():
                self.result.set_result(exit_)
            self.log.info("workers ended", kind=pb.JobExit.Kind.Name(exit_.kind),
                          progress=exit_.progress,
                          exits={p.rank: describe_exit(cast(int, p.returncode))  # (ended)
                                 for p in self.exits})
        if not self.stopping and self.on_exit is not None:
            try:
                self.on_exit(exit_)
            except Exception:  # the agent's callback: log it, nobody awaits this task
                self.log.exception("exit callback failed")

    async def _wait(self) -> None:
        waits = {asyncio.create_task(p.wait(), name=f"nodeagent:torch:wait:{p.pid}"): p
                 for p in self.procs}
        pending = set(waits)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    p = waits[t]
                    self.exits.append(p)
                    self.log.info("worker exited", rank=p.rank, pid=p.pid,
                                  status=describe_exit(t.result()))
                if pending and not self.stopping:
                    if any(p.returncode != c.EXIT_COMPLETED for p in self.exits):
                        self.terminate()  # a rank failed: stop its siblings
                    else:  # ranks completed: the others should follow within the grace
                        self.terminate(delay=self.stop_grace_s)
            self.all_exited.set()
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
