"""What the workers' reports add up to, and what the agent replies.

Every report comes through WorkerService on the agent's event loop. A report of
the generation running here goes to its group: rank 0 speaks for the job (its
telemetry accumulates for the controller; its first start-up time notes a
restore), any rank may report running out of memory, and rank 0's reply carries
a pending batch change. A profiling pass's reports go to the pass. Anything else
is from a generation that is no longer current here: the reply says so and the
worker exits.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from sia_grpc.api import pb
from sia_grpc.nodeagent.torchworkers.group import WorkerGroup
from sia_grpc.nodeagent.torchworkers.profiling import ProfileRun
from sia_grpc.nodeagent.workerservice import TelemetryAccumulator

__all__ = ["drain", "on_report"]


def on_report(report: pb.WorkerReport, group: WorkerGroup | None, run: ProfileRun | None,
              log: Any) -> pb.WorkerReply:
    """The reply to `report`; `group` and `run` run here for its job (and generation)."""
    t = report.telemetry
    if (group is not None and group.launch.generation == t.generation
            and not (run is not None and t.profile)):
        return _group_report(group, report)
    if run is not None:
        return _profile_report(run, report, log)
    log.info("report from a worker not running here now: current=false",
             job_id=t.job_id, generation=t.generation, rank=report.rank,
             running=None if group is None else group.launch.generation)
    return pb.WorkerReply(current=False)


def _group_report(g: WorkerGroup, report: pb.WorkerReport) -> pb.WorkerReply:
    t = report.telemetry
    # Rank 0 speaks for the job; other ranks report only out-of-memory errors.
    leader = report.rank == 0
    if leader:
        g.accum.add(t)
    if leader and report.startup_s > 0 and not g.restore_noted:
        g.restore_noted = True
        if g.launch.restore_progress > 0:  # its start-up restored a checkpoint
            g.accum.restored(report.startup_s, g.checkpoint_dir, g.launch.restore_progress)
        g.log.info("workers started training", startup_s=round(report.startup_s, 3),
                   restored=g.launch.restore_progress > 0)
    if report.HasField("oom"):
        g.oom = report.oom
        g.log.warning("worker out of memory", rank=report.rank,
                      atomic_batch_size=report.oom.atomic_batch_size,
                      message=report.oom.message)
    reply = pb.WorkerReply(current=True)
    if leader and (a := g.pending) is not None:
        g.pending = None
        reply.batch_size, reply.atomic_batch_size, reply.accum_steps = (
            a.batch_size, a.atomic_batch_size, a.accum_steps)
    return reply


def _profile_report(run: ProfileRun, report: pb.WorkerReport, log: Any) -> pb.WorkerReply:
    run.accum.add(report.telemetry)
    if report.HasField("oom"):
        run.oom = report.oom
        log.warning("worker out of memory while profiling", job_id=report.telemetry.job_id,
                    atomic_batch_size=report.oom.atomic_batch_size,
                    message=report.oom.message)
    return pb.WorkerReply(current=True)


def drain(accumulators: MutableMapping[tuple[str, int], TelemetryAccumulator],
          groups: Mapping[str, WorkerGroup]) -> list[pb.Telemetry]:
    """What each (job, generation) reported since the last call; the accumulator of
    a generation that no longer runs goes after its last word."""
    out = []
    for key, acc in list(accumulators.items()):
        if (t := acc.take()) is not None:
            out.append(t)
        g = groups.get(key[0])
        if g is None or g.launch.generation != key[1]:
            del accumulators[key]  # ended: this was its last word
    return out
