"""Modeled workers: training progress from the profile data, no GPUs needed.

A worker on the job's rank-0 node pays the application's restore delay, then
advances at `AppTruth.progress_rate` for its allocation (the simulator's very
formula), epoch by epoch: the rate is constant within an epoch, so progress is a
piecewise-linear function of modeled time, computed from the clock rather than by
counting ticks. Modeled time runs `time_scale` times faster than the clock.
Workers on other nodes of a multi-node job only hold their GPUs.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import structlog

from sia_grpc.api import pb
from sia_grpc.clock import Clock, MonotonicClock
from sia_grpc.emulation import AppTruth, load_app
from sia_grpc.nodeagent.backend import ExitCallback, Launch

__all__ = ["PROFILE_STEPS", "ModeledBackend", "Trajectory"]

PROFILE_STEPS = 5  # steps timed per batch size in a profiling pass
_UINT32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Trajectory:
    """Progress (application units) against modeled training seconds for one shape.

    `starts[i]` is when segment i begins; it runs from `from_progress[i]` at
    `rates[i]` progress/s until the end of its epoch. `duration` is the training
    time to reach `max_progress`.
    """

    starts: tuple[float, ...]
    from_progress: tuple[float, ...]
    rates: tuple[float, ...]
    duration: float
    max_progress: float
    step_time: float
    sync_time: float
    accum_steps: int

    @classmethod
    def plan(cls, app: AppTruth, gpu_type: str, alloc: pb.Allocation,
             progress: float) -> Trajectory:
        starts: list[float] = []
        from_p: list[float] = []
        rates: list[float] = []
        bounds = app.epoch_bounds()
        epoch_rates, step, sync = app.epoch_rates(
            gpu_type, alloc.num_nodes, alloc.num_replicas, alloc.atomic_batch_size,
            alloc.accum_steps)
        t = 0.0
        while progress < app.max_progress:
            e = app.epoch(progress)
            end = bounds[e][1]  # > progress: epoch() bisects right
            starts.append(t)
            from_p.append(progress)
            rates.append(epoch_rates[e])
            t += (end - progress) / epoch_rates[e]
            progress = end
        return cls(tuple(starts), tuple(from_p), tuple(rates), t, app.max_progress,
                   step, sync, alloc.accum_steps)

    @property
    def iteration_time(self) -> float:
        return self.step_time + (self.step_time - self.sync_time) * self.accum_steps

    def progress(self, trained_s: float) -> float:
        """Progress after `trained_s` modeled seconds of training."""
        if trained_s >= self.duration:
            return self.max_progress
        i = max(bisect.bisect_right(self.starts, trained_s) - 1, 0)
        return self.from_progress[i] + self.rates[i] * (trained_s - self.starts[i])


@dataclass(eq=False)
class _Worker:
    launch: Launch
    started: float  # clock seconds
    app: AppTruth
    trajectory: Trajectory | None  # None off the leader node
    delay_s: float  # modeled restore delay before training starts
    task: asyncio.Task[None] | None = None
    on_exit: ExitCallback | None = None
    reported_steps: int = 0
    log: Any = None


class ModeledBackend:
    """`WorkerBackend` whose workers follow `sia_grpc.emulation`.

    `time_scale` is modeled seconds per clock second (60: a 60 s round in 1 s).
    """

    def __init__(self, gpu_type: str, *, time_scale: float = 1.0,
                 clock: Clock | None = None, node_id: str = "") -> None:
        if not time_scale > 0 or not math.isfinite(time_scale):
            raise ValueError(f"time_scale: must be positive, got {time_scale!r}")
        self.gpu_type = gpu_type
        self.time_scale = float(time_scale)
        self.clock: Clock = clock or MonotonicClock()
        self._workers: dict[str, _Worker] = {}
        self._log = structlog.get_logger().bind(node_id=node_id, backend="modeled")

    # -- WorkerBackend ----------------------------------------------------------------

    def check(self, launch: Launch) -> None:
        app = self._app(launch.spec.application)
        if self.gpu_type not in app.gpu_types:
            raise ValueError(f"spec.application: {app.name} has no profile for this node's "
                             f"GPU type {self.gpu_type!r}")
        launch.check_gpu_type(self.gpu_type)
        a = launch.allocation
        if a.num_nodes < 1 or a.num_replicas < a.num_nodes:
            raise ValueError(f"allocation: need 1 <= num_nodes <= num_replicas, got "
                             f"num_nodes={a.num_nodes}, num_replicas={a.num_replicas}")
        if a.atomic_batch_size < 1:
            raise ValueError("allocation.atomic_batch_size: must be >= 1")
        if not 0.0 <= launch.restore_progress <= 1.0:
            raise ValueError(f"restore_progress: must be a fraction in [0, 1], got "
                             f"{launch.restore_progress!r}")

    async def start(self, launch: Launch, on_exit: ExitCallback) -> None:
        self.check(launch)
        if launch.job_id in self._workers:
            raise ValueError(f"job {launch.job_id!r} already runs here")
        app = self._app(launch.spec.application)
        trajectory = None
        if launch.leader:
            trajectory = Trajectory.plan(app, self.gpu_type, launch.allocation,
                                         launch.restore_progress * app.max_progress)
        w = _Worker(launch, self.clock.time(), app, trajectory, app.restart_delay,
                    on_exit=on_exit,
                    log=self._log.bind(job_id=launch.job_id, generation=launch.generation))
        self._workers[launch.job_id] = w
        if trajectory is not None:
            w.task = asyncio.create_task(self._finish(w, on_exit),
                                         name=f"nodeagent:worker:{launch.job_id}")
        w.log.info("worker started", leader=launch.leader, gpus=list(launch.local_gpus),
                   restore_progress=launch.restore_progress)

    async def rebatch(self, job_id: str, allocation: pb.Allocation) -> None:
        w = self._workers[job_id]
        w.launch = dataclasses.replace(w.launch, allocation=allocation)
        if w.trajectory is None:
            return
        on_exit = w.on_exit
        assert on_exit is not None  # (start sets it)
        if w.task is not None:
            w.task.cancel()
            await asyncio.gather(w.task, return_exceptions=True)
        progress, delay_left = self._progress(w), max(
            w.delay_s - (self.clock.time() - w.started) * self.time_scale, 0.0)
        # Continue from here at the new batch; an unfinished restore still has to end.
        w.trajectory = Trajectory.plan(w.app, self.gpu_type, allocation, progress)
        w.started, w.delay_s = self.clock.time(), delay_left
        w.task = asyncio.create_task(self._finish(w, on_exit),
                                     name=f"nodeagent:worker:{job_id}")
        w.log.info("batch changed in place", batch=allocation.batch_size,
                   atomic=allocation.atomic_batch_size, accum=allocation.accum_steps)

    async def stop(self, job_id: str) -> pb.JobExit:
        w = self._workers.pop(job_id)
        if w.task is not None:
            w.task.cancel()
            await asyncio.gather(w.task, return_exceptions=True)
        fraction = (self._progress(w) / w.app.max_progress if w.trajectory is not None
                    else w.launch.restore_progress)  # off the leader: what it was given
        w.log.info("worker checkpointed", progress=fraction)
        return pb.JobExit(job_id=job_id, generation=w.launch.generation,
                          kind=pb.JobExit.KIND_CHECKPOINTED, progress=fraction)

    async def profile(self, request: pb.ProfileRequest) -> pb.Telemetry:
        out = pb.Telemetry(job_id=request.job_id, generation=request.generation, profile=True)
        log = self._log.bind(job_id=request.job_id, gpu=request.local_gpu)
        try:
            app = self._app(request.spec.application)
        except ValueError as exc:
            log.warning("profile: nothing to model", error=str(exc))
            out.profile_error = str(exc)
            return out
        if self.gpu_type not in app.gpu_types:
            log.warning("profile: application has no profile for this GPU type",
                        application=app.name, gpu_type=self.gpu_type)
            out.profile_error = f"{app.name} has no profile for GPU type {self.gpu_type!r}"
            return out
        lo, hi = app.local_bsz_limits(self.gpu_type)
        began, busy_s = self.clock.time(), 0.0
        for b in dict.fromkeys(request.local_batch_sizes):
            if not lo <= b <= hi:
                continue
            step, sync = app.step_time(self.gpu_type, 1, 1, b)
            busy_s += PROFILE_STEPS * step
            out.samples.append(pb.ThroughputSample(
                gpu_type=self.gpu_type, num_nodes=1, num_replicas=1, atomic_batch_size=b,
                accum_steps=0, step_time_s=step, sync_time_s=sync, count=PROFILE_STEPS))
        await self._sleep_until(began + busy_s / self.time_scale)
        # The pass runs real steps, so it measures the gradient statistics too: the
        # scheduler knows the job's statistical efficiency before its first round.
        grad = app.grad_params(0.0)
        out.grad.CopyFrom(pb.GradientStats(sqr=grad.sqr, var=grad.var))
        log.info("profiled", sizes=[s.atomic_batch_size for s in out.samples])
        return out

    def allocation(self, job_id: str) -> pb.Allocation:
        return self._workers[job_id].launch.allocation

    def running(self) -> list[pb.RunningJob]:
        return [pb.RunningJob(job_id=j, generation=w.launch.generation,
                              local_gpus=w.launch.local_gpus)
                for j, w in self._workers.items()]

    def telemetry(self) -> list[pb.Telemetry]:
        out = []
        for w in self._workers.values():
            tr = w.trajectory
            if tr is None:
                continue
            trained = self._trained(w)
            progress = tr.progress(trained)
            t = pb.Telemetry(job_id=w.launch.job_id, generation=w.launch.generation,
                             progress=progress / tr.max_progress)
            if trained > 0:
                # As the simulator's jobs do: the statistics measured at the batch run.
                grad = w.app.grad_params(progress, w.launch.allocation.batch_size or None)
                t.grad.CopyFrom(pb.GradientStats(sqr=grad.sqr, var=grad.var))
                steps = int(trained / tr.iteration_time)
                if steps > w.reported_steps:
                    a = w.launch.allocation
                    t.samples.append(pb.ThroughputSample(
                        gpu_type=self.gpu_type, num_nodes=a.num_nodes,
                        num_replicas=a.num_replicas, atomic_batch_size=a.atomic_batch_size,
                        accum_steps=a.accum_steps, step_time_s=tr.step_time,
                        sync_time_s=tr.sync_time,
                        count=min(steps - w.reported_steps, _UINT32_MAX)))
                    w.reported_steps = steps
            out.append(t)
        return out

    async def close(self) -> None:
        workers, self._workers = list(self._workers.values()), {}
        tasks = [w.task for w in workers if w.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- internals ----------------------------------------------------------------------

    def progress(self, job_id: str) -> float:
        """The job's progress now as a fraction 0..1 (leader node only)."""
        w = self._workers[job_id]
        if w.trajectory is None:
            raise ValueError(f"job {job_id!r}: this node does not model its progress")
        return self._progress(w) / w.app.max_progress

    def _app(self, application: str) -> AppTruth:
        try:
            return load_app(application)
        except ValueError as exc:
            raise ValueError(f"spec.{exc}") from None

    def _trained(self, w: _Worker) -> float:
        """Modeled seconds of training so far (after the restore delay)."""
        return max((self.clock.time() - w.started) * self.time_scale - w.delay_s, 0.0)

    def _progress(self, w: _Worker) -> float:
        assert w.trajectory is not None
        return w.trajectory.progress(self._trained(w))

    async def _finish(self, w: _Worker, on_exit: ExitCallback) -> None:
        assert w.trajectory is not None
        await self._sleep_until(
            w.started + (w.delay_s + w.trajectory.duration) / self.time_scale)
        del self._workers[w.launch.job_id]  # GPUs free before anyone hears of it
        w.log.info("worker completed")
        on_exit(pb.JobExit(job_id=w.launch.job_id, generation=w.launch.generation,
                           kind=pb.JobExit.KIND_COMPLETED, progress=1.0))

    async def _sleep_until(self, deadline: float) -> None:
        while (left := deadline - self.clock.time()) > 0:
            await self.clock.sleep(left)
