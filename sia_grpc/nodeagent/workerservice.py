"""The agent's side of WorkerService: a gRPC server on a Unix socket that the
workers' rank 0 reports to, and the per-job telemetry those reports add up to.

The socket is `<workdir>/agent.sock`; a Unix socket path has at most 107 bytes,
so a longer one moves to a fresh private temporary directory. The server handles
each Report on the agent's event loop through one callback (`handler`), so the
back-end's state needs no locks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc

from sia_grpc.api import WorkerServiceServicer, add_WorkerServiceServicer_to_server, pb

__all__ = ["MAX_SOCKET_PATH", "TelemetryAccumulator", "WorkerServiceServer", "socket_path"]

MAX_SOCKET_PATH = 107  # bytes: sockaddr_un.sun_path is 108, with the NUL
_UINT32_MAX = 2**32 - 1

# (report, the bearer secret it came with: "" if none) -> reply
ReportHandler = Callable[[pb.WorkerReport, str], pb.WorkerReply]


def bearer(context: grpc.aio.ServicerContext) -> str:
    """The `authorization: Bearer <secret>` a call carries, "" if none."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return ""


def socket_path(workdir: Path) -> tuple[Path, Path | None]:
    """(socket path, temporary directory to remove at close or None)."""
    path = workdir / "agent.sock"
    if len(os.fsencode(path.absolute())) <= MAX_SOCKET_PATH:
        return path.absolute(), None
    tmp = Path(tempfile.mkdtemp(prefix="sia-agent-"))  # 0700
    return tmp / "agent.sock", tmp


class _Servicer(WorkerServiceServicer):
    def __init__(self, handler: ReportHandler) -> None:
        self._handler = handler

    async def Report(self, request: pb.WorkerReport,
                     context: grpc.aio.ServicerContext) -> pb.WorkerReply:
        return self._handler(request, bearer(context))


class WorkerServiceServer:
    """WorkerService on `unix:<path>`; `await start()`, `await stop()`."""

    def __init__(self, workdir: Path, handler: ReportHandler) -> None:
        self.path, self._tmpdir = socket_path(workdir)
        self._handler = handler
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    async def start(self) -> None:
        # A socket file left by an agent that died (the workdir lock keeps out a
        # live one) would make the bind fail.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        server = grpc.aio.server()
        add_WorkerServiceServicer_to_server(_Servicer(self._handler), server)
        server.add_insecure_port(self.address)
        await server.start()
        self._server = server
        with contextlib.suppress(OSError):
            # The agent's alone: workers reach it through their generation's gate
            # (`workergate`), which checks who they are.
            os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


class TelemetryAccumulator:
    """What one generation of a job reported since the agent last collected it.

    Samples of one shape (gpu_type, nodes, replicas, micro-batch, accumulation)
    merge into one, their times averaged weighted by step count; progress, the
    gradient statistics and the checkpoint event are the latest. `restore_s`, once
    a worker reported its start-up time after restoring a checkpoint, goes with
    every checkpoint event of the generation.
    """

    def __init__(self, job_id: str, generation: int, gpu_type: str = "") -> None:
        self.job_id, self.generation, self.gpu_type = job_id, generation, gpu_type
        self._samples: dict[tuple[str, int, int, int, int], list[float]] = {}
        self._grad: pb.GradientStats | None = None
        self._checkpoint: pb.CheckpointEvent | None = None
        self._new = False
        self.progress = 0.0  # latest reported fraction
        self.checkpoint_progress: float | None = None  # of the latest checkpoint reported
        self.restore_s = 0.0
        self.reports = 0

    def add(self, t: pb.Telemetry) -> None:
        self.reports += 1
        self._new = True
        for s in t.samples:
            key = (s.gpu_type or self.gpu_type, s.num_nodes, s.num_replicas,
                   s.atomic_batch_size, s.accum_steps)
            n = max(s.count, 1)
            acc = self._samples.setdefault(key, [0.0, 0.0, 0.0])
            acc[0] += n
            acc[1] += s.step_time_s * n
            acc[2] += s.sync_time_s * n
        if t.HasField("grad"):
            self._grad = pb.GradientStats(sqr=t.grad.sqr, var=t.grad.var)
        if t.progress > 0:
            self.progress = t.progress
        if t.HasField("checkpoint"):
            self._checkpoint = pb.CheckpointEvent()
            self._checkpoint.CopyFrom(t.checkpoint)
            self.checkpoint_progress = t.checkpoint.progress

    def restored(self, startup_s: float, path: str, progress: float) -> None:
        """A worker restored the checkpoint at `path` (holding `progress`) and took
        `startup_s` from process start to its first step: the measured restart cost."""
        self.restore_s = startup_s
        self._new = True
        if self._checkpoint is None:
            self._checkpoint = pb.CheckpointEvent(generation=self.generation, path=path,
                                                  progress=progress)

    def take(self, *, profile: bool = False) -> pb.Telemetry | None:
        """A Telemetry of what is new since the last `take`, None if nothing is."""
        if not self._new:
            return None
        out = pb.Telemetry(job_id=self.job_id, generation=self.generation,
                           progress=self.progress, profile=profile)
        for (gpu_type, nodes, replicas, atomic, accum), (n, step, sync) in (
                self._samples.items()):
            out.samples.append(pb.ThroughputSample(
                gpu_type=gpu_type, num_nodes=nodes, num_replicas=replicas,
                atomic_batch_size=atomic, accum_steps=accum, step_time_s=step / n,
                sync_time_s=sync / n, count=min(int(n), _UINT32_MAX)))
        if self._grad is not None:
            out.grad.CopyFrom(self._grad)
        if self._checkpoint is not None:
            out.checkpoint.CopyFrom(self._checkpoint)
            if not out.checkpoint.restore_s and self.restore_s:
                out.checkpoint.restore_s = self.restore_s
        self._samples.clear()
        self._grad = self._checkpoint = None
        self._new = False
        return out
