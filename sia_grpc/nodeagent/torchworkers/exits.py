"""How a worker group ended, from its workers' exit statuses.

All ranks EXIT_COMPLETED: completed. EXIT_CHECKPOINTED after a stop the agent
asked for: checkpointed. Some ranks completed and the rest stopped on the
agent's SIGTERM: completed. Anything else failed, with the first failing rank's
log tail (and an out-of-memory report, if a worker sent one) in the message. A run
the kernel killed for memory in its cgroup gets a note saying so (`memory_note`).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sia_grpc.api import pb
from sia_grpc.nodeagent.workers import WorkerProcess, describe_exit, log_tail
from sia_grpc.train import contract as c

if TYPE_CHECKING:
    from sia_grpc.nodeagent.backend import Launch
    from sia_grpc.nodeagent.isolation.node import Space
    from sia_grpc.nodeagent.workerservice import TelemetryAccumulator

__all__ = ["Ended", "group_exit", "memory_note", "oom_text"]


class Ended(Protocol):
    """What `group_exit` reads of a worker group (`group.WorkerGroup`, which calls
    it: `group` imports this module, never the reverse)."""

    launch: Launch
    procs: list[WorkerProcess]
    exits: list[WorkerProcess]  # in exit order
    accum: TelemetryAccumulator
    log_dir: Path
    stop_grace_s: float
    stop_requested: bool
    killed_after_grace: set[int]  # ranks
    oom: pb.OomEvent | None

_OK_EXITS = (c.EXIT_COMPLETED, c.EXIT_CHECKPOINTED)


def group_exit(g: Ended, note: str = "") -> pb.JobExit:
    """The group's JobExit; a worker still running counts as SIGKILLed. `note`
    (what the run's end found: killed for memory, GPUs held back) leads its message,
    whatever the kind."""
    launch = g.launch
    ckpt = g.accum.checkpoint_progress
    held = launch.restore_progress if ckpt is None else ckpt
    out = pb.JobExit(job_id=launch.job_id, generation=launch.generation)
    order = g.exits + [p for p in g.procs if p not in g.exits]
    codes = {p.rank: -signal.SIGKILL if p.returncode is None else p.returncode
             for p in order}
    bad = [p for p in order if codes[p.rank] not in _OK_EXITS]
    if bad:
        out.kind, out.progress = pb.JobExit.KIND_FAILED, held
        out.message = _failure(g, bad, codes)
    elif all(code == c.EXIT_COMPLETED for code in codes.values()):
        out.kind, out.progress = pb.JobExit.KIND_COMPLETED, 1.0
    elif g.stop_requested:
        out.kind, out.progress = pb.JobExit.KIND_CHECKPOINTED, held
    elif any(code == c.EXIT_COMPLETED for code in codes.values()):
        out.kind, out.progress = pb.JobExit.KIND_COMPLETED, 1.0  # the rest on our SIGTERM
    else:
        out.kind, out.progress = pb.JobExit.KIND_FAILED, held
        out.message = (f"workers exited {c.EXIT_CHECKPOINTED} (checkpointed) without being "
                       f"asked to stop; log {g.log_dir}")
    if note:
        out.message = f"{note}; {out.message}" if out.message else note
    return out


def _failure(g: Ended, bad: list[WorkerProcess], codes: dict[int, int]) -> str:
    first = bad[0]
    what = f"rank {first.rank} {describe_exit(codes[first.rank])}"
    if first.rank in g.killed_after_grace:
        what += f" (still running {g.stop_grace_s:g} s after SIGTERM)"
    parts = [what]
    if others := [f"rank {p.rank} {describe_exit(codes[p.rank])}" for p in bad[1:]]:
        parts.append("also " + ", ".join(others))
    if g.oom is not None:
        parts.append(oom_text(g.oom))
    tail = log_tail(first.log_path)
    return "; ".join(parts) + f"\nlog {first.log_path}:\n{tail}"


def oom_text(oom: pb.OomEvent) -> str:
    text = f"out of memory at atomic_batch_size={oom.atomic_batch_size}"
    return f"{text}: {oom.message}" if oom.message else text


def memory_note(space: Space) -> str:
    """"killed for memory ..." when the run's cgroup saw the kernel kill for memory."""
    m: Any = space.memory
    if m is None or not m.oom_kills:
        return ""
    limit = f"{m.limit_bytes / 2**20:.0f} MiB" if m.limit_bytes else "its limit"
    peak = f", peak {m.peak_bytes / 2**20:.0f} MiB" if m.peak_bytes else ""
    return (f"killed for memory: the job used all the host memory it may use on this node "
            f"({limit}{peak}; {m.oom_kills} process(es) killed by the kernel)")
