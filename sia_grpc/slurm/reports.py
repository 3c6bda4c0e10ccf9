"""The bridge's WorkerService: where the workers of opted-in jobs report their step
times and gradient statistics, as they report to a node agent (the
`sia_grpc.train` contract), here over TCP with a bearer token, since the bridge
runs on another host than the jobs (`SIA_AGENT_ADDRESS`, `SIA_AGENT_TOKEN`).

Reports add up in memory between rounds only: each round the bridge `take`s them
and writes them into the jobs' tickets (their Slurm comments), so what Sia learnt
outlives the bridge. A report is keyed by the sia job id (`SIA_JOB_ID`); when the
first report of each generation (`SIA_GENERATION`, one per copy) came is kept too,
since the bridge measures what a move cost from it.

The reply to a copy's rank 0 carries the batch the bridge last gave the job (its
ticket's): a batch change where the GPUs stay is made in place, the workers told,
nothing restarted (docs/slurm.md, "What the bridge does each round").
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import grpc

from sia_grpc.api import WorkerServiceServicer, add_WorkerServiceServicer_to_server, pb
from sia_grpc.nodeagent.workerservice import TelemetryAccumulator

__all__ = ["ReportServer"]


class _Servicer(WorkerServiceServicer):
    def __init__(self, server: ReportServer) -> None:
        self._server = server

    def Report(self, request: pb.WorkerReport, context: grpc.ServicerContext) -> pb.WorkerReply:
        # (a text key's value is a str: only "-bin" keys carry bytes)
        given = cast(str, dict(context.invocation_metadata()).get("authorization", ""))
        if not hmac.compare_digest(given.encode(), f"Bearer {self._server.token}".encode()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is required")
        if not request.telemetry.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "telemetry.job_id: must be set")
        self._server.add(request.telemetry)
        reply = pb.WorkerReply(current=True)
        batch = self._server.batch(request.telemetry.job_id, request.telemetry.generation)
        if request.rank == 0 and batch is not None:  # (rank 0 speaks for the job)
            reply.batch_size, reply.atomic_batch_size, reply.accum_steps = batch
        return reply


class ReportServer:
    """WorkerService on `listen` (HOST:PORT; port 0: any free one, see `port`);
    `clock` is the bridge's."""

    def __init__(self, listen: str, token: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        if not token:
            raise ValueError("the workers' token must not be empty")
        self.token = token
        self._lock = threading.Lock()
        self._jobs: dict[str, TelemetryAccumulator] = {}
        self._first: dict[str, tuple[int, float]] = {}  # job -> (generation, its 1st report)
        self._batches: dict[str, tuple[int, tuple[int, int, int]]] = {}
        self.clock = clock
        self.received = 0
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        add_WorkerServiceServicer_to_server(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port(listen)
        if not self.port:
            raise OSError(f"cannot listen on {listen}")
        self._server.start()

    def add(self, t: pb.Telemetry) -> None:
        with self._lock:
            acc = self._jobs.get(t.job_id)
            if acc is None:
                acc = self._jobs[t.job_id] = TelemetryAccumulator(t.job_id, t.generation)
            acc.add(t)
            if self._first.get(t.job_id, (-1, 0.0))[0] < t.generation:
                self._first[t.job_id] = (t.generation, self.clock())
            self.received += 1

    def set_batches(self, batches: Mapping[str, tuple[int, tuple[int, int, int]]]) -> None:
        """Sia job id -> (generation, (batch, atomic batch, accumulation steps)): the
        batch its ticket holds, which each reply to that copy's rank 0 carries (the
        workers change to it at their next step if they run another: `sia_grpc.train`'s
        agreement, as with a node agent's `WorkerReply`). Replaces the last call's."""
        with self._lock:
            self._batches = dict(batches)

    def batch(self, job_id: str, generation: int) -> tuple[int, int, int] | None:
        with self._lock:
            gen, batch = self._batches.get(job_id, (-1, (0, 0, 0)))
        return batch if gen == generation and any(batch) else None

    def take(self) -> dict[str, pb.Telemetry]:
        """Sia job id -> what its workers reported since the last `take`."""
        with self._lock:
            out = {job_id: acc.take() for job_id, acc in self._jobs.items()}
        return {job_id: t for job_id, t in out.items() if t is not None}

    def first_report(self, job_id: str, generation: int) -> float | None:
        """When the first report of `job_id`'s `generation` came (the clock's time),
        None if none has (or one of a later generation has since)."""
        with self._lock:
            gen, at = self._first.get(job_id, (-1, 0.0))
        return at if gen == generation else None

    def stop(self) -> None:
        self._server.stop(None).wait()
