"""The agent's outbox: every message for the controller, in one FIFO that outlives a
stream, so a JobExit is never lost to a reconnect and always precedes the ack of the
directive that caused it."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from typing import Any

from sia_grpc.api import pb

__all__ = ["Outbox"]


class Outbox:
    """FIFO of AgentMessages that survives reconnects; a failed write goes back
    to the front so order is kept."""

    def __init__(self) -> None:
        self._items: collections.deque[pb.AgentMessage] = collections.deque()
        self._ready = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._writing = 0

    def put(self, msg: pb.AgentMessage) -> None:
        self._items.append(msg)
        self._ready.set()
        self._empty.clear()

    def put_front(self, msg: pb.AgentMessage) -> None:
        self._items.appendleft(msg)
        self._ready.set()
        self._empty.clear()

    async def get(self) -> pb.AgentMessage:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        self._writing += 1
        return self._items.popleft()

    def done(self) -> None:
        """The message from the last `get` was written (or handed back)."""
        self._writing -= 1
        if not self._items and not self._writing:
            self._empty.set()

    async def flushed(self) -> None:
        await self._empty.wait()

    @property
    def pending(self) -> bool:
        """Messages queued or being written."""
        return not self._empty.is_set()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[pb.AgentMessage]:
        """The messages queued, oldest first."""
        return iter(self._items)

    def send(self, **kind: Any) -> None:
        """Queue an AgentMessage made of `kind` (e.g. `heartbeat=pb.Heartbeat()`)."""
        self.put(pb.AgentMessage(**kind))
