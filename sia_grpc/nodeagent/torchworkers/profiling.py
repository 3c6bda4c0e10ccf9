"""A profiling pass: the job's command on one GPU, alone, with SIA_PROFILE.

The worker times a few steps per micro-batch size, reports them
(Telemetry.profile = true) and exits EXIT_PROFILED; it never writes the job's
checkpoints. A pass that runs past its timeout is killed.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sia_grpc.api import pb
from sia_grpc.nodeagent.torchworkers.environment import free_port
from sia_grpc.nodeagent.torchworkers.exits import oom_text
from sia_grpc.nodeagent.torchworkers.group import cannot_start
from sia_grpc.nodeagent.workers import (
    Confinement,
    WorkerProcess,
    describe_exit,
    log_tail,
    spawn_worker,
)
from sia_grpc.nodeagent.workerservice import TelemetryAccumulator
from sia_grpc.train import contract as c

__all__ = ["ProfileRun", "profile_env"]


def profile_env(sizes: Sequence[int]) -> dict[str, str]:
    """A world of one on the loopback, profiling micro-batches `sizes`."""
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            c.ENV_PROFILE: ",".join(str(b) for b in sizes)}


@dataclass(eq=False)
class ProfileRun:
    """One profiling pass and what its worker reported."""

    accum: TelemetryAccumulator
    log: Any
    proc: WorkerProcess | None = None
    oom: pb.OomEvent | None = None

    async def run(self, command: list[str], env: Mapping[str, str], log_path: Path, *,
                  cpus: list[int] | None, timeout_s: float, sizes: Sequence[int],
                  confine: Confinement | None = None) -> pb.Telemetry:
        """Run the pass to its end: its Telemetry, or RuntimeError saying why not."""
        try:
            try:
                self.proc = proc = spawn_worker(command, env, log_path, cpus=cpus,
                                                confine=confine)
            except OSError as exc:
                raise cannot_start(command, exc) from None
            self.log.info("profiling", pid=proc.pid, sizes=list(sizes), log=str(log_path))
            try:
                async with asyncio.timeout(timeout_s):
                    code = await proc.wait()
            except TimeoutError:
                raise RuntimeError(f"profiling pass still running after "
                                   f"{timeout_s:g} s; killed (log {log_path})") from None
        finally:
            if self.proc is not None:
                if self.proc.returncode is None:
                    self.proc.kill_and_reap()
                else:
                    self.proc.signal_group(signal.SIGKILL)  # what it forked
        if code != c.EXIT_PROFILED:
            oom = f"; {oom_text(self.oom)}" if self.oom is not None else ""
            raise RuntimeError(f"profiling pass ended with {describe_exit(code)}, not "
                               f"{c.EXIT_PROFILED}{oom}\nlog {log_path}:\n{log_tail(log_path)}")
        out = self.accum.take(profile=True)
        if out is None or not out.samples:
            raise RuntimeError(f"profiling pass reported no samples (log {log_path})")
        self.log.info("profiled", sizes=[s.atomic_batch_size for s in out.samples])
        return out

    def kill(self) -> None:
        """SIGKILL the pass's process group (close)."""
        if self.proc is not None:
            self.proc.signal_group(signal.SIGKILL)
