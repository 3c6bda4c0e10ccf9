"""The profiling passes the controller asks of this node: at most one per GPU, each in a
task of its own so the directives after it are not held up; a GPU being profiled
refuses RUNs until its pass ends. Also the check, shared with the directives' RUNs,
that the GPUs asked for exist and are free."""

from __future__ import annotations

import asyncio
from typing import Any

from sia_grpc.api import pb
from sia_grpc.nodeagent.backend import WorkerBackend
from sia_grpc.nodeagent.config import AgentConfig
from sia_grpc.nodeagent.outbox import Outbox
from sia_grpc.nodeagent.tasks import cancel

__all__ = ["Profiler"]


class Profiler:
    """This node's profiling passes. Each ends with a report (the result, an error, or
    a refusal) sent as Telemetry, except a pass cancelled by `stop`."""

    def __init__(self, config: AgentConfig, backend: WorkerBackend, outbox: Outbox,
                 log: Any) -> None:
        self._node_id, self._num_gpus = config.node_id, config.num_gpus
        self._backend = backend
        self._outbox = outbox
        self._log = log
        self.gpus: dict[int, str] = {}  # local GPU -> job being profiled on it
        self.passes: dict[asyncio.Task[None], pb.ProfileRequest] = {}  # in flight

    def check_gpus(self, gpus: Any, job_id: str, running: dict[str, pb.RunningJob]) -> str:
        """Why `gpus` cannot go to `job_id` ("" if they can): not all this node's,
        listed twice, or held by another job or by a profiling pass."""
        n = self._num_gpus
        if not gpus:
            return "local_gpus: empty"
        if len(set(gpus)) != len(gpus):
            dup = next(g for g in gpus if list(gpus).count(g) > 1)
            return f"local_gpus: GPU {dup} listed twice"
        held = {g: f"held by job {r.job_id} generation {r.generation}"
                for r in running.values() if r.job_id != job_id for g in r.local_gpus}
        held.update({g: f"profiling job {j}" for g, j in self.gpus.items()})
        for g in gpus:
            if g >= n:
                return f"local_gpus: GPU {g} does not exist (this node has GPUs 0..{n - 1})"
            if g in held:
                return f"local_gpus: GPU {g} is {held[g]}"
        return ""

    def start(self, req: pb.ProfileRequest) -> None:
        """Begin the pass `req` asks for, or refuse it (answered at once); returns
        without waiting for the pass."""
        log = self._log.bind(job_id=req.job_id, generation=req.generation, gpu=req.local_gpu)
        if self.gpus.get(req.local_gpu) == req.job_id:
            # Re-sent after a reconnect: the pass in flight answers it.
            log.info("profile request re-delivered: already profiling")
            return
        running = {r.job_id: r for r in self._backend.running()}
        error = self.check_gpus([req.local_gpu], "", running)
        if error:  # answered, so the controller does not wait for it
            log.warning("profile request refused", error=error)
            self._outbox.send(telemetry=pb.Telemetry(
                job_id=req.job_id, generation=req.generation, profile=True,
                profile_gpu=req.local_gpu, profile_refused=True,
                profile_error=f"{self._node_id} refused: {error}"))
            return
        self.gpus[req.local_gpu] = req.job_id
        task = asyncio.create_task(self._run(req, log), name=f"nodeagent:profile:{req.job_id}")
        self.passes[task] = req

        def done(_: asyncio.Task[None]) -> None:  # also for a task cancelled before it ran
            self.passes.pop(task, None)
            if self.gpus.get(req.local_gpu) == req.job_id:
                del self.gpus[req.local_gpu]
        task.add_done_callback(done)

    async def stop(self, job_id: str) -> int:
        """End `job_id`'s profiling passes here (a cancelled pass reports nothing)."""
        tasks = [t for t, r in self.passes.items() if r.job_id == job_id]
        await cancel(*tasks)
        return len(tasks)

    async def _run(self, req: pb.ProfileRequest, log: Any) -> None:
        try:
            result = await self._backend.profile(req)
        except Exception as exc:
            log.exception("profile failed")
            result = pb.Telemetry(job_id=req.job_id, generation=req.generation, profile=True,
                                  profile_error=f"{type(exc).__name__}: {exc}"[:1000])
        finally:  # free before the controller hears of it
            if self.gpus.get(req.local_gpu) == req.job_id:
                del self.gpus[req.local_gpu]
        result.profile_gpu = req.local_gpu  # which pass this answers
        self._outbox.send(telemetry=result)

