"""The `sia` command reference, docs/cli.md, rendered from the parsers themselves so
that it cannot go stale: every command and subcommand with its summary, usage,
arguments and their help, and its examples (the epilog `argparsing.examples` wrote).

    python -m sia_grpc.cli.reference > docs/cli.md     (what `make docs` runs)

tests/docs checks that the committed page is what this renders, and that every
command line in it parses. The rendering is fixed-width (`WIDTH`), not the
terminal's, and its own rather than argparse's formatter's, so that it is the same
wherever, and under whichever Python, it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from sia_grpc.cli.argparsing import EXAMPLES, GLOBAL_FLAGS

WIDTH = 100  # the usage lines are wrapped at this width (`usage`)
# The connection flags: described once, under `sia`, and named in each command that
# takes them (they would otherwise repeat in every section).
CONNECTION = tuple(dest for dest in GLOBAL_FLAGS if dest != "output")
HEADER = """# `sia` command reference

<!-- Generated from the parsers by `make docs` (python -m sia_grpc.cli.reference):
do not edit by hand; tests/docs/test_cli_reference.py fails when this page differs. -->

Every `sia` command, its flags and examples, as `sia COMMAND --help` prints them. The
connection flags (`--controller`, `--token-file`, `--ca`, `--cert`, `--key`) and `-o`
are accepted before the command as well as after it (`sia --controller A,B ls`). How
to run a cluster is in [operations.md](operations.md); the job spec's fields are in
the [README](../README.md).
"""


Command = tuple[tuple[str, ...], argparse.ArgumentParser]  # (its path of names, its parser)


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Command]:
    """Each command under `parser` with its path of names ("bench", "policy"), in the
    order they were registered, a command before its own subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # (an alias)
                    continue
                seen.add(id(sub))
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


