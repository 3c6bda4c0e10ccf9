"""The docs' read-only `sia` commands run as written against a live controller
(issue 37): every example in the README, docs/operations.md and the CLI reference
(docs/cli.md) of a command that only reads (ls, get, events, describe, cluster,
queues, watch) runs, with `--controller` pointed at a local controller (given after
the rest, it wins over one the example names), and exits 0 having said nothing on
stderr. The controller has two modeled agents and a job of each id the examples
name (`sia get resnet-1`, `sia describe team-a/train-1`, ...), so they show a real
job. The commands that follow until Ctrl-C (`sia watch`, `sia events -w`) run as
`python -m sia_grpc.cli` processes, are sent SIGINT once they have printed, and must
end with 0, as a watch ended by Ctrl-C does; the others run in this process, through
the CLI's `main`. tests/docs/test_docs_commands.py checks that every example parses."""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass

import pytest
from shell_examples import Example
from test_docs_commands import all_examples

from sia_grpc.api import pb
from sia_grpc.cli import build_parser, main
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(90)]

READ_ONLY = {"ls", "get", "events", "describe", "cluster", "queues", "watch"}
CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)
WAIT = 20.0  # seconds a command may take to print, or to end after SIGINT


@dataclass(frozen=True)
class Command:
    example: Example
    name: str  # the subcommand
    job: str  # the job it names ("" for none)
    follows: bool  # runs until Ctrl-C


def read_only_commands() -> list[Command]:
    """The docs' `sia` examples whose subcommand only reads."""
    out = []
    for ex in all_examples():
        if ex.program != "sia":
            continue
        try:
            args = build_parser().parse_args(list(ex.argv))
        except SystemExit:  # (--help, --version: nothing to run)
            continue
        if args.command in READ_ONLY:
            out.append(Command(ex, args.command, getattr(args, "job", None) or "",
                               args.command == "watch" or bool(getattr(args, "watch", False))))
    return out


def test_the_docs_have_read_only_commands_of_each_kind():
    """The test below runs something of each: a page rewritten without them, or a
    parse that no longer finds them, would make it pass vacuously."""
    assert {c.name for c in read_only_commands()} == READ_ONLY
    assert any(c.follows for c in read_only_commands())


async def _submit_named(sia: AsyncSiaClient, job: str) -> None:
    """The job the examples name: `tenant/name` as that tenant's `name`."""
    tenant, _, name = job.rpartition("/")
    await sia.submit(pb.JobSpec(name=name, application="cifar10", tenant=tenant,
                                adaptivity=pb.ADAPTIVITY_ADAPTIVE, max_gpus=2), job_id=name)


# `sia ARGV` with SIGINT as a shell leaves it to a command it starts (default,
# unblocked), whatever this test process has made of it (a disposition or mask is
# inherited across exec; a preexec_fn would run Python in a forked child of a process
# with gRPC's threads, which gRPC aborts).
_AS_FROM_A_SHELL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                    "os.execv(sys.executable, [sys.executable, '-m', 'sia_grpc.cli', "
                    "*sys.argv[1:]])")


async def _follow(argv: list[str]) -> tuple[int | str, str, str]:
    """Run `sia ARGV` as its own process until it has printed a line, then Ctrl-C it:
    (its exit status, or what it did not do in time; its output, its errors)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _AS_FROM_A_SHELL, *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    missed = f"printed nothing in {WAIT:g} s"
    try:
        first = await asyncio.wait_for(proc.stdout.readline(), WAIT)
        proc.send_signal(signal.SIGINT)
        missed = f"still running {WAIT:g} s after SIGINT"
        rest, err = await asyncio.wait_for(proc.communicate(), WAIT)
    except TimeoutError:
        proc.kill()
        rest, err = await proc.communicate()
        return missed, rest.decode(), err.decode()
    return proc.returncode, (first + rest).decode(), err.decode()


async def test_every_read_only_command_in_the_docs_runs_against_a_controller(capsys):
    """Each read-only example exits 0, with nothing on stderr, against a live
    controller holding the jobs the examples name."""
    commands = read_only_commands()
    async with LocalCluster({"rtx": (2, 4)}, rate=120.0, config=CONFIG,
                            telemetry_interval=0.05) as lc, \
            AsyncSiaClient(lc.target, timeout=10.0) as sia:
        await lc.wait_registered(2)
        for job in sorted({c.job for c in commands if c.job}):
            await _submit_named(sia, job)
        async with asyncio.timeout(WAIT):  # a round ran: the cluster and rounds show it
            while not await sia.events(kinds=[pb.EVENT_KIND_ROUND_FINISHED], limit=1):
                await asyncio.sleep(0.05)
        failed = []
        following = [c for c in commands if c.follows]
        followed = asyncio.gather(*(_follow([*c.example.argv, "--controller", lc.target])
                                    for c in following))
        for c in commands:
            if c.follows:
                continue
            capsys.readouterr()
            code = await asyncio.to_thread(main, [*c.example.argv, "--controller", lc.target])
            out, err = capsys.readouterr()
            if code != 0 or err:
                failed.append(f"{c.example}\n    exit {code}: {err.strip()}")
            elif c.job and c.job not in out and c.name != "events":
                failed.append(f"{c.example}\n    the output does not name {c.job}")
        for c, (status, out, err) in zip(following, await followed, strict=True):
            if status != 0 or err:
                failed.append(f"{c.example}\n    {status} after SIGINT: {err.strip()}")
            elif not out.strip():
                failed.append(f"{c.example}\n    printed nothing before SIGINT")
    assert not failed, "read-only commands in the docs that fail:\n" + "\n".join(failed)
