"""Which devices a worker may use.

On real GPUs every worker of a job sees the job's local GPUs, in local-rank order,
as CUDA_VISIBLE_DEVICES, so `cuda:LOCAL_RANK` is its own GPU (as under torchrun);
local GPU i is the i-th entry of the agent's own CUDA_VISIBLE_DEVICES, if it has
one. Under emulation there are no GPUs: CUDA_VISIBLE_DEVICES is empty and each
emulated GPU owns an equal share of the agent's CPU cores (the worker's affinity
and OMP_NUM_THREADS).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Affinity", "agent_cpus"]


def agent_cpus() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Affinity:
    """The node's GPUs and cores, and how they are shared out among workers."""

    num_gpus: int
    cpus: tuple[int, ...]
    emulate: bool
    visible: tuple[str, ...] | None  # the agent's own CUDA_VISIBLE_DEVICES, split

    @classmethod
    def of_agent(cls, num_gpus: int, cpus: Sequence[int], emulate: bool,
                 environ: Mapping[str, str] = os.environ) -> Affinity:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        return cls(num_gpus, tuple(cpus), emulate, None if visible is None else tuple(
            d.strip() for d in visible.split(",") if d.strip()))

    def cpu_share(self, gpu: int) -> list[int]:
        """The cores of emulated GPU `gpu`: an equal slice of the agent's, so a job
        runs at the same speed however many other jobs share the node."""
        n, cores = self.num_gpus, self.cpus
        if len(cores) >= n:
            return list(cores[gpu * len(cores) // n:(gpu + 1) * len(cores) // n])
        return [cores[gpu % len(cores)]]

    def pinned_cpus(self, gpu: int) -> list[int] | None:
        """The cores to pin the worker of `gpu` to; None (not pinned) on real GPUs."""
        return self.cpu_share(gpu) if self.emulate else None

    def env(self, gpu: int, job_gpus: Sequence[int]) -> dict[str, str]:
        """The device variables of the worker of `gpu` in a job on `job_gpus`."""
        if self.emulate:
            # CPU only, even on a machine with GPUs.
            return {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(len(self.cpu_share(gpu)))}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.device(g) for g in job_gpus)}

    def job_cpus(self, job_gpus: Sequence[int]) -> list[int]:
        """The cores of a job on `job_gpus`: its GPUs' shares (its cgroup's cpuset)."""
        return sorted({c for g in job_gpus for c in self.cpu_share(g)})

    def device(self, gpu: int) -> str:
        """The device index (as NVIDIA numbers them) of local GPU `gpu`."""
        if self.visible is not None and gpu < len(self.visible):
            return self.visible[gpu]
        return str(gpu)
