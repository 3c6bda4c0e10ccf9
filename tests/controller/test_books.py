"""The controller's state is its books (`sia_grpc.controller.machine.books`): declared once,
each field through its book, and each handler module changing only the books its
docstring names ("Changes: ...")."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from harness import Harness

from sia_grpc.controller.machine import books
from sia_grpc.controller.machine.books import StateBase
from sia_grpc.controller.machine.state import ControllerState

CONTROLLER = Path(books.__file__).parent
# The modules that make up `ControllerState`, the parts that handle events.
PARTS = ("state", "agents", "rounds", "profiling", "moves", "ledger", "views")
# The books, by their attribute on the state: the dataclass of each.
BOOKS = {"job_book": books.JobBook, "node_book": books.NodeBook,
         "round_book": books.RoundBook, "directive_book": books.DirectiveBook,
         "move_book": books.MoveBook, "profile_book": books.ProfileBook,
         "change_book": books.ChangeBook}
# What else the state holds: inputs, replaced whole (never changed in place).
INPUTS = {"settings", "started_at", "queues"}
# Methods that change the container they are called on.
MUTATORS = {"add", "append", "clear", "discard", "extend", "insert", "move_to_end", "pop",
            "popitem", "remove", "setdefault", "update", "__setitem__", "__delitem__"}


def _changes(source: str) -> dict[str, set[str]]:
    """book -> the fields the code changes in place or assigns: `self.<book>.<field>`
    (or an element of it) as an assignment's or `del`'s target, or the receiver of a
    mutating call; also through a local name bound to a book, to a field or to an
    element of one (`cache = self.profile_book.cache; cache[key] = ...`). A record
    reached through a book (`self.node_book.nodes[n].holder`) is the record's own."""
    out: dict[str, set[str]] = {}

    def scan(fn: ast.AST) -> None:
        aliases: dict[str, tuple[str, str | None]] = {}  # local -> (book, field or None)

        def root(e: ast.AST) -> tuple[str, str | None] | None:
            """The book and field `e` is (or is an element of), else None."""
            while True:
                if isinstance(e, ast.Subscript):
                    e = e.value
                elif (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute)
                      and e.func.attr in ("get", "setdefault")):
                    e = e.func.value
                else:
                    break
            if isinstance(e, ast.Attribute):
                v = e.value
                if (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)
                        and v.value.id == "self" and v.attr in BOOKS):
                    return v.attr, e.attr
                if isinstance(v, ast.Name) and aliases.get(v.id, ("", ""))[1] is None:
                    return aliases[v.id][0], e.attr
                if isinstance(v, ast.Name) and v.id == "self" and e.attr in BOOKS:
                    return e.attr, None
            if isinstance(e, ast.Name) and e.id in aliases:
                return aliases[e.id]
            return None

        def write(target: ast.AST) -> None:
            if isinstance(target, ast.Tuple | ast.List):
                for t in target.elts:
                    write(t)
            elif isinstance(target, ast.Starred):
                write(target.value)
            elif not isinstance(target, ast.Name):  # (a local bound anew is no change)
                r = root(target)
                if r is not None:
                    out.setdefault(r[0], set()).add(r[1] or "*")

        def bind(target: ast.AST, value: ast.AST | None) -> None:
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                for t, v in zip(target.elts, value.elts, strict=False):
                    bind(t, v)
            elif isinstance(target, ast.Name):
                r = None if value is None else root(value)
                if r is not None:
                    aliases[target.id] = r
                else:
                    aliases.pop(target.id, None)

        for node in ast.walk(fn):  # (in source order within a function: enough here)
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    write(t)
                    bind(t, node.value)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                write(node.target)
            elif isinstance(node, ast.Delete):
                for t in node.targets:
                    write(t)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATORS):
                r = root(node.func.value)
                if r is not None:
                    out.setdefault(r[0], set()).add(r[1] or node.func.attr)

    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef):
            scan(fn)
    return out


