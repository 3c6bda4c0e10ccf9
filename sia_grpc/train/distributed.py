"""torch.distributed set-up and the few collectives the library issues itself."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch
import torch.distributed as dist

from sia_grpc.train.env import WorkerEnv

__all__ = ["all_reduce_sum", "device_for", "init_process_group", "shutdown"]

LOG = logging.getLogger(__name__)


def device_for(env: WorkerEnv) -> torch.device:
    """This replica's device: cuda:LOCAL_RANK when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        index = env.local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_process_group(env: WorkerEnv, backend: str | None, timeout_s: float) -> bool:
    """Join the job's process group through env:// (MASTER_ADDR/MASTER_PORT/RANK/
    WORLD_SIZE); nccl with CUDA, else gloo. False (nothing to join) without RANK and
    WORLD_SIZE. A group the script created itself is used as it is."""
    if dist.is_initialized():
        return True
    if not env.distributed:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend=backend, init_method="env://", rank=env.rank,
                            world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return True


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over all ranks (float64); the values themselves at world 1."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def shutdown() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # at exit, after a peer died: nothing to do about it
            LOG.debug("destroy_process_group: %s", e)
