"""The shell examples of a Markdown page, as argument lists of our own programs, for
tests/docs/test_docs_commands.py: the fenced blocks' command lines (```console,
```sh, ```bash, ```shell: in a console block only the `$ ` lines, which the output
follows; in a block with no language or `text`, only its `$ ` lines too), joined
over trailing backslashes, split at `&&`, `||`, `;` and `|`, the redirections,
environment assignments and `sudo`/`exec`-like prefixes taken off. Those of
`sia`, `sia-controller`, `sia-nodeagent` and `sia-slurm` are kept (by the program's
base name: `.venv/bin/sia` is `sia`); the rest (make, pip, kubectl, psql, ...) are not
ours to check."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

OURS = ("sia", "sia-controller", "sia-nodeagent", "sia-slurm")
SHELL = {"console", "sh", "bash", "shell"}
PROMPT_ONLY = {"", "console", "text"}  # blocks whose commands are only their `$ ` lines
SEPARATORS = {"&&", "||", ";", "|", "&"}
PREFIXES = {"exec", "nohup", "env", "time", "command"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w-]*)")


@dataclass(frozen=True)
class Example:
    """One command of ours in a page: where, as written, and its arguments."""

    page: str
    line: int
    text: str
    program: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """The fenced code blocks: (language, the first line's number, its lines)."""
    out, lines, k = [], text.splitlines(), 0
    while k < len(lines):
        m = FENCE.match(lines[k])
        if not m:
            k += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), k + 1
        k += 1
        while k < len(lines) and not lines[k].strip().startswith(fence):
            k += 1
        out.append((lang, start + 1, lines[start:k]))
        k += 1
    return out


def command_lines(lang: str, first: int, lines: list[str]) -> list[tuple[int, str]]:
    """A block's command lines, (line number, text), continuation lines joined; a
    here-document's body skipped."""
    out: list[tuple[int, str]] = []
    k = 0
    while k < len(lines):
        number, line = first + k, lines[k].strip()
        k += 1
        if lang in PROMPT_ONLY or lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        elif not line or line.startswith("#"):
            continue
        while line.endswith("\\") and k < len(lines):
            line = line[:-1] + " " + lines[k].strip()
            k += 1
        if (heredoc := re.search(r"<<-?\s*['\"]?(\w+)", line)) is not None:
            while k < len(lines) and lines[k].strip() != heredoc.group(1):
                k += 1
            k += 1
        out.append((number, line))
    return out


def simple_commands(line: str) -> list[list[str]]:
    """A command line's simple commands, each its words without redirections."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    words = list(lexer)
    k = 0
    while k < len(words):
        word = words[k]
        if word in SEPARATORS:
            out.append([])
        elif word and set(word) <= set("<>&"):  # a redirection: it and its target
            if out[-1] and out[-1][-1].isdigit():  # (2>, 1>&2: the descriptor too)
                out[-1].pop()
            k += 1
        else:
            out[-1].append(word)
        k += 1
    return [words for words in out if words]


def strip_prefixes(words: list[str]) -> list[str]:
    """Take off environment assignments and `sudo [-u USER]`, `exec`, `timeout N`, ..."""
    while words:
        head = words[0]
        if re.fullmatch(r"[A-Za-z_]\w*=.*", head) or head in PREFIXES:
            words = words[1:]
        elif head == "sudo":
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[2:] if words[0] in ("-u", "-g") else words[1:]
        elif head == "timeout" and len(words) > 1:
            words = words[2:]
        else:
            break
    return words


def examples(path: Path, root: Path) -> list[Example]:
    """Every command of ours in the page at `path` (named relative to `root`)."""
    page = str(path.relative_to(root))
    out = []
    for lang, first, lines in blocks(path.read_text()):
        if lang not in SHELL | PROMPT_ONLY:
            continue
        for number, line in command_lines(lang, first, lines):
            for words in simple_commands(line):
                words = strip_prefixes(words)
                program = Path(words[0]).name if words else ""
                if program in OURS:
                    out.append(Example(page, number, line, program, tuple(words[1:])))
    return out
