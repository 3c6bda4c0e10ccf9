"""`sia slurm submit`: submit a job to Slurm for the Sia bridge to schedule (docs/slurm.md)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from sia_grpc.cli.argparsing import command, subcommand

PREFIX = "sia slurm submit"


def _submit(args: argparse.Namespace) -> int:
    from sia_grpc.client.spec import load_spec
    from sia_grpc.slurm.commands import Slurm
    from sia_grpc.slurm.submit import batch_script, ticket_for

    spec = load_spec(args.spec)
    ticket = ticket_for(spec)
    script = batch_script(args.cmd or list(spec.command), os.environ.get("PATH", ""))
    sbatch = ["--export=NONE", f"--job-name={spec.name or 'sia'}", f"--chdir={os.getcwd()}"]
    for flag in ("partition", "account", "output"):
        value = getattr(args, flag)
        if value:
            sbatch.append(f"--{flag}={value}")
    print(Slurm().submit(script, ticket, sbatch))
    return 0


def add_commands(sub: Any) -> None:
    from sia_grpc.client.spec import SpecError
    from sia_grpc.slurm.commands import SlurmError

    slurm = subcommand(sub, "slurm", "Slurm: submit jobs for the sia-slurm bridge to schedule")
    inner = slurm.add_subparsers(dest="slurm_command", required=True, metavar="COMMAND")
    p = command(inner, "submit", "submit a held Slurm batch job that Sia places "
                                 "(prints its Slurm job id)", _submit,
                prefix=PREFIX, usage=(SpecError, SlurmError, OSError))
    p.add_argument("spec", metavar="SPEC", help="the job spec (YAML, TOML or JSON)")
    p.add_argument("cmd", nargs="*", metavar="-- COMMAND",
                   help="the command the job runs (default: the spec's command)")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--output", help="sbatch --output (default slurm-%%j.out)")
