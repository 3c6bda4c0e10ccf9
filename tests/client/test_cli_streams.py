"""`sia_grpc.cli.connection.interruptible`: a watch read on a thread of its own, so
that Ctrl-C lands in the CLI's wait and never inside gRPC's iteration of a call (which
left `sia events -w` unable to close its channel)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from sia_grpc.cli.connection import interruptible

pytestmark = pytest.mark.timeout(30)


def test_items_come_through_in_order_then_the_end_or_the_streams_error():
    assert list(interruptible(iter(range(200)))) == list(range(200))  # (past the queue)

    def failing():
        yield 1
        raise TimeoutError("timed out waiting for the job to finish")

    stream = interruptible(failing())
    assert next(stream) == 1
    with pytest.raises(TimeoutError, match="timed out"):  # (raised where it is read)
        next(stream)


def test_ctrl_c_lands_in_the_readers_wait_not_in_the_stream():
    readers: list[str] = []
    release = threading.Event()

    def blocking():
        yield "first"
        readers.append(threading.current_thread().name)
        release.wait(20)  # (a gRPC call waiting for its next message)
        yield "never read"

    main = threading.main_thread().ident
    assert main is not None and threading.current_thread().ident == main
    stream = interruptible(blocking())
    assert next(stream) == "first"
    # (as in a CLI process: Ctrl-C raises KeyboardInterrupt in the main thread)
    handler, mask = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT)).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(stream)
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert time.monotonic() - started < 5
    assert readers == ["sia-stream"]  # the stream ran, and was interrupted, elsewhere
    release.set()
