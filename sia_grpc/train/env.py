"""The worker's environment, parsed once: the agent's contract plus torch's own
env:// variables. Plain Python (no torch), so the agent side can use it too.

Two extra, library-only settings are read here as well (they are not part of the
agent contract; the agent may set them, a user may export them):

* `SIA_REPORT_INTERVAL_S`: seconds between rank 0's telemetry reports (default 5).
* `SIA_CHECKPOINT_INTERVAL_S`: seconds between periodic checkpoints (default 300;
  0 disables them, a SIGTERM still checkpoints).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from sia_grpc.train import contract as c

__all__ = ["ENV_CHECKPOINT_INTERVAL", "ENV_REPORT_INTERVAL", "WorkerEnv"]

ENV_REPORT_INTERVAL = "SIA_REPORT_INTERVAL_S"
ENV_CHECKPOINT_INTERVAL = "SIA_CHECKPOINT_INTERVAL_S"

DEFAULT_REPORT_INTERVAL_S = 5.0
DEFAULT_CHECKPOINT_INTERVAL_S = 300.0


def _int(env: Mapping[str, str], name: str, default: int = 0, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} is below {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={raw!r} must be a finite number >= 0")
    return value


def _sizes(env: Mapping[str, str], name: str) -> tuple[int, ...]:
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    try:
        sizes = tuple(int(s) for s in raw.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a comma-separated list of integers") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"{name}={raw!r}: batch sizes must be >= 1")
    return sizes


@dataclass(frozen=True)
class WorkerEnv:
    """Everything the agent (or torchrun, or nobody) told this process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    distributed: bool = False   # RANK and WORLD_SIZE are set: use env:// rendezvous
    job_id: str = ""
    generation: int = 0
    agent_socket: str = ""
    agent_address: str = ""     # HOST:PORT, when there is no socket
    agent_token: str = ""
    checkpoint_dir: str = ""
    gpu_type: str = ""
    batch_size: int = 0         # global batch, 0 = the script's
    atomic_batch_size: int = 0  # per-replica micro-batch, 0 = derived
    accum_steps: int = 0        # micro-batches beyond the first per step
    target_epochs: float = 0.0  # 0 = the script's
    target_samples: int = 0     # 0 = the script's
    profile_sizes: tuple[int, ...] = ()
    pace: float = 1.0
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))

    @property
    def profiling(self) -> bool:
        return bool(self.profile_sizes)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        env = os.environ if environ is None else environ
        distributed = "RANK" in env and "WORLD_SIZE" in env
        world = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0)
        if rank >= world:
            raise ValueError(f"RANK={rank} is not below WORLD_SIZE={world}")
        local_world = _int(env, "LOCAL_WORLD_SIZE", world, minimum=1)
        pace = _float(env, c.ENV_PACE, 1.0)
        return cls(
            rank=rank, world_size=world, local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=local_world, distributed=distributed,
            job_id=env.get(c.ENV_JOB_ID, ""),
            generation=_int(env, c.ENV_GENERATION, 0),
            agent_socket=env.get(c.ENV_AGENT_SOCKET, ""),
            agent_address=env.get(c.ENV_AGENT_ADDRESS, ""),
            agent_token=env.get(c.ENV_AGENT_TOKEN, ""),
            checkpoint_dir=env.get(c.ENV_CHECKPOINT_DIR, ""),
            gpu_type=env.get(c.ENV_GPU_TYPE, ""),
            batch_size=_int(env, c.ENV_BATCH_SIZE, 0),
            atomic_batch_size=_int(env, c.ENV_ATOMIC_BATCH_SIZE, 0),
            accum_steps=_int(env, c.ENV_ACCUM_STEPS, 0),
            target_epochs=_float(env, c.ENV_TARGET_EPOCHS, 0.0),
            target_samples=_int(env, c.ENV_TARGET_SAMPLES, 0),
            profile_sizes=_sizes(env, c.ENV_PROFILE),
            pace=pace if pace > 0 else 1.0,
            report_interval_s=_float(env, ENV_REPORT_INTERVAL, DEFAULT_REPORT_INTERVAL_S),
            checkpoint_interval_s=_float(env, ENV_CHECKPOINT_INTERVAL,
                                         DEFAULT_CHECKPOINT_INTERVAL_S),
        )
