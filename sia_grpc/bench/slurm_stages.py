"""Where a move's seconds go, in `sia bench slurm`: each move the bridge made,
split into the stages between the bridge's decision and the copy's first step.

The moments come from three places, all on the time.time() clock of this one
machine: the bridge's rounds (`RoundReport`: when it read Slurm, when the policy
answered, when each action's commands started and ended), Slurm's own logs
(slurmctld's `sched: Allocate`/`_start_job` and `_job_complete ... done`, slurmd's
`Launching batch job`, to the millisecond), and the modeled workers' (the truth
service's `copies()`: when the batch script started, when the worker's Python got
going, when it was ready, its first report, its SIGTERM and its exit).

A move of Slurm job `old` to its copy `new` is the chain

    decided   the round read Slurm .. the move's first command (the policy, and the
              round's actions before it)
    commands  `scontrol write batch_script`, `sbatch` of the copy, `scancel` of the old
    old_exit  the old copy's SIGTERM .. its exit (its checkpoint)
    old_ended .. slurmctld has it done (its GPUs free: logged, at the log level the
              bench runs Slurm with, only for a job that ended by itself; for the
              cancelled old copy of a move it counts 0, and the wait is `allocated`'s)
    allocated .. slurmctld allocates the copy (`sched: Allocate`)
    launched  .. slurmd launches its batch script
    script    .. the batch script runs (slurmstepd's set-up)
    python    .. the worker's Python runs (`sia-slurm env`, the interpreter's start)
    ready     .. the worker is ready to restore (the bench's own planning: ~ms)
    restore   .. its first report (the application's modeled restore, then a step)

each stage measured from the end of the one before; a stage that overlapped it
(a copy that got other GPUs starts before the old one has ended) counts 0, so the
stages add up to the whole. **Slurm's side** of a move is `commands` to `python`
(the bridge's commands to the worker's start: what the issue's target is about);
the `decided` and `restore` stages are the policy's and the application's. A job's
first start (a held job given a shape, `scontrol update` and `release`) is the same
chain without the old copy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np

from sia_grpc.slurm.bridge import RoundReport
from sia_grpc.slurm.translate import Action

__all__ = ["MOVE_STAGES", "SLURM_SIDE", "SlurmLogMoments", "breakdown", "summary"]

MOVE_STAGES = ("decided", "commands", "old_exit", "old_ended", "allocated", "launched",
               "script", "python", "ready", "restore")
SLURM_SIDE = ("commands", "old_exit", "old_ended", "allocated", "launched", "script", "python")

_STAMP = r"^\[(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] "
_ALLOCATED = re.compile(_STAMP + r".*(?:sched: Allocate|_start_job: Started) JobId=(?P<j>\d+)"
                        r"(?: NodeList=(?P<nodes>\S+))?")
_ENDED = re.compile(_STAMP + r".*_job_complete: JobId=(?P<j>\d+) done")
_LAUNCHED = re.compile(_STAMP + r".*Launching batch job (?P<j>\d+)")


class SlurmLogMoments:
    """Per Slurm job id, when slurmctld allocated it and had it done, and when a
    slurmd launched its batch script (the first of each), from a cluster's logs
    (`SlurmCluster.root / "log"`: slurmctld.log and one log per slurmd)."""

    def __init__(self, log_dir: Path) -> None:
        self.allocated: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.launched: dict[int, float] = {}
        self.nodes: dict[int, str] = {}  # the NodeList slurmctld allocated it
        for path in sorted(log_dir.glob("*.log")):
            self._read(path.read_text(errors="replace").splitlines())

    def _read(self, lines: Iterable[str]) -> None:
        for line in lines:
            for pattern, into in ((_ALLOCATED, self.allocated), (_ENDED, self.ended),
                                  (_LAUNCHED, self.launched)):
                m = pattern.match(line)
                if m is not None:
                    # (Slurm logs local time; naive datetimes are local here too)
                    into.setdefault(int(m["j"]), datetime.fromisoformat(m["t"]).timestamp())
                    if pattern is _ALLOCATED and m["nodes"]:
                        self.nodes.setdefault(int(m["j"]), m["nodes"])


def _chain(points: Sequence[tuple[str, float | None]]) -> dict[str, float] | None:
    """Stage name -> seconds from the end of the stage before (module docstring);
    None where a moment is missing."""
    if any(t is None for _, t in points):
        return None
    out, last = {}, None
    for name, t in points:
        assert t is not None  # (checked above)
        if last is not None:
            out[name] = max(t - last, 0.0)
        last = t if last is None else max(t, last)
    return out


def breakdown(rounds: Sequence[RoundReport], copies: Mapping[str, Mapping[str, float]],
              slurm: SlurmLogMoments) -> dict[str, list[dict[str, float]]]:
    """{"moves": [...], "starts": [...]}: each move whose copy ran, and each first
    start, as stage -> seconds (and "slurm_side", their sum over SLURM_SIDE; a move's
    "elsewhere": whether Slurm started its copy on another node than Sia's). Moves to
    held (a preemption: no copy runs) and copies that never reported are left out."""
    moves: list[dict[str, float]] = []
    starts: list[dict[str, float]] = []
    for r in rounds:
        for action in r.actions:
            first, last = r.applied.get(action.job_id, (None, None))
            if action.kind == "move":
                new = r.moved.get(action.job_id)
                old = copies.get(str(action.job_id), {})
                copy = copies.get(str(new), {}) if new is not None else {}
                stages = _chain([
                    ("read", r.read_at), ("decided", first), ("commands", last),
                    ("old_exit", old.get("exited", last)),  # (pending: nothing to stop)
                    ("old_ended", slurm.ended.get(action.job_id, last)),
                    *_copy_points(new, copy, slurm)])
                if stages is not None:
                    moves.append({**_with_side(stages),
                                  **_elsewhere(r, action, new, slurm)})
            elif action.kind == "start":
                copy = copies.get(str(action.job_id), {})
                stages = _chain([("read", r.read_at), ("decided", first), ("commands", last),
                                 *_copy_points(action.job_id, copy, slurm)])
                if stages is not None:
                    starts.append(_with_side(stages))
    return {"moves": moves, "starts": starts}


def _elsewhere(r: RoundReport, action: Action, new: int | None,
               slurm: SlurmLogMoments) -> dict[str, float]:
    """{"elsewhere": 1.0} if Slurm started a one-node copy on another node than the
    one Sia planned (the bridge asks Slurm for a GPU type and count, not a node),
    0.0 if on that one; {} where either is unknown (or the copy spans nodes)."""
    sia_id = action.ticket.id if action.ticket else ""
    planned = {g.node for d in (r.response.decisions if r.response else ())
               if d.job_id == sia_id for g in d.allocation.gpus}
    got = slurm.nodes.get(new or 0)
    if len(planned) != 1 or got is None or "[" in got or "," in got:
        return {}
    return {"elsewhere": float(got not in planned)}


def _copy_points(job_id: int | None, copy: Mapping[str, float],
                 slurm: SlurmLogMoments) -> list[tuple[str, float | None]]:
    return [("allocated", slurm.allocated.get(job_id or 0)),
            ("launched", slurm.launched.get(job_id or 0)), ("script", copy.get("launched")),
            ("python", copy.get("main")), ("ready", copy.get("ready")),
            ("restore", copy.get("first_report"))]


def _with_side(stages: dict[str, float]) -> dict[str, float]:
    return {**stages, "slurm_side": sum(stages.get(s, 0.0) for s in SLURM_SIDE)}


def summary(records: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Per stage (and slurm_side): p50, p90 and mean seconds over `records`."""
    out: dict[str, dict[str, float]] = {}
    for name in (*MOVE_STAGES, "slurm_side", "elsewhere"):
        values = [r[name] for r in records if name in r]
        if values:
            out[name] = {"p50": float(np.median(values)),
                         "p90": float(np.percentile(values, 90)),
                         "mean": float(np.mean(values)), "n": len(values)}
    return out
