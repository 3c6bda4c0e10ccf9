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

The data loader drives it around every step:

    boundary()                      stop / stale / profiling done → exit here;
                                    periodic checkpoint and report (rank 0)
    plan = next_plan()              the next step's samples and shape
    for each micro-step a:
        begin_micro(a); <user: forward, backward, optimizer.step()>; end_micro(a)
    end_step()                      timing sample, warm-up bookkeeping

and the patched `optimizer.step()` runs `optimizer_step` on the last micro-step:
the agreement collective, gradient statistics, LR scaling, the real step and
the position's commit.

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

import atexit
import contextlib
import datetime
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sia_grpc.api import pb
from sia_grpc.train import contract as c
from sia_grpc.train.agreement import Agreement, OnSum
from sia_grpc.train.checkpointing import Checkpointer
from sia_grpc.train.distributed import all_reduce_sum, shutdown
from sia_grpc.train.env import WorkerEnv
from sia_grpc.train.gradients import StepGradients
from sia_grpc.train.jobstate import JobState
from sia_grpc.train.noise import GradientNoise
from sia_grpc.train.profiling import ProfilePass
from sia_grpc.train.sampler import StepPlan, StepShape, plan_step, shape_for
from sia_grpc.train.scaling import lr_factor
from sia_grpc.train.telemetry import AgentClient, Overheads, Reports, SampleKey
from sia_grpc.train.worker import Worker, join

__all__ = ["Runtime", "current", "init", "reset"]

LOG = logging.getLogger("sia_grpc.train")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in msg.lower()
                                              or "can't allocate memory" in msg)


@dataclass
class _Step:
    """The step in flight."""

    plan: StepPlan
    micro: int = 0
    t_fetch: float = 0.0    # this micro-step's start (before its batch is fetched)
    t_yield: float = 0.0    # when its batch went to the user
    stepped: bool = False
    agreed: bool = False
    sync_s: float = 0.0     # all-reduce wait + agreement, on the last micro-step
    last_micro_s: float = 0.0


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


