"""The per-process training runtime behind the public API (one per process).

It owns the job's position and progress, the step protocol, checkpoints,
telemetry and exits. The data loader drives it around every step:

    boundary()                      stop / stale / profiling done → exit here;
                                    periodic checkpoint and report (rank 0)
    plan = next_plan()              the next step's samples and shape
    for each micro-step a:
        begin_micro(a); <user: forward, backward, optimizer.step()>; end_micro(a)
    end_step()                      timing sample, warm-up bookkeeping

and the patched `optimizer.step()` runs `optimizer_step` on the last micro-step:
the agreement collective, gradient statistics, LR scaling, the real step and
the position's commit.

The agreement collective is one all-reduce (sum) of a few float64s per step:
[SIGTERM seen, stale reply, wanted micro-batch, wanted accumulation, this rank's
sum of squared micro-batch gradient norms]. Only rank 0 contributes the agent's
wishes (the others send zeros), so the sum is rank 0's; a SIGTERM on any rank
stops all. Every rank then acts on the same values at the same step boundary.
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
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from sia_grpc.api import pb
from sia_grpc.train import checkpoint as ckpt
from sia_grpc.train import contract as c
from sia_grpc.train.distributed import all_reduce_sum, device_for, init_process_group, shutdown
from sia_grpc.train.env import WorkerEnv
from sia_grpc.train.noise import GradientNoise
from sia_grpc.train.sampler import Position, StepPlan, StepShape, plan_step, shape_for
from sia_grpc.train.scaling import lr_factor
from sia_grpc.train.telemetry import AgentClient, SampleKey, SampleTable

__all__ = ["Runtime", "current", "init"]

LOG = logging.getLogger("sia_grpc.train")

PROFILE_WARMUP_STEPS = 2
PROFILE_MEASURED_STEPS = 3
_STATE_VERSION = 1


def _process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


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


@dataclass
class _Measured:
    """A step's gradient measurement waiting for the agreement's summed squares."""

    grads: Any        # gradients.StepGradients or None
    micro: float      # samples per micro-batch
    regular: bool


@dataclass
class Overheads:
    """What the library itself costs, summed over this process's steps."""

    steps: int = 0
    step_s: float = 0.0         # wall time of optimizer steps (all micro-steps)
    agree_s: float = 0.0        # the per-step agreement all-reduce
    agrees: int = 0
    stats_s: float = 0.0        # gradient statistics: hooks + finalisation
    report_s: float = 0.0
    reports: int = 0
    checkpoint_save_s: list[float] = field(default_factory=list)
    restore_s: float = 0.0      # loading the checkpoint file
    startup_s: float = 0.0      # process start to the end of the first step

    def summary(self) -> dict[str, float]:
        n = max(self.steps, 1)
        step = self.step_s / n
        return {
            "steps": self.steps,
            "step_ms": 1e3 * step,
            "grad_stats_ms_per_step": 1e3 * self.stats_s / n,
            "grad_stats_fraction": self.stats_s / self.step_s if self.step_s else 0.0,
            "agreement_ms_per_step": 1e3 * self.agree_s / max(self.agrees, 1),
            "agreement_fraction": self.agree_s / self.step_s if self.step_s else 0.0,
            "report_ms_each": 1e3 * self.report_s / max(self.reports, 1),
            "checkpoint_save_ms_last": 1e3 * (self.checkpoint_save_s[-1]
                                              if self.checkpoint_save_s else 0.0),
            "checkpoint_restore_ms": 1e3 * self.restore_s,
            "startup_s": self.startup_s,
        }


_RUNTIME: Runtime | None = None
_LOCK = threading.Lock()


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
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is None:
            env = WorkerEnv.from_environ(environ)
            _RUNTIME = Runtime(env, backend=backend, timeout_s=timeout_s,
                               checkpoint_dir=checkpoint_dir,
                               report_interval_s=report_interval_s,
                               checkpoint_interval_s=checkpoint_interval_s)
        return _RUNTIME


def current() -> Runtime:
    """The runtime, set up with defaults if `init()` was not called."""
    return _RUNTIME if _RUNTIME is not None else init()


