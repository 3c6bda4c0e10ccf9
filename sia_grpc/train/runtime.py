"""The per-process training runtime behind the public API.

It drives one worker through the job and decides how the process exits. What it
holds is grouped by concern, each in its own module:

    worker       worker.Worker            rank, world, device, settings (fixed)
    job          jobstate.JobState        data position and progress (checkpointed)
    agreement    agreement.Agreement      the per-step stop/batch agreement
    checkpoints  checkpointing.Checkpointer  registered states, saves, resume
    reports      telemetry.Reports        rank 0's reports to the agent
    profile      profiling.ProfilePass    a profiling pass's stages
    overheads    telemetry.Overheads      what the library costs

and what it does is in parts, each a module (their attributes declared once in
runtime_base.RuntimeBase): the step protocol the data loader drives around every
step (steps.Steps), how the process stops and its process-wide hooks (exits.Exits),
and here the rest: setting up, attaching the model and the loader, targets and
progress, checkpoints and reports.

One runtime per process, reached through `current()`. It is process-wide on
purpose, as torch.distributed's process group is: the public API (`init()`,
`AdaptiveDataParallel(model, optimizer)`, `AdaptiveDataLoader(dataset, ...)`,
`remaining_epochs_until()`, `rank()`) is AdaptDL's and passes no handle between
its parts, and what the runtime owns is process-wide itself (the process group,
the SIGTERM handler, sys.excepthook, an atexit hook). `init()` sets it up once,
`current()` returns it (setting it up with defaults if need be), and `reset()`
forgets it, for tests and benchmarks that run the library twice in one process.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sia_grpc.api import pb
from sia_grpc.train.agreement import Agreement
from sia_grpc.train.checkpointing import Checkpointer
from sia_grpc.train.distributed import shutdown
from sia_grpc.train.env import WorkerEnv
from sia_grpc.train.exits import Exits
from sia_grpc.train.jobstate import JobState
from sia_grpc.train.noise import GradientNoise
from sia_grpc.train.profiling import ProfilePass
from sia_grpc.train.sampler import shape_for
from sia_grpc.train.steps import Steps
from sia_grpc.train.telemetry import AgentClient, Overheads, Reports
from sia_grpc.train.worker import Worker, join

__all__ = ["Runtime", "current", "init", "reset"]

LOG = logging.getLogger("sia_grpc.train")


_current: Runtime | None = None
_lock = threading.Lock()


def init(*, backend: str | None = None, timeout_s: float = 300.0,
         checkpoint_dir: str | None = None, report_interval_s: float | None = None,
         checkpoint_interval_s: float | None = None,
         environ: dict[str, str] | None = None) -> Runtime:
    """Set up this worker (idempotent: a second call returns the same runtime).

    Reads the agent's environment (sia_grpc.train.contract) or torchrun's, joins
    the process group (nccl with CUDA, else gloo; env:// rendezvous, `timeout_s`
    for rendezvous and collectives), finds the newest checkpoint to resume from,
    and installs the SIGTERM handler. Without RANK/WORLD_SIZE it runs alone
    (world 1, no process group, no agent), so a script also runs on a laptop.
    Keyword arguments override the environment's checkpoint directory and
    intervals.
    """
    global _current
    with _lock:
        if _current is None:
            env = WorkerEnv.from_environ(environ)
            worker = join(env, backend=backend, timeout_s=timeout_s,
                          checkpoint_dir=checkpoint_dir, report_interval_s=report_interval_s,
                          checkpoint_interval_s=checkpoint_interval_s)
            try:
                _current = Runtime(worker)
            except BaseException:
                # A start that fails (a refused checkpoint) leaves no process group:
                # its threads, alive at exit, made the process abort (SIGABRT) instead
                # of exiting with the error.
                shutdown()
                raise
        return _current


def current() -> Runtime:
    """The runtime, set up with defaults if `init()` was not called."""
    return _current if _current is not None else init()


def reset() -> None:
    """Forget the runtime: the next `init()` or `current()` sets up a fresh one.

    For tests and benchmarks that train twice in one process. The old runtime's
    SIGTERM disposition and excepthook are put back as it found them (a process
    that goes on must not ignore SIGTERM, nor may the children it forks); its
    atexit hook still runs."""
    global _current
    with _lock:
        if _current is not None:
            _current._unhook()
        _current = None


def _view(group: str, name: str) -> property:
    """A read-only attribute of the runtime that is `self.<group>.<name>`."""
    return property(lambda self: getattr(getattr(self, group), name),
                    doc=f"`{group}.{name}`")


class Runtime(Steps, Exits):
    """One worker's runtime (see the module doc); `init()` makes it."""

    # What the loader, the model wrapper, the epoch loop and the public API read.
    env = _view("worker", "env")
    rank = _view("worker", "rank")
    world_size = _view("worker", "world_size")
    profiling = _view("worker", "profiling")
    position = _view("job", "position")
    steps = _view("job", "steps")
    samples_done = _view("job", "samples_done")
    si_steps = _view("job", "si_steps")
    seed = _view("job", "seed")
    init_batch_size = _view("job", "init_batch_size")
    noise = _view("job", "noise")

    def __init__(self, worker: Worker) -> None:
        env = worker.env
        self.worker = worker
        self.overheads = Overheads()
        self.profile = ProfilePass.of(env.profile_sizes)
        self.agreement = Agreement(worker.rank, worker.world_size, worker.device,
                                   self.overheads)
        self.reports = Reports(AgentClient.of(env), worker.report_interval_s)
        self.checkpoints = Checkpointer(worker.checkpoint_dir, worker.checkpoint_interval_s,
                                        worker.generation, self.overheads)
        resumed = self.checkpoints.resume(worker.rank, worker.device)
        self.job = JobState() if resumed is None else JobState.from_state_dict(resumed)

        # (each attribute's meaning: runtime_base.RuntimeBase)
        self.shape = None
        self.script_epochs = None
        self.model = None
        self.loader = None
        self.rule = "none"
        self._step = None
        self._warm = set()
        self.completed = False
        self._together = False
        self._warned = set()

        self._hook()
        restored = self.checkpoints.restored_from
        LOG.info("sia_grpc.train: rank %d/%d on %s, generation %d%s%s", worker.rank,
                 worker.world_size, worker.device, worker.generation,
                 f", resuming {restored[1]}" if restored else "",
                 f", profiling micro-batches {self.profile.sizes}" if worker.profiling else "")

    # ---- state registry and checkpoints ------------------------------------------------

    def register_state(self, name: str, obj: Any) -> None:
        """Checkpoint `obj` (anything with state_dict/load_state_dict) as `name`;
        restore it now if the checkpoint being resumed holds `name`."""
        self.checkpoints.register(name, obj)

    def state_dict(self) -> dict:
        """The library's own entry ("sia") of a checkpoint."""
        shape = self.shape
        return {**self.job.state_dict(), "generation": self.worker.generation,
                "world_size": self.worker.world_size,
                "shape": [shape.replicas, shape.atomic, shape.accum] if shape else None,
                "time": time.time()}

    def save_checkpoint(self) -> pb.CheckpointEvent:
        """Rank 0: write the checkpoint of this generation now (atomically)."""
        assert self.worker.checkpoint_dir and self.worker.rank == 0
        path, save_s = self.checkpoints.save(self.state_dict(), self.job.steps)
        LOG.info("checkpoint %s: %.1f%% of the target, %.3f s", path, 100 * self.progress(),
                 save_s)
        return pb.CheckpointEvent(generation=self.worker.generation, path=str(path),
                                  progress=self.progress(), save_s=save_s,
                                  restore_s=(self.reports.startup_s or 0.0)
                                  if self.checkpoints.restored_from else 0.0)

    # ---- attachments ---------------------------------------------------------------------

    def attach_model(self, model: Any, rule: str) -> None:
        if self.model is not None:
            raise RuntimeError("only one AdaptiveDataParallel per process")
        self.model = model
        self.rule = rule

    def attach_loader(self, loader: Any, dataset_len: int, batch_size: int, seed: int) -> None:
        job, world_size = self.job, self.worker.world_size
        if self.loader is not None:
            raise RuntimeError("only one AdaptiveDataLoader per process (use a plain "
                               "DataLoader for evaluation)")
        if dataset_len < 1:
            raise ValueError("the dataset is empty")
        if job.dataset_len is not None and job.dataset_len != dataset_len:
            raise RuntimeError(f"the checkpoint was taken with {job.dataset_len} samples, "
                               f"the dataset now has {dataset_len}: cannot resume")
        if job.init_batch_size is not None and job.init_batch_size != batch_size:
            LOG.warning("batch_size=%d differs from the initial batch %d the job began with; "
                        "keeping %d", batch_size, job.init_batch_size, job.init_batch_size)
        if self.checkpoints.restored_from is not None and job.seed != seed:
            LOG.warning("seed %d differs from the checkpoint's %d; keeping %d", seed,
                        job.seed, job.seed)
        else:
            job.seed = seed
        self.loader = loader
        job.dataset_len = dataset_len
        job.init_batch_size = job.init_batch_size or batch_size
        if job.noise is None:
            job.noise = GradientNoise(job.init_batch_size)
        env = self.worker.env
        if self.worker.profiling:
            self.shape = self.profile.first_shape()
        elif env.atomic_batch_size or env.batch_size:
            self.shape = shape_for(world_size, env.batch_size, env.atomic_batch_size,
                                   env.accum_steps)
        else:
            self.shape = shape_for(world_size, job.init_batch_size, 0, env.accum_steps)
        if dataset_len < world_size:
            raise ValueError(f"{dataset_len} samples cannot feed {world_size} replicas")

    # ---- targets and progress ------------------------------------------------------------

    def target_samples(self) -> int | None:
        return self.job.target_samples(self.worker.env, self.script_epochs)

    def progress(self) -> float:
        """Fraction of the target's samples trained on (0 without a target)."""
        return self.job.progress(self.target_samples())

    def target_reached(self) -> bool:
        if self.worker.profiling:
            return False
        target = self.target_samples()
        if target is None:
            return False
        replicas = self.shape.replicas if self.shape else self.worker.world_size
        return target - self.job.samples_done < replicas

    # ---- telemetry ---------------------------------------------------------------------------

    def report(self, *, checkpoint: pb.CheckpointEvent | None = None,
               oom: pb.OomEvent | None = None, profile: bool = False,
               force: bool = False) -> pb.WorkerReply | None:
        """Send a WorkerReport now (rank 0, or any rank for an OOM); None on failure."""
        if self.reports.client is None:
            return None
        t0 = time.perf_counter()
        table, noise = self.job.table, self.job.noise
        samples, raw = table.take()
        t = pb.Telemetry(job_id=self.worker.env.job_id, generation=self.worker.generation,
                         samples=samples, progress=self.progress(), profile=profile)
        if noise is not None and noise.known:
            t.grad.CopyFrom(pb.GradientStats(sqr=noise.sqr, var=noise.var))
        if checkpoint is not None:
            t.checkpoint.CopyFrom(checkpoint)
        report = pb.WorkerReport(telemetry=t, rank=self.worker.rank,
                                 startup_s=self.reports.startup_s or 0.0)
        if oom is not None:
            report.oom.CopyFrom(oom)
        reply = self.reports.send(report, force=force)
        self.overheads.report_s += time.perf_counter() - t0
        self.overheads.reports += 1
        if reply is None:
            table.put_back(raw)
            return None
        if not profile:
            self._on_reply(reply)
        return reply

    def _on_reply(self, reply: pb.WorkerReply) -> None:
        ag = self.agreement
        if not reply.current:
            ag.want_stale = True
            return
        if reply.batch_size or reply.atomic_batch_size or reply.accum_steps:
            try:
                want = shape_for(self.worker.world_size, reply.batch_size,
                                 reply.atomic_batch_size, reply.accum_steps)
            except ValueError as e:
                LOG.warning("ignoring the agent's batch %s: %s", reply, e)
                return
            cur = ag.next_shape or self.shape
            ag.want_shape = None if want == cur else want

    def warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            LOG.warning(msg, *args)
