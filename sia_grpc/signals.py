"""Signal handlers on an event loop that are undone when the loop's work ends.

uvloop's `Loop.close()`, unlike asyncio's, leaves the Python-level handler of every
signal given to `add_signal_handler` installed (a bound method of the closed loop,
which does nothing). A process that goes on after such a loop (a test run, an
embedding service, `sia demo`) then ignores SIGTERM in effect, and so does every
child it forks without exec: a `multiprocessing` fork pool's `terminate()` waited
on such a child for ever in CI. `handled` takes the handlers off again and puts
back what was there before, on either loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Mapping


@contextlib.contextmanager
def handled(loop: asyncio.AbstractEventLoop,
            handlers: Mapping[signal.Signals, Callable[[], object]]) -> Iterator[None]:
    """`loop.add_signal_handler` for each of `handlers` inside the block; after it,
    each signal's disposition is the one it had before. A platform without loop
    signal handlers (Windows) skips them."""
    before = {sig: signal.getsignal(sig) for sig in handlers}
    added: list[signal.Signals] = []
    try:
        for sig, callback in handlers.items():
            try:
                loop.add_signal_handler(sig, callback)
            except NotImplementedError:
                continue
            added.append(sig)
        yield
    finally:
        for sig in added:
            loop.remove_signal_handler(sig)  # False when the block removed it already
            if before[sig] is not None:  # None: set from outside Python, left alone
                signal.signal(sig, before[sig])
