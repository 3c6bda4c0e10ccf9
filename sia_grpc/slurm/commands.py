"""Slurm's I/O for the bridge: every call to Slurm's commands is here.

Reads are `sinfo --json` (nodes) and `squeue --json` (jobs); writes are
`scontrol update/release`, `sbatch` and `scancel`. Errors are `SlurmError`
naming the command and what it printed. The environment (SLURM_CONF, PATH)
is the bridge's, or the one given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sia_grpc.slurm.ticket import Shape, Ticket

if TYPE_CHECKING:  # (the bridge's: `sia-slurm env` imports this module, not the policy)
    from sia_grpc.slurm.translate import Action

__all__ = ["JobEnded", "Slurm", "SlurmError"]


class SlurmError(RuntimeError):
    """A Slurm command failed: the command and its output."""


class JobEnded(SlurmError):
    """The job to move has ended by itself since the round read it: not moved (a copy
    would start from its final checkpoint and end at once, holding GPUs meanwhile)."""


# Job states in which a job is still Sia's to move (`scontrol show job`'s JobState).
_MOVABLE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "REQUEUED",
                      "RESIZING"})


# What sbatch itself reads from its environment (the job gets what its script exports).
_SBATCH_ENV = frozenset({"PATH", "SLURM_CONF"})


def _gpus_request(shape: Shape) -> list[str]:
    """`scontrol update` fields for a shape: GPUs per job of Slurm's type, on
    exactly `num_nodes` nodes (the ones Sia placed it on, where it names them), one
    task per node (Slurm refuses fewer tasks than nodes)."""
    n = shape.num_nodes
    pin = [f"ReqNodeList={shape.node_names}"] if shape.nodes else []
    return [f"TresPerJob=gres:gpu:{shape.gres_type}:{shape.num_gpus}", f"NumNodes={n}-{n}",
            f"NumTasks={n}", *pin]


class Slurm:
    def __init__(self, env: Mapping[str, str] | None = None, *, timeout_s: float = 30.0) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s

    def run(self, *argv: str, stdin: str | None = None,
            env: Mapping[str, str] | None = None) -> str:
        try:
            out = subprocess.run(list(argv), env=env or self.env, input=stdin,
                                 capture_output=True,
                                 text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmError(f"{' '.join(argv[:3])}: {err}") from err
        if out.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:3])} failed ({out.returncode}): "
                             f"{(out.stderr or out.stdout).strip()}")
        return out.stdout

    # -- reads ---------------------------------------------------------------------------

    def nodes_json(self) -> dict[str, Any]:
        return json.loads(self.run("sinfo", "--json"))

    def jobs_json(self) -> dict[str, Any]:
        # (22.05's squeue --json ignores -j and -t: the caller filters)
        return json.loads(self.run("squeue", "--json"))

    def state(self, job_id: int) -> str | None:
        """The job's state now (`scontrol show job`, one line), None once it is gone."""
        try:
            out = self.run("scontrol", "show", "job", "-o", str(job_id))
        except SlurmError:
            return None
        m = re.search(r"\bJobState=(\S+)", out)
        return m.group(1) if m else None

    # -- writes --------------------------------------------------------------------------

    def apply(self, action: Action, raw: Mapping[str, Any] | None = None) -> int | None:
        """Carry out one `Action`; a move returns the new job's id."""
        if action.kind in ("start", "pin"):
            # (their tickets carry the job's shape)
            assert action.ticket is not None and action.ticket.shape is not None
            self.run("scontrol", "update", f"job={action.job_id}",
                     *_gpus_request(action.ticket.shape), f"Comment={action.ticket.comment()}")
            if action.kind == "start":
                self.run("scontrol", "release", str(action.job_id))
        elif action.kind == "release":
            self.run("scontrol", "release", str(action.job_id))
        elif action.kind == "rebatch":
            assert action.ticket is not None  # (a rebatch carries the new shape)
            self.note(action.job_id, action.ticket)
        elif action.kind == "move":
            new = self.copy(action, raw)
            self.end_move(action, new)
            return new
        elif action.kind == "cancel":
            self.cancel(action.job_id)
        else:
            raise ValueError(f"unknown action {action.kind!r}")
        return None

    def copy(self, action: Action, raw: Mapping[str, Any] | None = None) -> int:
        """A move's first half: submit the copy of `action.job_id` carrying the action's
        ticket (the old job is cancelled after: `cancel`). JobEnded if the old job has
        ended since the round read it (a copy would run it again)."""
        if (state := self.state(action.job_id)) not in _MOVABLE:
            raise JobEnded(f"job {action.job_id} is {state or 'gone'}: not moved")
        assert action.ticket is not None  # (a move carries the copy's ticket)
        return self.resubmit(action.job_id, action.ticket, raw or {})

    def end_move(self, action: Action, new: int) -> None:
        """A move's second half: cancel the old job, whose copy `new` is in. If the
        old job ended in between (its owner cancelled it, or it finished), the copy
        would run it again: the copy is cancelled instead and JobEnded raised. (scancel
        of an ended job succeeds silently, so its state is read first: a window of
        milliseconds, not of a round.)"""
        if (state := self.state(action.job_id)) not in _MOVABLE:
            self.cancel(new)
            raise JobEnded(f"job {action.job_id} is {state or 'gone'}: it ended while being "
                           f"moved, and its copy {new} was cancelled")
        self.cancel(action.job_id)

    def note(self, job_id: int, ticket: Ticket) -> None:
        """Write `ticket` into the job's comment (what its workers reported)."""
        self.run("scontrol", "update", f"job={job_id}", f"Comment={ticket.comment()}")

    def cancel(self, job_id: int) -> None:
        """Cancel a job: Slurm signals it (SIGTERM, then SIGKILL after KillWait), which
        `sia_grpc.train` takes as the cue to checkpoint."""
        self.run("scancel", str(job_id))

    def submit(self, script: str, ticket: Ticket, args: Sequence[str] = ()) -> int:
        """sbatch `script` (from stdin) with `args`, carrying `ticket` in its comment:
        held without a shape, else with the shape's GPUs. Returns the job id.

        The job's environment is what the script exports (`submit.batch_script`: the
        submitter's PATH, HOME, ... and the SIA_* settings) over Slurm's own: sbatch
        runs with `--export=ALL` from an environment holding only what it needs itself
        (`_SBATCH_ENV`), so nothing of the bridge's leaks into a user's job. Not
        `--export=NONE`: that makes slurmd load the user's login environment (`su -
        USER -c env`, up to `--get-user-env`'s 8-s timeout) before every start, 1.1 s
        of each move's start on the bench (docs/slurm.md, "Where a move's seconds
        go")."""
        argv = ["sbatch", "--parsable", "--export=ALL", *args,
                f"--comment={ticket.comment()}"]
        shape = ticket.shape
        if shape is None:
            argv.append("--hold")
        else:
            argv += [f"--gpus={shape.gres_type}:{shape.num_gpus}", f"--nodes={shape.num_nodes}",
                     f"--ntasks={shape.num_nodes}"]
            if shape.nodes:  # (Sia's nodes: `_gpus_request`)
                argv.append(f"--nodelist={shape.node_names}")
        base = self.env if self.env is not None else os.environ
        env = {k: v for k, v in base.items() if k in _SBATCH_ENV}
        out = self.run(*argv, stdin=script, env=env).strip()
        return int(out.split(";")[0])

    def resubmit(self, job_id: int, ticket: Ticket, raw: Mapping[str, Any]) -> int:
        """A copy of `job_id` (its batch script, name, directory, output files,
        partition, account, QOS and time limit) carrying `ticket`."""
        script = self.run("scontrol", "write", "batch_script", str(job_id), "-")
        args = []
        for flag, key in (("--job-name", "name"), ("--chdir", "current_working_directory"),
                          ("--output", "standard_output"), ("--error", "standard_error"),
                          ("--partition", "partition"), ("--account", "account"),
                          ("--qos", "qos"), ("--time", "time_limit")):
            value = raw.get(key)
            if value and isinstance(value, str | int):  # (time_limit: minutes)
                args.append(f"{flag}={value}")
        return self.submit(script, ticket, args)
