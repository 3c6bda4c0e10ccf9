"""What `sia slurm submit` hands to sbatch: a batch script and the job's ticket
(`submit_job`: the whole submission, for the command line and the Slurm bench)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence

from sia_grpc.api import pb
from sia_grpc.client.spec import SpecError
from sia_grpc.slurm.commands import Slurm
from sia_grpc.slurm.ticket import COMMENT_MAX, SPEC_ROOM
from sia_grpc.slurm.translate import Ticket, policy_job, spec_mapping

# The submitter's variables a job's script exports (a login's, less what Slurm sets).
_JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ")

__all__ = ["batch_script", "submit_job", "ticket_for"]


def ticket_for(spec: pb.JobSpec, now: float | None = None) -> Ticket:
    """A new job's ticket (its id is its Slurm job id, known once submitted). The
    spec is checked as the bridge will read it, so a bad one fails here, naming the
    field, not in the bridge's log."""
    ticket = Ticket(id="", spec=spec_mapping(spec), submitted=time.time() if now is None else now)
    policy_job(ticket, ticket.submitted)  # raises SpecError naming the field
    spec_len = len(json.dumps(ticket.spec, separators=(",", ":"), sort_keys=True))
    if spec_len > SPEC_ROOM:  # (the bridge could not keep the job's state in Slurm)
        raise SpecError("spec", f"{spec_len} characters as the bridge keeps it; at most "
                                f"{SPEC_ROOM} fit in the job's Slurm comment ({COMMENT_MAX} "
                                f"characters) beside what the bridge adds")
    return ticket


def batch_script(command: Sequence[str], env: Mapping[str, str],
                 python: str = sys.executable) -> str:
    """The job's batch script: it exports `env` (PATH, HOME, ..., and the SIA_* settings given
    at submission: SIA_CHECKPOINT_DIR, SIA_AGENT_ADDRESS, ...), takes the shape Sia
    gave it from its ticket (`sia-slurm env`: SIA_BATCH_SIZE, ...) and runs `command`."""
    if not command:
        raise SpecError("spec.command", "no command: give one after `--` or in the spec")
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return (f"#!/bin/sh\n"
            f"# A sia-slurm job: Sia chooses its GPU type, count and batch size "
            f"(docs/slurm.md).\n{exports}"
            f'eval "$({shlex.quote(python)} -m sia_grpc.slurm env)"\n'
            f"exec {shlex.join(command)}\n")


def submit_job(spec: pb.JobSpec, command: Sequence[str], *, ticket: Ticket | None = None,
               checkpoint_dir: str | None = None, report_to: str | None = None,
               report_token_file: str | None = None, partition: str | None = None,
               account: str | None = None, output: str | None = None) -> int:
    """`sia slurm submit`: sbatch a held job for the bridge to place, running `command`
    (default: the spec's), from the current folder; returns its Slurm job id.
    `ticket`: `ticket_for(spec)`, made here unless given (the command line makes it
    first: a bad spec is the first thing it reports). `report_to` (the bridge's
    WorkerService) needs `report_token_file`, the file holding its workers' token.
    SpecError, SlurmError or OSError if it cannot."""
    if ticket is None:
        ticket = ticket_for(spec)
    # The submitter's environment as a job expects it (sbatch's default passes all of
    # it; the bridge's copies of the job must start with the same, so it is written
    # into the script: `Slurm.submit`).
    env = {k: os.environ[k] for k in _JOB_ENV if k in os.environ}
    if checkpoint_dir:
        env["SIA_CHECKPOINT_DIR"] = os.path.abspath(checkpoint_dir)
    if report_to:
        if not report_token_file:
            raise ValueError("report_to needs report_token_file")
        with open(report_token_file) as f:
            env.update(SIA_AGENT_ADDRESS=report_to, SIA_AGENT_TOKEN=f.read().strip())
    script = batch_script(list(command) or list(spec.command), env)
    sbatch = [f"--job-name={spec.name or 'sia'}", f"--chdir={os.getcwd()}"]
    for flag, value in (("partition", partition), ("account", account), ("output", output)):
        if value:
            sbatch.append(f"--{flag}={value}")
    return Slurm().submit(script, ticket, sbatch)
