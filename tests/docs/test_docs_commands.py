"""The docs' commands run as written (issue 37): every command line of ours in the
README, docs/operations.md and the CLI reference (docs/cli.md) parses with the real
parser of its program. Parse only: nothing runs and nothing is reached (the types
the parsers apply are pure), so a renamed flag, a flag given to a command that does
not take it, or a missing argument fails here, naming the page and line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest
from shell_examples import Example, examples, simple_commands, strip_prefixes

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/operations.md", "docs/cli.md"]


def parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from sia_grpc.cli import build_parser
    from sia_grpc.controller.__main__ import parser as controller_parser
    from sia_grpc.nodeagent.__main__ import _parser as agent_parser
    from sia_grpc.slurm.cli import build_parser as slurm_parser

    return {"sia": build_parser, "sia-controller": controller_parser,
            "sia-nodeagent": agent_parser, "sia-slurm": slurm_parser}


class Refused(Exception):
    """What the parser would have printed before exiting 2."""


def parse(make: Callable[[], argparse.ArgumentParser], argv: tuple[str, ...],
          monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse `argv` as its program would; Refused with argparse's message if it
    would not. (Every parser and subparser reports through `error`.)"""
    def refuse(self: argparse.ArgumentParser, message: str) -> None:
        raise Refused(f"{self.prog}: {message}")

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "error", refuse)
        try:
            make().parse_args(list(argv))
        except SystemExit as done:  # --help, --version: printed, and a clean exit
            if done.code not in (0, None):
                raise Refused(f"exit {done.code}") from None


def all_examples() -> list[Example]:
    return [ex for page in PAGES for ex in examples(ROOT / page, ROOT)]


def test_the_pages_have_commands_of_ours_to_check():
    by_page = {page: [ex for ex in all_examples() if ex.page == page] for page in PAGES}
    assert all(by_page.values()), {page: len(found) for page, found in by_page.items()}
    assert {"sia", "sia-controller"} <= {ex.program for ex in all_examples()}


def test_every_command_in_the_docs_parses(monkeypatch, capsys):
    makers, refused = parsers(), []
    for ex in all_examples():
        try:
            parse(makers[ex.program], ex.argv, monkeypatch)
        except Refused as err:
            refused.append(f"{ex}\n    {err}")
    capsys.readouterr()  # (what --help printed)
    assert not refused, "commands in the docs that do not parse:\n" + "\n".join(refused)


@pytest.mark.parametrize(("line", "commands"), [
    ("sia ls -o json | jq -r '.jobs[] | .job_id'", [["sia", "ls", "-o", "json"],
                                                    ["jq", "-r", ".jobs[] | .job_id"]]),
    ("cat job.json | sia submit -  # stdin", [["cat", "job.json"], ["sia", "submit", "-"]]),
    ("sia cluster -o json > out.json 2>&1 && sia queues", [["sia", "cluster", "-o", "json"],
                                                           ["sia", "queues"]]),
])
def test_a_line_is_split_into_its_simple_commands(line, commands):
    assert simple_commands(line) == commands


def test_prefixes_are_taken_off_down_to_the_program():
    assert strip_prefixes(["sudo", "-u", "sia", "SIA_X=1", "sia-controller", "--db", "a"]) == \
        ["sia-controller", "--db", "a"]
    assert strip_prefixes(["timeout", "60", "sia", "ls"]) == ["sia", "ls"]


def test_a_command_that_does_not_parse_is_caught(monkeypatch):
    makers = parsers()
    parse(makers["sia"], ("--controller", "a:1,b:2", "ls"), monkeypatch)
    for bad in [("ls", "--no-such-flag"), ("get",), ("queues", "-o", "wide")]:
        with pytest.raises(Refused):
            parse(makers["sia"], bad, monkeypatch)
