"""Injectable time, one notion for the controller, the agents and their modeled
workers: everything that reads the time or waits goes through a `Clock`.

`WallClock` is what a controller runs on (its timestamps are wall time);
`MonotonicClock` what an agent runs on; `ScaledClock(rate)` runs K× faster than
real time (`sia replay`, the demo and the end-to-end tests run a controller and
its modeled agents at one rate, a sped-up real cluster); `ManualClock` moves only
when a test says, so modeled completion times are checked exactly, without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock", "ScaledClock", "WallClock"]


class Clock(Protocol):
    rate: float  # clock seconds per real second

    def time(self) -> float:
        """Seconds on this clock."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time."""
        ...


class WallClock:
    """Wall time (`time.time`), for timestamps, and `asyncio.sleep`."""

    rate = 1.0

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class MonotonicClock(WallClock):
    """Real time that never jumps (`time.monotonic`): for measuring and waiting."""

    def time(self) -> float:
        return time.monotonic()


class ScaledClock(WallClock):
    """Wall time running `rate`× faster than real time (a 60 s round takes 60/rate s)."""

    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"rate: must be positive, got {rate}")
        self.rate = float(rate)
        self._wall0, self._mono0 = time.time(), time.monotonic()

    def time(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0) * self.rate

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0) / self.rate)


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

    rate = 1.0  # (its time moves by `advance`, not with real time)

    def time(self) -> float:
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