class Runtime:
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

        self.shape: StepShape | None = None       # the shape the steps take now
        self.script_epochs: float | None = None   # the script's own target
        self.model: Any = None                    # the AdaptiveDataParallel
        self.loader: Any = None                   # the AdaptiveDataLoader
        self.rule = "none"                        # the LR scaling rule
        self._step: _Step | None = None
        self._warm: set[StepShape] = set()        # shapes whose first (untimed) step is done
        self.completed = False
        self._together = False  # every rank ends at the same point (barrier at exit)
        self._warned: set[str] = set()

        self._prev_sigterm: Any = None  # what reset() puts back, when we set one
        if worker.checkpoint_dir and threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._atexit)
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

    # ---- the step protocol -----------------------------------------------------------------

    def boundary(self) -> None:
        """Between steps: act on what all ranks agreed; periodic work on rank 0."""
        if self.agreement.stale:
            LOG.warning("the agent says generation %d is no longer current: exiting "
                        "without a checkpoint", self.worker.generation)
            self._exit(c.EXIT_STALE)
        if self.worker.profiling:
            if self.profile.done:
                self._finish_profile()
            return
        if self.agreement.stop and not self.target_reached():
            self._stop_with_checkpoint()
        if self.worker.rank != 0:
            return
        now = time.monotonic()
        if self.checkpoints.due(now, self.job.steps):
            self.report(checkpoint=self.save_checkpoint(), force=True)
        elif self.reports.due(now, self.job.steps):
            self.report()

    def next_plan(self) -> StepPlan | None:
        if (new := self.agreement.take_shape()) is not None:
            self.shape = new
        job = self.job
        assert self.shape is not None and job.dataset_len is not None
        target = None if self.worker.profiling else self.target_samples()
        limit = None if target is None else target - job.samples_done
        plan = plan_step(job.position, job.dataset_len, self.shape, limit)
        if plan is not None:
            self._step = _Step(plan)
        return plan

    def end_epoch(self) -> None:
        """The loader found no further step in this epoch."""
        if not self.target_reached():
            self.job.end_epoch()

    def skip_epoch(self) -> None:
        """The script moved on without finishing the epoch: start the next one."""
        self.job.skip_epoch()

    def begin_micro(self, micro: int, t_fetch: float) -> contextlib.AbstractContextManager:
        st = self._step
        assert st is not None
        st.micro = micro
        st.t_fetch = t_fetch
        st.t_yield = time.perf_counter()
        last = micro == st.plan.k - 1
        if self.model is not None:
            self.model.tracker.active = True
            if not last and self.model.ddp is not None:
                return self.model.ddp.no_sync()
        return contextlib.nullcontext()

    def end_micro(self, micro: int) -> None:
        st = self._step
        assert st is not None
        if self.model is not None:
            self.model.tracker.active = False
        if self.worker.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        last = micro == st.plan.k - 1
        pace = self.worker.env.pace
        if pace > 1.0:
            compute = (t1 - st.t_yield) - (st.sync_s if last else 0.0)
            if compute > 0:
                time.sleep((pace - 1.0) * compute)
            t1 = time.perf_counter()
        self.overheads.step_s += t1 - st.t_fetch
        if last:
            st.last_micro_s = t1 - st.t_fetch

    def abort_step(self) -> None:
        """The script left the loop in the middle of a step."""
        if self.model is not None:
            self.model.tracker.active = False
            if self._step is not None and not self._step.stepped:
                self.model.tracker.reset()
        self._step = None

    def end_step(self) -> None:
        st = self._step
        assert st is not None
        plan = st.plan
        if not st.stepped:
            self.warn_once("nostep", "a step ended without optimizer.step(); its samples "
                           "count as done")
            if not st.agreed:
                self._agree(0.0, None)
            if self.model is not None:
                self.model.tracker.reset()
            self.job.commit(plan, gain=0.0)
        self._step = None
        self.overheads.steps += 1
        if self.model is not None:
            self.overheads.stats_s += self.model.tracker.hook_s
            self.model.tracker.hook_s = 0.0
        if self.reports.startup_s is None:
            self.reports.startup_s = self.overheads.startup_s = self.worker.startup_s()
        if self.worker.profiling:
            timed, next_shape = self.profile.end_step()
            if timed and plan.regular:
                self._record(plan, st)
            if next_shape is not None:
                self.agreement.next_shape = next_shape
            return
        if plan.regular:
            if plan.shape in self._warm:
                self._record(plan, st)
            else:
                self._warm.add(plan.shape)  # the first step of a shape warms up: not timed

    def _record(self, plan: StepPlan, st: _Step) -> None:
        s = plan.shape
        key = SampleKey(self.worker.env.gpu_type,
                        self.worker.num_nodes if s.replicas > 1 else 1,
                        s.replicas, s.atomic, s.accum)
        self.job.table.add(key, st.last_micro_s, st.sync_s)

    def may_zero_grad(self) -> bool:
        """zero_grad() only between steps, never between accumulating micro-steps."""
        st = self._step
        if st is None or st.stepped or self.model is None:
            return True
        return not self.model.tracker.has_grads

    def optimizer_step(self, orig_step, args: tuple, kwargs: dict) -> Any:
        st = self._step
        if st is None:  # outside the adaptive loader: a plain step
            return orig_step(*args, **kwargs)
        plan = st.plan
        if st.micro < plan.k - 1:
            return None  # accumulating: the step comes with the last micro-step
        if st.stepped:
            self.warn_once("twice", "optimizer.step() called twice in one step; ignoring "
                           "the second")
            return None
        tracker = self.model.tracker
        t0 = time.perf_counter()
        wait = tracker.sync_wait(t0)
        count = plan.shape.replicas * plan.k
        local = tracker.local_sum() if count > 1 else 0.0  # unused by the single case
        grads = tracker.finalize(plan.k, count)
        t1 = time.perf_counter()
        self._agree(local, self._noise_update(grads, plan.n / count)
                    if grads is not None and plan.regular else None)
        t2 = time.perf_counter()
        st.sync_s = wait + (t2 - t1)
        # (both set when the loader is attached: `attach_loader`)
        assert self.job.init_batch_size is not None and self.job.noise is not None
        scale = plan.n / self.job.init_batch_size
        noise = self.job.noise
        factor = lr_factor(self.rule, scale, noise)
        gain = noise.gain(scale)
        self.overheads.stats_s += (t1 - t0) + (time.perf_counter() - t2)
        opt = self.model.optimizer
        saved = [g["lr"] for g in opt.param_groups]
        if factor != 1.0:
            for g in opt.param_groups:
                g["lr"] = g["lr"] * factor
        try:
            out = orig_step(*args, **kwargs)
        finally:
            for g, lr in zip(opt.param_groups, saved, strict=True):
                g["lr"] = lr
        self.job.commit(plan, gain)
        st.stepped = True
        return out

    def _agree(self, local_sqr: float, on_sum: OnSum | None) -> None:
        """Join this step's agreement (sia_grpc.train.agreement)."""
        if self._step is not None:
            self._step.agreed = True
        self.agreement.agree(local_sqr, on_sum, self.shape, self.job.steps)

    def _noise_update(self, g: StepGradients, micro: float) -> OnSum:
        """What the step's squared norms summed over all ranks update: the gradient
        noise estimate. `micro`: samples per micro-batch."""
        def update(total_sqr: float) -> None:
            if g.local is None:
                g.local = total_sqr / g.count
            assert self.job.noise is not None and self.job.init_batch_size is not None
            self.job.noise.update(g.local, g.total, g.count,
                                  g.count * micro / self.job.init_batch_size, biased=g.biased)
        return update

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

    # ---- stopping ------------------------------------------------------------------------------

    def _on_sigterm(self, signum, frame) -> None:
        self.agreement.sigterm = True

    def _stop_with_checkpoint(self) -> None:
        self.agreement.collect()  # the last step's statistics, on every rank
        ok = 1.0
        if self.worker.rank == 0 and self.worker.checkpoint_dir:
            try:
                self.report(checkpoint=self.save_checkpoint(), force=True)
            except Exception:
                LOG.exception("checkpoint failed")
                ok = 0.0
        failed = (all_reduce_sum([1.0 - ok], self.worker.device)[0]
                  if self.worker.world_size > 1 else 1.0 - ok)
        if failed > 0:
            self._exit(1)
        LOG.info("stopped at step %d (epoch %d, %d samples in): exiting %d", self.job.steps,
                 self.job.position.epoch, self.job.position.pos, c.EXIT_CHECKPOINTED)
        self._exit(c.EXIT_CHECKPOINTED)

    def finish(self) -> None:
        """The target is reached: final report; a later SIGTERM exits 0."""
        if self.completed or self.worker.profiling:
            return
        self.completed = True
        self._together = True
        if threading.current_thread() is threading.main_thread():
            # Nothing left to checkpoint: a stop that arrives now (the scheduler did not
            # know yet) must not turn a finished job into a killed one while it exits.
            if self._prev_sigterm is None:
                self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.agreement.collect()
        if self.worker.rank == 0:
            self.report(force=True)
        LOG.info("target reached after %d steps (%.1f scale-invariant): %s", self.job.steps,
                 self.job.si_steps, self.overheads.summary())

    def _exit(self, code: int) -> None:
        # Every rank exits at this same boundary: the agreement in flight completes.
        with contextlib.suppress(Exception):
            self.agreement.collect()
        self._together = True
        raise SystemExit(code)

    # ---- profiling ---------------------------------------------------------------------------

    def _finish_profile(self) -> None:
        self.report(profile=True, oom=self.profile.oom, force=True)
        LOG.info("profiling done: %s", [(s.atomic_batch_size, round(s.step_time_s, 5))
                                        for s in self.job.table.totals()])
        self._exit(c.EXIT_PROFILED)

    def current_atomic(self) -> int:
        if self._step is not None:
            return self._step.plan.shape.atomic
        return self.shape.atomic if self.shape else 0

    # ---- process-level hooks -----------------------------------------------------------------

    def _excepthook(self, exc_type, exc, tb) -> None:
        if exc is not None and _is_oom(exc):
            oom = pb.OomEvent(atomic_batch_size=self.current_atomic(), message=str(exc)[:1000])
            LOG.error("out of memory at micro-batch %d", oom.atomic_batch_size)
            if self.worker.profiling:
                self.profile.oom = oom
                self._prev_excepthook(exc_type, exc, tb)
                with contextlib.suppress(Exception):
                    self.report(profile=True, oom=oom, force=True)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(c.EXIT_PROFILED)
            with contextlib.suppress(Exception):
                self.report(oom=oom, force=True)
        self._prev_excepthook(exc_type, exc, tb)

    def _unhook(self) -> None:
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook

    def _atexit(self) -> None:
        if self.worker.rank == 0 and self.overheads.steps:
            LOG.info("overheads: %s", self.overheads.summary())
        if self.reports.client is not None:
            with contextlib.suppress(Exception):
                self.reports.client.close()
        if self._together and self.worker.world_size > 1:
            # All ranks are leaving at the same point: tear the group down together
            # (a rank that destroys its group while a peer still talks to it may
            # abort at interpreter shutdown).
            with contextlib.suppress(Exception):
                if dist.get_backend() == "gloo":
                    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
                else:
                    dist.barrier()
        shutdown()

    def warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            LOG.warning(msg, *args)
