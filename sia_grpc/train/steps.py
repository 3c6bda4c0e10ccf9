"""The step protocol of the training runtime: the part of `Runtime` that the data
loader and the patched `optimizer.step()` drive around every step.

    boundary()                      stop / stale / profiling done → exit here;
                                    periodic checkpoint and report (rank 0)
    plan = next_plan()              the next step's samples and shape
    for each micro-step a:
        begin_micro(a); <user: forward, backward, optimizer.step()>; end_micro(a)
    end_step()                      timing sample, warm-up bookkeeping

and `optimizer_step` runs on the last micro-step: the agreement collective,
gradient statistics, LR scaling, the real step and the position's commit.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch

from sia_grpc.train import contract as c
from sia_grpc.train.agreement import OnSum
from sia_grpc.train.gradients import StepGradients
from sia_grpc.train.runtime_base import RuntimeBase, StepInFlight
from sia_grpc.train.sampler import StepPlan, plan_step
from sia_grpc.train.scaling import lr_factor
from sia_grpc.train.telemetry import SampleKey

__all__ = ["Steps"]

LOG = logging.getLogger("sia_grpc.train")


class Steps(RuntimeBase):
    """The step protocol (see the module doc)."""

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
            self._step = StepInFlight(plan)
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

    def _record(self, plan: StepPlan, st: StepInFlight) -> None:
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

    def current_atomic(self) -> int:
        """The micro-batch size running now (an out-of-memory report names it)."""
        if self._step is not None:
            return self._step.plan.shape.atomic
        return self.shape.atomic if self.shape else 0
