"""What `sia slurm submit` hands to sbatch: a batch script and the job's ticket."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping, Sequence

from sia_grpc.api import pb
from sia_grpc.client.spec import SpecError
from sia_grpc.slurm.translate import Ticket, policy_job, spec_mapping

__all__ = ["batch_script", "ticket_for"]


def ticket_for(spec: pb.JobSpec, now: float | None = None) -> Ticket:
    """A new job's ticket (its id is its Slurm job id, known once submitted). The
    spec is checked as the bridge will read it, so a bad one fails here, naming the
    field, not in the bridge's log."""
    ticket = Ticket(id="", spec=spec_mapping(spec), submitted=time.time() if now is None else now)
    policy_job(ticket, ticket.submitted)  # raises SpecError naming the field
    return ticket


def batch_script(command: Sequence[str], env: Mapping[str, str],
                 python: str = sys.executable) -> str:
    """The job's batch script: it exports `env` (PATH, and the SIA_* settings given
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