class Runtime:
    def __init__(self, env: WorkerEnv, *, backend: str | None, timeout_s: float,
                 checkpoint_dir: str | None, report_interval_s: float | None,
                 checkpoint_interval_s: float | None) -> None:
        self.t_init = time.monotonic()
        self.age_at_init = _process_age_s()
        self.env = env
        self.profiling = env.profiling
        self.device = device_for(env)
        self.distributed = False if self.profiling else init_process_group(env, backend, timeout_s)
        if self.distributed:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world_size = 0, 1
        self.num_nodes = env.num_nodes if self.world_size == env.world_size else 1
        self.report_interval_s = (env.report_interval_s if report_interval_s is None
                                  else report_interval_s)
        self.checkpoint_interval_s = (env.checkpoint_interval_s if checkpoint_interval_s is None
                                      else checkpoint_interval_s)
        self.checkpoint_dir = None if self.profiling else (checkpoint_dir or env.checkpoint_dir
                                                           or None)
        self.generation = env.generation

        # The job's state (checkpointed).
        self.position = Position()
        self.samples_done = 0
        self.steps = 0
        self.si_steps = 0.0        # scale-invariant steps: the sum of the gains
        self.init_batch_size: int | None = None
        self.dataset_len: int | None = None
        self.seed = 0
        self.noise: GradientNoise | None = None
        self.table = SampleTable()

        self.shape: StepShape | None = None
        self.script_epochs: float | None = None
        self.model: Any = None
        self.loader: Any = None
        self.rule = "none"
        self._states: dict[str, Any] = {}
        self._step: _Step | None = None
        self._warm: set[StepShape] = set()
        self.overheads = Overheads()
        self.completed = False
        self._together = False  # every rank ends at the same point (barrier at exit)
        self._warned: set[str] = set()

        # Requests, local until the next agreement, then agreed (all ranks).
        self._sigterm = False
        self._want_stale = False
        self._want_shape: StepShape | None = None
        self._stop = False
        self._stale = False
        self._agreed_shape: StepShape | None = None
        self._pending: tuple | None = None  # the agreement all-reduce in flight

        # Telemetry.
        self.client = AgentClient(env.agent_socket) if env.agent_socket else None
        self._last_report = 0.0
        self._startup_s: float | None = None
        self._startup_sent = False
        self._last_checkpoint = time.monotonic()
        self._ckpt_steps = 0  # steps at the last checkpoint

        # Profiling pass: stages of (micro-batch) and steps done in the current one.
        self._profile_sizes = sorted(set(env.profile_sizes))
        self._profile_stage = 0
        self._profile_stage_steps = 0
        self._profile_done = False
        self._oom: pb.OomEvent | None = None

        # Resume.
        self._restored: dict[str, Any] | None = None
        self.restored_from: tuple[int, str] | None = None
        self._restore()

        if self.checkpoint_dir and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._atexit)
        LOG.info("sia_grpc.train: rank %d/%d on %s, generation %d%s%s", self.rank,
                 self.world_size, self.device, self.generation,
                 f", resuming {self.restored_from[1]}" if self.restored_from else "",
                 f", profiling micro-batches {self._profile_sizes}" if self.profiling else "")

    # ---- state registry and checkpoints ------------------------------------------------

    def register_state(self, name: str, obj: Any) -> None:
        """Checkpoint `obj` (anything with state_dict/load_state_dict) as `name`;
        restore it now if the checkpoint being resumed holds `name`."""
        if name == "sia":
            raise ValueError("the name 'sia' is reserved")
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise TypeError(f"{name}: {type(obj).__name__} has no state_dict/load_state_dict")
        self._states[name] = obj
        if self._restored is not None and name in self._restored:
            obj.load_state_dict(self._restored[name])

    def _restore(self) -> None:
        if not self.checkpoint_dir:
            return
        t0 = time.perf_counter()
        # Rank 0 chooses; everyone loads that one (the directory is shared).
        found = None
        if self.rank == 0:
            found = ckpt.newest_loadable(self.checkpoint_dir,
                                         self.generation if self.generation else None)
        gen = all_reduce_sum([found[0] + 1 if found else 0.0], self.device)[0]
        if gen <= 0:
            return
        gen = int(gen) - 1
        if found is None:
            path = ckpt.checkpoint_path(self.checkpoint_dir, gen)
            found = (gen, path, ckpt.load_checkpoint(path))
        _, path, data = found
        s = data["sia"]
        self.position = Position(s["epoch"], s["pos"], s.get("carry", 0))
        self.samples_done = s["samples_done"]
        self.steps = s["steps"]
        self.si_steps = s["si_steps"]
        self.init_batch_size = s["init_batch_size"]
        self.dataset_len = s["dataset_len"]
        self.seed = s["seed"]
        if s.get("noise"):
            self.noise = GradientNoise(s["init_batch_size"])
            self.noise.load_state_dict(s["noise"])
        self.table.load_state_dict(s.get("samples", {}))
        self._restored = data
        self.restored_from = (gen, str(path))
        self.overheads.restore_s = time.perf_counter() - t0

    def state_dict(self) -> dict:
        p = self.position
        return {
            "version": _STATE_VERSION, "epoch": p.epoch, "pos": p.pos, "carry": p.carry,
            "samples_done": self.samples_done, "steps": self.steps, "si_steps": self.si_steps,
            "init_batch_size": self.init_batch_size, "dataset_len": self.dataset_len,
            "seed": self.seed, "noise": self.noise.state_dict() if self.noise else None,
            "samples": self.table.state_dict(), "generation": self.generation,
            "world_size": self.world_size,
            "shape": [self.shape.replicas, self.shape.atomic, self.shape.accum]
            if self.shape else None,
            "time": time.time(),
        }

    def save_checkpoint(self) -> pb.CheckpointEvent:
        """Rank 0: write the checkpoint of this generation now (atomically)."""
        assert self.checkpoint_dir and self.rank == 0
        data = {"sia": self.state_dict()}
        for name, obj in self._states.items():
            data[name] = obj.state_dict()
        path = ckpt.checkpoint_path(self.checkpoint_dir, self.generation)
        save_s = ckpt.save_atomic(data, path)
        ckpt.prune_checkpoints(self.checkpoint_dir, keep=2, generation=self.generation)
        self.overheads.checkpoint_save_s.append(save_s)
        self._last_checkpoint = time.monotonic()
        self._ckpt_steps = self.steps
        LOG.info("checkpoint %s: %.1f%% of the target, %.3f s", path, 100 * self.progress(),
                 save_s)
        return pb.CheckpointEvent(generation=self.generation, path=str(path),
                                  progress=self.progress(), save_s=save_s,
                                  restore_s=(self._startup_s or 0.0)
                                  if self.restored_from else 0.0)

    # ---- attachments ---------------------------------------------------------------------

    def attach_model(self, model: Any, rule: str) -> None:
        if self.model is not None:
            raise RuntimeError("only one AdaptiveDataParallel per process")
        self.model = model
        self.rule = rule

    def attach_loader(self, loader: Any, dataset_len: int, batch_size: int, seed: int) -> None:
        if self.loader is not None:
            raise RuntimeError("only one AdaptiveDataLoader per process (use a plain "
                               "DataLoader for evaluation)")
        if dataset_len < 1:
            raise ValueError("the dataset is empty")
        if self.dataset_len is not None and self.dataset_len != dataset_len:
            raise RuntimeError(f"the checkpoint was taken with {self.dataset_len} samples, "
                               f"the dataset now has {dataset_len}: cannot resume")
        if self.init_batch_size is not None and self.init_batch_size != batch_size:
            LOG.warning("batch_size=%d differs from the initial batch %d the job began with; "
                        "keeping %d", batch_size, self.init_batch_size, self.init_batch_size)
        if self.restored_from is not None and self.seed != seed:
            LOG.warning("seed %d differs from the checkpoint's %d; keeping %d", seed,
                        self.seed, self.seed)
        else:
            self.seed = seed
        self.loader = loader
        self.dataset_len = dataset_len
        self.init_batch_size = self.init_batch_size or batch_size
        if self.noise is None:
            self.noise = GradientNoise(self.init_batch_size)
        env = self.env
        if self.profiling:
            self.shape = StepShape(1, self._profile_sizes[0], 0)
        elif env.atomic_batch_size or env.batch_size:
            self.shape = shape_for(self.world_size, env.batch_size, env.atomic_batch_size,
                                   env.accum_steps)
        else:
            self.shape = shape_for(self.world_size, self.init_batch_size, 0, env.accum_steps)
        if dataset_len < self.world_size:
            raise ValueError(f"{dataset_len} samples cannot feed {self.world_size} replicas")

    # ---- targets and progress ------------------------------------------------------------

    def target_samples(self) -> int | None:
        env = self.env
        if env.target_samples:
            return env.target_samples
        if self.dataset_len is None:
            return None
        epochs = env.target_epochs or self.script_epochs
        if not epochs:
            return None
        return max(1, round(epochs * self.dataset_len))

    def progress(self) -> float:
        """Fraction of the target's samples trained on (0 without a target)."""
        target = self.target_samples()
        if not target:
            return 0.0
        return min(1.0, self.samples_done / target)

    def target_reached(self) -> bool:
        if self.profiling:
            return False
        target = self.target_samples()
        if target is None:
            return False
        replicas = self.shape.replicas if self.shape else self.world_size
        return target - self.samples_done < replicas

    # ---- the step protocol -----------------------------------------------------------------

    def boundary(self) -> None:
        """Between steps: act on what all ranks agreed; periodic work on rank 0."""
        if self._stale:
            LOG.warning("the agent says generation %d is no longer current: exiting "
                        "without a checkpoint", self.generation)
            self._exit(c.EXIT_STALE)
        if self.profiling:
            if self._profile_done:
                self._finish_profile()
            return
        if self._stop and not self.target_reached():
            self._stop_with_checkpoint()
        if self.rank != 0:
            return
        now = time.monotonic()
        if (self.checkpoint_dir and self.checkpoint_interval_s > 0
                and now - self._last_checkpoint >= self.checkpoint_interval_s
                and self.steps > self._ckpt_steps):
            self.report(checkpoint=self.save_checkpoint(), force=True)
        elif self.client is not None and self.steps > 0 and (
                now - self._last_report >= self.report_interval_s
                or not self._startup_sent):
            self.report()

    def next_plan(self) -> StepPlan | None:
        if self._agreed_shape is not None:
            self.shape, self._agreed_shape = self._agreed_shape, None
        assert self.shape is not None and self.dataset_len is not None
        target = None if self.profiling else self.target_samples()
        limit = None if target is None else target - self.samples_done
        plan = plan_step(self.position, self.dataset_len, self.shape, limit)
        if plan is not None:
            self._step = _Step(plan)
        return plan

    def end_epoch(self) -> None:
        """The loader found no further step in this epoch."""
        if self.target_reached():
            return
        p = self.position
        # Any step of the epoch took the carried samples first, and the dataset holds
        # at least as many samples as there are replicas: nothing is carried twice.
        assert p.carry == 0, p
        self.position = Position(p.epoch + 1, 0, self.dataset_len - p.pos)
        if self.position.carry:
            LOG.info("%d sample(s) left at the end of epoch %d go into epoch %d's first step",
                     self.position.carry, p.epoch, p.epoch + 1)

    def skip_epoch(self) -> None:
        """The script moved on without finishing the epoch: start the next one."""
        p = self.position
        self.position = Position(p.epoch + 1, 0, 0)

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
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        last = micro == st.plan.k - 1
        if self.env.pace > 1.0:
            compute = (t1 - st.t_yield) - (st.sync_s if last else 0.0)
            if compute > 0:
                time.sleep((self.env.pace - 1.0) * compute)
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
            if "nostep" not in self._warned:
                self._warned.add("nostep")
                LOG.warning("a step ended without optimizer.step(); its samples count as done")
            if not st.agreed:
                self._agree(0.0, None)
            if self.model is not None:
                self.model.tracker.reset()
            self._commit(plan, gain=0.0)
        self._step = None
        self.overheads.steps += 1
        if self.model is not None:
            self.overheads.stats_s += self.model.tracker.hook_s
            self.model.tracker.hook_s = 0.0
        if self._startup_s is None:
            self._startup_s = self.age_at_init + time.monotonic() - self.t_init
            self.overheads.startup_s = self._startup_s
        shape = plan.shape
        if self.profiling:
            self._profile_stage_steps += 1
            if self._profile_stage_steps > PROFILE_WARMUP_STEPS and plan.regular:
                self._record(plan, st)
            if self._profile_stage_steps >= PROFILE_WARMUP_STEPS + PROFILE_MEASURED_STEPS:
                self._next_profile_stage()
            return
        if plan.regular:
            if shape in self._warm:
                self._record(plan, st)
            else:
                self._warm.add(shape)  # the first step of a shape warms up: not timed

    def _record(self, plan: StepPlan, st: _Step) -> None:
        s = plan.shape
        key = SampleKey(self.env.gpu_type, self.num_nodes if s.replicas > 1 else 1,
                        s.replicas, s.atomic, s.accum)
        self.table.add(key, st.last_micro_s, st.sync_s)

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
        self._agree(local, _Measured(grads, plan.n / count, plan.regular))
        t2 = time.perf_counter()
        st.sync_s = wait + (t2 - t1)
        scale = plan.n / self.init_batch_size
        noise = self.noise
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
        self._commit(plan, gain)
        st.stepped = True
        return out

    def _commit(self, plan: StepPlan, gain: float) -> None:
        self.position = plan.end()
        self.samples_done += plan.n
        self.steps += 1
        self.si_steps += gain

    def _agree(self, local_sqr: float, measured: _Measured | None) -> None:
        """The per-step agreement (see the module doc).

        With one replica it takes effect at once. With several, the all-reduce
        is started without waiting and collected at the next step, so its latency
        hides behind a step of compute: what it carries (a stop, a new batch,
        this step's summed squares) takes effect one step later, on every rank
        at the same step."""
        st = self._step
        if st is not None:
            st.agreed = True
        want = self._want_shape if self.rank == 0 else None
        self._want_shape = None
        vec = [1.0 if self._sigterm else 0.0,
               1.0 if (self.rank == 0 and self._want_stale) else 0.0,
               float(want.atomic) if want else 0.0,
               float(want.accum) if want else 0.0,
               local_sqr]
        if self.world_size == 1:
            self._apply(vec, measured)
            return
        t0 = time.perf_counter()
        self._collect(decide=True)
        t = torch.tensor(vec, dtype=torch.float64, device=self.device)
        self._pending = (dist.all_reduce(t, async_op=True), t, measured)
        self.overheads.agree_s += time.perf_counter() - t0
        self.overheads.agrees += 1

    def _collect(self, decide: bool) -> None:
        """Finish the agreement in flight, if any (see _agree)."""
        if self._pending is None:
            return
        work, t, measured = self._pending
        self._pending = None
        work.wait()
        self._apply(t.tolist(), measured, decide)

    def _apply(self, vec: list[float], measured: _Measured | None, decide: bool = True) -> None:
        if measured is not None and measured.grads is not None and measured.regular:
            g = measured.grads
            if g.local is None:
                g.local = vec[4] / g.count
            self.noise.update(g.local, g.total, g.count, g.count * measured.micro
                              / self.init_batch_size, biased=g.biased)
        if not decide:
            return
        if vec[0] > 0:
            self._stop = True
        if vec[1] > 0:
            self._stale = True
        if vec[2] > 0:
            new = StepShape(self.world_size, int(round(vec[2])), int(round(vec[3])))
            if new != self.shape:
                LOG.info("batch change after step %d: %d × %d × %d = %d", self.steps + 1,
                         new.replicas, new.atomic, new.accum + 1, new.batch_size)
                self._agreed_shape = new

    # ---- telemetry ---------------------------------------------------------------------------

    def report(self, *, checkpoint: pb.CheckpointEvent | None = None,
               oom: pb.OomEvent | None = None, profile: bool = False,
               force: bool = False) -> pb.WorkerReply | None:
        """Send a WorkerReport now (rank 0, or any rank for an OOM); None on failure."""
        if self.client is None:
            return None
        t0 = time.perf_counter()
        samples, raw = self.table.take()
        t = pb.Telemetry(job_id=self.env.job_id, generation=self.generation,
                         samples=samples, progress=self.progress(), profile=profile)
        if self.noise is not None and self.noise.known:
            t.grad.CopyFrom(pb.GradientStats(sqr=self.noise.sqr, var=self.noise.var))
        if checkpoint is not None:
            t.checkpoint.CopyFrom(checkpoint)
        report = pb.WorkerReport(telemetry=t, rank=self.rank,
                                 startup_s=self._startup_s or 0.0)
        if oom is not None:
            report.oom.CopyFrom(oom)
        reply = self.client.report(report, force=force)
        self._last_report = time.monotonic()
        self.overheads.report_s += time.perf_counter() - t0
        self.overheads.reports += 1
        if reply is None:
            self.table.put_back(raw)
            return None
        if self._startup_s is not None:
            self._startup_sent = True
        if not profile:
            self._on_reply(reply)
        return reply

    def _on_reply(self, reply: pb.WorkerReply) -> None:
        if not reply.current:
            self._want_stale = True
            return
        if reply.batch_size or reply.atomic_batch_size or reply.accum_steps:
            try:
                want = shape_for(self.world_size, reply.batch_size, reply.atomic_batch_size,
                                 reply.accum_steps)
            except ValueError as e:
                LOG.warning("ignoring the agent's batch %s: %s", reply, e)
                return
            cur = self._agreed_shape or self.shape
            self._want_shape = None if want == cur else want

    # ---- stopping ------------------------------------------------------------------------------

    def _on_sigterm(self, signum, frame) -> None:
        self._sigterm = True

    def _stop_with_checkpoint(self) -> None:
        self._collect(decide=False)  # the last step's statistics, on every rank
        ok = 1.0
        if self.rank == 0 and self.checkpoint_dir:
            try:
                self.report(checkpoint=self.save_checkpoint(), force=True)
            except Exception:
                LOG.exception("checkpoint failed")
                ok = 0.0
        failed = all_reduce_sum([1.0 - ok], self.device)[0] if self.world_size > 1 else 1.0 - ok
        if failed > 0:
            self._exit(1)
        LOG.info("stopped at step %d (epoch %d, %d samples in): exiting %d", self.steps,
                 self.position.epoch, self.position.pos, c.EXIT_CHECKPOINTED)
        self._exit(c.EXIT_CHECKPOINTED)

    def finish(self) -> None:
        """The target is reached: final report; a later SIGTERM exits 0."""
        if self.completed or self.profiling:
            return
        self.completed = True
        self._together = True
        if threading.current_thread() is threading.main_thread():
            # Nothing left to checkpoint: a stop that arrives now (the scheduler did not
            # know yet) must not turn a finished job into a killed one while it exits.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._collect(decide=False)
        if self.rank == 0:
            self.report(force=True)
        LOG.info("target reached after %d steps (%.1f scale-invariant): %s", self.steps,
                 self.si_steps, self.overheads.summary())

    def _exit(self, code: int) -> None:
        # Every rank exits at this same boundary: the agreement in flight completes.
        with contextlib.suppress(Exception):
            self._collect(decide=False)
        self._together = True
        raise SystemExit(code)

    # ---- profiling ---------------------------------------------------------------------------

    def _next_profile_stage(self) -> None:
        self._profile_stage += 1
        self._profile_stage_steps = 0
        if self._profile_stage >= len(self._profile_sizes):
            self._profile_done = True
        else:
            self._agreed_shape = StepShape(1, self._profile_sizes[self._profile_stage], 0)

    def _finish_profile(self) -> None:
        self.report(profile=True, oom=self._oom, force=True)
        LOG.info("profiling done: %s", [(s.atomic_batch_size, round(s.step_time_s, 5))
                                        for s in self.table.totals()])
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
            if self.profiling:
                self._oom = oom
                self._prev_excepthook(exc_type, exc, tb)
                with contextlib.suppress(Exception):
                    self.report(profile=True, oom=oom, force=True)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(c.EXIT_PROFILED)
            with contextlib.suppress(Exception):
                self.report(oom=oom, force=True)
        self._prev_excepthook(exc_type, exc, tb)

    def _atexit(self) -> None:
        if self.rank == 0 and self.overheads.steps:
            LOG.info("overheads: %s", self.overheads.summary())
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        if self._together and self.world_size > 1:
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
