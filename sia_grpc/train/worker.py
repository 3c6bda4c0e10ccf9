"""This worker's place in the job, fixed for the life of the process.

What the agent's environment says (`env.WorkerEnv`, the launch contract), what
joining the process group gave (rank, world size, device), and the settings
`init()` may override. `join()` builds it; nothing here changes afterwards.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sia_grpc.train.distributed import device_for, init_process_group
from sia_grpc.train.env import WorkerEnv

__all__ = ["Worker", "join"]


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


@dataclass(frozen=True)
class Worker:
    """One replica of the job: its rank in the world, device and settings."""

    env: WorkerEnv
    device: torch.device
    distributed: bool            # in a process group (collectives go through it)
    rank: int
    world_size: int
    num_nodes: int               # nodes the world spans (1 when running alone)
    report_interval_s: float
    checkpoint_interval_s: float
    checkpoint_dir: str | None   # None: no checkpoints (none set, or a profiling pass)
    joined_at: float             # time.monotonic() when the runtime was set up
    age_at_join: float           # seconds the process had run by then

    @property
    def profiling(self) -> bool:
        return self.env.profiling

    @property
    def generation(self) -> int:
        return self.env.generation

    def startup_s(self) -> float:
        """Seconds from the process's start until now."""
        return self.age_at_join + time.monotonic() - self.joined_at


def join(env: WorkerEnv, *, backend: str | None, timeout_s: float,
         checkpoint_dir: str | None, report_interval_s: float | None,
         checkpoint_interval_s: float | None) -> Worker:
    """Pick the device and join the process group (not in a profiling pass: it runs
    alone); the keyword arguments override the environment's settings."""
    joined_at = time.monotonic()
    age = _process_age_s()
    device = device_for(env)
    distributed = False if env.profiling else init_process_group(env, backend, timeout_s)
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    return Worker(
        env=env, device=device, distributed=distributed, rank=rank, world_size=world_size,
        num_nodes=env.num_nodes if world_size == env.world_size else 1,
        report_interval_s=(env.report_interval_s if report_interval_s is None
                           else report_interval_s),
        checkpoint_interval_s=(env.checkpoint_interval_s if checkpoint_interval_s is None
                               else checkpoint_interval_s),
        checkpoint_dir=None if env.profiling else (checkpoint_dir or env.checkpoint_dir or None),
        joined_at=joined_at, age_at_join=age)
