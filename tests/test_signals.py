"""`sia_grpc.signals.handled`: loop signal handlers that are undone afterwards."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import uvloop

from sia_grpc import signals

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_handlers_run_inside_and_the_old_dispositions_come_back(loop_name: str) -> None:
    def mine(*_: object) -> None:
        pass

    old = signal.signal(signal.SIGHUP, mine)  # a Python handler from before the loop
    try:
        seen: list[str] = []

        async def main() -> None:
            loop = asyncio.get_running_loop()
            got = asyncio.Event()
            with signals.handled(loop, {signal.SIGHUP: lambda: (seen.append("hup"), got.set()),
                                        signal.SIGTERM: lambda: seen.append("term")}):
                os.kill(os.getpid(), signal.SIGHUP)
                await asyncio.wait_for(got.wait(), 5)

        with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
            runner.run(main())
        assert seen == ["hup"]
        assert signal.getsignal(signal.SIGHUP) is mine
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, old)


def test_uvloop_alone_leaves_its_handler_behind() -> None:
    """Why `handled` exists: if uvloop ever restores dispositions itself, it can go."""
    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
