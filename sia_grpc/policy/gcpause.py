"""Policy rounds run with Python's cyclic garbage collector paused.

A round at 32,768 GPUs and 20,480 jobs allocates some 150,000 objects that outlive
it (allocations, reasons, cached estimates), in a process that already tracks ~1.4
million (the jobs' models); every two or three rounds that tipped CPython into a
full collection inside the round, 0.3-0.5 s of it on 2 cores (measured with
`gc.callbacks`, docs/benchmarks.md). With the collector paused for the round, a
collection that is due runs after it, when the caller is between rounds (the
controller's solver process is idle then). Reference counting frees everything
acyclic as usual, so memory grows only by a round's cyclic garbage, if any.

Nested and concurrent rounds share one pause: the first to start takes it, the
last to end gives it back, restoring the collector as the first found it.

`hold` is the same pause for a span that is not one call: the controller's round,
from its tick to its last acknowledgement, across many events of its loop."""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_depth = 0
_was_enabled = False


def collection_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` runs with the cyclic collector paused (see the module doc)."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        _enter()
        try:
            return fn(*args, **kwargs)
        finally:
            _leave()

    return paused


def hold() -> Callable[[], None]:
    """Pause the collector until the returned function is called (the first call
    ends this hold; later ones do nothing)."""
    _enter()
    held = [True]

    def release() -> None:
        if held[0]:
            held[0] = False
            _leave()

    return release


def _enter() -> None:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1


def _leave() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()
