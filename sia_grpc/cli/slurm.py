"""`sia slurm submit`: submit a job to Slurm for the Sia bridge to schedule (docs/slurm.md)."""

from __future__ import annotations

import argparse
from typing import Any

from sia_grpc.cli.argparsing import UsageError, command, subcommand

PREFIX = "sia slurm submit"


def _submit(args: argparse.Namespace) -> int:
    from sia_grpc.client.spec import load_spec
    from sia_grpc.slurm.submit import submit_job, ticket_for

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if cmd and cmd[0].startswith("-") and cmd is args.cmd:
        raise UsageError(f"unexpected {cmd[0]!r} after SPEC: options go before SPEC, the "
                         f"command after `--`")
    spec = load_spec(args.spec)
    ticket = ticket_for(spec)
    if args.report_to and not args.report_token_file:
        raise UsageError("--report-to needs --report-token-file (the bridge's workers' "
                         "token)")
    print(submit_job(spec, cmd, ticket=ticket, checkpoint_dir=args.checkpoint_dir,
                     report_to=args.report_to, report_token_file=args.report_token_file,
                     partition=args.partition, account=args.account, output=args.output))
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
    # (REMAINDER: the command's own options are not sia's; sia's go before SPEC)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="the command the job runs (default: the spec's command)")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--output", help="sbatch --output (default slurm-%%j.out)")
    p.add_argument("--report-to", metavar="HOST:PORT",
                   help="the bridge's WorkerService (sia-slurm run --listen): the workers "
                        "report their step times there (SIA_AGENT_ADDRESS)")
    p.add_argument("--report-token-file", metavar="FILE",
                   help="with --report-to: file holding its token (SIA_AGENT_TOKEN)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="SIA_CHECKPOINT_DIR for sia_grpc.train: where the job checkpoints and "
                        "resumes from when Sia moves it (on storage every node sees)")
