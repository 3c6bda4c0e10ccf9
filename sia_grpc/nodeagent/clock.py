"""Injectable time for the agent and its modeled workers.

Everything that waits goes through a `Clock`, so tests can replace real time with
`ManualClock` and check modeled completion times exactly, without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """Real time: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class ManualClock:
    """Time that moves only when `advance` is awaited.

    `advance` steps from one sleeper's deadline to the next, letting the woken
    tasks run (and schedule their next sleeps) before it goes on, so a loop that
    sleeps 1 s wakes five times in `advance(5)`, each time seeing `now()` at its
    exact deadline.
    """

    _SETTLE_ROUNDS = 20  # loop iterations given to woken tasks before time moves on

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut  # a cancelled sleeper is skipped when its deadline comes

    @property
    def sleepers(self) -> int:
        """Tasks currently sleeping on this clock."""
        return sum(not f.done() for _, _, f in self._sleepers)

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, waking every sleeper due on the way."""
        if seconds < 0:
            raise ValueError(f"seconds: cannot go back in time ({seconds})")
        await self.advance_to(self._now + seconds)

    async def advance_to(self, when: float) -> None:
        """Move time forward to `when` (never back)."""
        await self._settle()  # let tasks that are about to sleep register first
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline = self._sleepers[0][0]
            self._now = max(self._now, deadline)
            while self._sleepers and self._sleepers[0][0] <= deadline:
                _, _, fut = heapq.heappop(self._sleepers)
                if not fut.done():
                    fut.set_result(None)
            await self._settle()
        self._now = max(self._now, when)
        await self._settle()

    async def _settle(self) -> None:
        for _ in range(self._SETTLE_ROUNDS):
            await asyncio.sleep(0)
