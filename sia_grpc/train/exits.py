"""How a training process stops, the part of `Runtime` that decides it: with a
checkpoint when the scheduler asks (SIGTERM, agreed by all ranks at a step's
boundary), at once when its generation is stale, after a profiling pass, or at the
target; and the process-wide hooks that see it happen (the SIGTERM handler,
sys.excepthook for out-of-memory reports, an atexit hook that tears the process
group down together). The exit codes are the agent's (`contract`).
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
from types import FrameType, TracebackType

import torch
import torch.distributed as dist

from sia_grpc.api import pb
from sia_grpc.train import contract as c
from sia_grpc.train.distributed import all_reduce_sum, shutdown
from sia_grpc.train.runtime_base import RuntimeBase

__all__ = ["Exits"]

LOG = logging.getLogger("sia_grpc.train")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in msg.lower()
                                              or "can't allocate memory" in msg)


class Exits(RuntimeBase):
    """Stopping, finishing, and the process-wide hooks (see the module doc)."""

    # ---- stopping ------------------------------------------------------------------------------

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
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

    # ---- process-level hooks -----------------------------------------------------------------

    def _hook(self) -> None:
        """Install the process-wide hooks (`_unhook` puts them back)."""
        self._prev_sigterm = None
        if (self.worker.checkpoint_dir
                and threading.current_thread() is threading.main_thread()):
            self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._atexit)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException,
                    tb: TracebackType | None) -> None:
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
