"""A TCP proxy that can be cut like a pulled cable, for partition tests: between a
controller and its PostgreSQL server, say.

    proxy = await TcpProxy.start("127.0.0.1", pg_port)   # listens on proxy.port
    proxy.partition()   # nothing passes either way; connections stay open (no RST, no FIN)
    proxy.heal()        # what was held back flows on

Runs on the caller's asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["TcpProxy"]


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task] = set()
        self.port = 0

    @classmethod
    async def start(cls, host: str, port: int, *, listen: str = "127.0.0.1") -> TcpProxy:
        proxy = cls(host, port)
        proxy._server = await asyncio.start_server(proxy._accept, listen, 0)
        proxy.port = proxy._server.sockets[0].getsockname()[1]
        return proxy

    def partition(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._open.wait()  # partitioned: held here, nothing forwarded
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._pipes, return_exceptions=True)
