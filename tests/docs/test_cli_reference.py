"""The CLI reference, docs/cli.md, is what the parsers render (`make docs`), so that
it cannot go stale: a flag added, renamed or re-explained in a parser and not in the
page fails here. And the main commands carry examples."""

from __future__ import annotations

import difflib
from pathlib import Path

from sia_grpc.cli import build_parser, reference

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"


def test_docs_cli_md_is_what_the_parsers_render():
    rendered, committed = reference.render(), PAGE.read_text()
    if rendered != committed:
        diff = "".join(difflib.unified_diff(
            committed.splitlines(keepends=True), rendered.splitlines(keepends=True),
            "docs/cli.md (committed)", "rendered from the parsers", n=1))
        raise AssertionError(f"docs/cli.md is stale: run `make docs`\n{diff[:4000]}")


def test_every_command_has_a_section_and_the_main_ones_have_examples():
    page = reference.render()
    found = dict(reference.commands(build_parser()))
    for path in found:
        assert f"\n## sia {' '.join(path)}\n" in page
    for name in ("submit", "ls", "get", "cancel", "watch", "cluster", "queues", "drain",
                 "simulate"):
        shown = reference.examples(found[(name,)])
        assert shown, f"sia {name} has no examples"
        assert all(cmd.split()[0] in ("sia", "cat") for cmd, _ in shown)
    cancel = [cmd for cmd, _ in reference.examples(found[("cancel",)])]
    assert any(len(cmd.split()) > 3 for cmd in cancel)  # several ids
    assert any(" -l " in cmd for cmd in cancel) and any("--all" in cmd for cmd in cancel)


def test_examples_are_read_back_from_the_epilog_as_written():
    p = build_parser()
    (ls,) = [sub for path, sub in reference.commands(p) if path == ("ls",)]
    assert reference.examples(ls)[0] == ("sia ls", "every job, oldest first")
    assert "examples:\n  # every job, oldest first\n  sia ls\n" in ls.format_help()