def examples(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """The parser's examples, (command line, what it does: "" for nothing said), from
    the epilog `argparsing.examples` wrote; none where it has no such epilog."""
    lines = (parser.epilog or "").splitlines()
    if not lines or lines[0] != EXAMPLES:
        return []
    out, what = [], ""
    for line in (ln.strip() for ln in lines[1:]):
        if line.startswith("# "):
            what = line[2:]
        elif line:
            out.append((line, what))
            what = ""
    return out


def prose(text: str) -> str:
    """Help text as Markdown prose: `<name>` would be read as an HTML tag, `*` as
    emphasis."""
    return text.replace("<", "&lt;").replace("*", r"\*")


# (The usage, flags and help are put together here from the parsers' actions rather
# than by argparse's formatter, whose layout changes between Python versions: the page
# must be the same under each.)


def metavar(action: argparse.Action) -> str:
    """What an argument takes, as `--help` writes it: "FILE", "[JOB ...]", "{json,yaml}";
    "" for a flag that takes nothing."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        name = str(action.metavar)
    elif action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        name = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        name = action.dest.upper() if action.option_strings else action.dest
    nargs = action.nargs
    if nargs is None:
        return name
    if nargs == argparse.OPTIONAL:
        return f"[{name}]"
    if nargs == argparse.ZERO_OR_MORE:
        return f"[{name} ...]"
    if nargs == argparse.ONE_OR_MORE:
        return f"{name} [{name} ...]"
    if nargs in (argparse.REMAINDER, argparse.PARSER):
        return f"{name} ..." if nargs == argparse.PARSER else "..."
    return " ".join([name] * int(nargs))


def invocation(action: argparse.Action) -> str:
    """"-o, --output {json,yaml,wide}", "--wait", "JOB"."""
    meta = metavar(action)
    if not action.option_strings:  # (its name alone, as --help lists it)
        return str(action.metavar or action.dest)
    return ", ".join(action.option_strings) + (f" {meta}" if meta else "")


def usage(parser: argparse.ArgumentParser) -> str:
    """`usage: sia ls [-h] [--state STATE [STATE ...]] ... JOB`, wrapped at `WIDTH`:
    the flags in brackets (a required one bare), then the positionals."""
    def flag(action: argparse.Action) -> str:
        meta = metavar(action)
        return action.option_strings[0] + (f" {meta}" if meta else "")

    groups = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    words, shown = [], set()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        group = groups.get(id(action))
        if group is None:
            words.append(flag(action) if action.required else f"[{flag(action)}]")
        elif id(group) not in shown:  # one of them: [--modeled | --offline]
            shown.add(id(group))
            words.append("[" + " | ".join(flag(a) for a in group._group_actions) + "]")
    words += [metavar(a) for a in parser._actions
              if not a.option_strings and a.help != argparse.SUPPRESS]
    lead = f"usage: {parser.prog} "
    lines = [""]
    for word in words:  # (a bracketed flag is never broken across lines)
        if lines[-1] and len(lead) + len(lines[-1]) + 1 + len(word) > WIDTH:
            lines.append("")
        lines[-1] += f" {word}" if lines[-1] else word
    return "\n".join(lead + line if k == 0 else " " * len(lead) + line
                     for k, line in enumerate(lines)).rstrip()


def help_text(action: argparse.Action, prog: str) -> str:
    """An argument's help with `%(default)s` and the like filled in, on one line."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return " ".join((str(action.help) % params).split()) if action.help else ""


def arguments(parser: argparse.ArgumentParser, *, top: bool = False) -> list[str]:
    """One Markdown list item per argument (its flags or name, then its help), in the
    order `--help` lists them; the subcommands, which have their own sections, and -h
    are left out, and below `sia` (`top`) the connection flags are one item."""
    items, connection = [], []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if not top and action.dest in CONNECTION:
            connection.append(f"`{action.option_strings[-1]}`")
            if len(connection) == 1:
                items.append("")  # (its place: where the first of them is)
            continue
        text = help_text(action, parser.prog)
        items.append(f"- `{invocation(action)}`" + (f": {prose(text)}" if text else ""))
    if connection:
        items[items.index("")] = (f"- {', '.join(connection)}: how to reach the controller "
                                  f"(see [`sia`](#sia))")
    return items


def section(path: tuple[str, ...], parser: argparse.ArgumentParser) -> str:
    """A command's section: its summary, usage, arguments, subcommands and examples."""
    out = [f"## sia {' '.join(path)}", "", prose(parser.description or ""), "",
           "```text", usage(parser), "```", ""]
    items = arguments(parser)
    out += ([*items, ""] if items else [])
    subs = [(sub_path, sub) for sub_path, sub in commands(parser, path) if len(sub_path)
            == len(path) + 1]
    if subs:
        out += ["Commands: " + ", ".join(f"[`{p[-1]}`](#{anchor(p)})" for p, _ in subs) + ".",
                ""]
    shown = examples(parser)
    if shown:
        out.append("Examples:")
        out.append("")
        out.append("```console")
        for cmd, what in shown:
            out += [f"$ {cmd}" + (f"  # {what}" if what else "")]
        out += ["```", ""]
    return "\n".join(out)


def anchor(path: tuple[str, ...]) -> str:
    """The GitHub anchor of a command's heading: "sia bench policy" → sia-bench-policy."""
    return "-".join(("sia", *path)).lower()


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page for `parser` (default: the `sia` command line)."""
    if parser is None:
        from sia_grpc.cli import build_parser

        parser = build_parser()
    found = list(commands(parser))
    toc = [f"- [`sia {' '.join(p)}`](#{anchor(p)}): {prose(sub.description or '')}"
           for p, sub in found if len(p) == 1]
    top = ["## sia", "", "```text", usage(parser), "```", "", *arguments(parser, top=True), ""]
    body = [section(p, sub) for p, sub in found]
    return "\n".join([HEADER, *toc, "", *top, *body]).rstrip("\n") + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