def _claimed(module: str) -> set[str]:
    doc = ast.get_docstring(ast.parse((CONTROLLER / f"{module}.py").read_text())) or ""
    m = re.search(r"^Changes:(.*?)(?:\.\s*$|\n\n|\Z)", doc, re.M | re.S)
    assert m, f"{module}.py: no 'Changes:' line in its docstring"
    return {w for w in re.split(r"[\s,]+", m.group(1)) if w and w != "none"}


@pytest.mark.parametrize("module", PARTS)
def test_each_part_changes_only_the_books_it_says(module: str):
    """A part's docstring names the books it changes; the code changes those and no
    other (what it calls in another part changes that part's)."""
    changed = _changes((CONTROLLER / f"{module}.py").read_text())
    assert set(changed) <= set(BOOKS)
    assert set(changed) == _claimed(module), {b: sorted(f) for b, f in changed.items()}


def test_every_field_a_part_changes_is_one_of_its_book():
    """(A typo's field would be a new attribute: the books have slots, and mypy reads
    them; this says which ones the parts change, so none is left unused.)"""
    changed: dict[str, set[str]] = {}
    for module in PARTS:
        for book, fields in _changes((CONTROLLER / f"{module}.py").read_text()).items():
            changed.setdefault(book, set()).update(fields)
    for book, cls in BOOKS.items():
        names = {f.name for f in dataclasses.fields(cls)}
        assert changed[book] <= names, (book, changed[book] - names)
        assert names <= changed[book], f"{book}: {sorted(names - changed[book])} never change"


def test_the_scan_sees_changes_through_the_book_and_through_locals():
    src = '''
def f(self, rec):
    self.move_book.seq += 1
    del self.move_book.moving[rec]
    self.directive_book.round_acks.get(1, set()).discard(2)
    cache = self.profile_book.cache
    cache[1] = 2
    marks = self.change_book
    marks.freed_all, other = False, 1
    taken = self.node_book.ports.setdefault("n", {})
    taken[1] = "j"
    rec = self.job_book.jobs.get("j")
    rec.held.pop("n")
    self.node_book.nodes["n"].holder.update({})
    x = self.round_book.solving
'''
    assert _changes(src) == {
        "move_book": {"seq", "moving"}, "directive_book": {"round_acks"},
        "profile_book": {"cache"}, "change_book": {"freed_all"}, "node_book": {"ports"}}


def test_every_field_says_what_it_means():
    """Each book's field has a comment (the line above it, or the one before that when
    two fields share it, or at its end): the books are where a field is looked up."""
    for cls in BOOKS.values():
        lines = inspect.getsource(cls).splitlines()
        for f in dataclasses.fields(cls):
            at = next(k for k, line in enumerate(lines) if re.match(rf"\s+{f.name}:", line))
            above = [lines[k].strip() for k in range(max(at - 2, 0), at)]
            assert "#" in lines[at] or any(a.startswith("#") for a in above), \
                f"{cls.__name__}.{f.name}: no comment says what it means"


def test_the_state_is_its_books_and_its_inputs():
    """Whatever events do, the state holds nothing but its books and its inputs: a
    part that kept an attribute of its own would be state declared nowhere."""
    h = Harness({"rtx-0": ("rtx", 4), "aws-0": ("aws", 2)})
    for k in range(4):
        h.submit(f"j{k}", max_gpus=4)
    h.deliver()
    h.tick()
    h.deliver()
    h.complete("j0")
    h.tick()
    h.deliver()
    assert set(vars(h.state)) == set(BOOKS) | INPUTS
    for name, cls in BOOKS.items():
        book = getattr(h.state, name)
        assert type(book) is cls and not hasattr(book, "__dict__")  # (slots: no field
        # but the declared ones)


def test_every_part_inherits_the_declared_state():
    for part in ControllerState.__mro__[1:-2]:
        assert issubclass(part, StateBase), part
