"""The door to WorkerService for one job generation: a Unix socket in the job's
own folder that lets in only the job's processes.

WorkerService itself listens on the agent's private socket (`workerservice`),
which no job can reach. Each running generation gets a gate: a socket of its own,
in a folder only the job's user can traverse, whose every connection is checked
by the kernel's word on who made it (SO_PEERCRED): a peer whose uid is not the
job's is closed at once and counted. An admitted connection is spliced, byte for
byte, to WorkerService; there the per-generation secret the worker sends decides
which generation a report is from (`TorchBackend._on_report`), never the job id
the report names. So a job cannot reach another job's gate (folder and uid), and
a report that does reach one counts only for the generation whose secret it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from pathlib import Path
from typing import Any

__all__ = ["WorkerGate", "peer_credentials"]

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CHUNK = 1 << 16


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected `sock` (a Unix socket)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class WorkerGate:
    """A socket at `path` for the processes of uid `uid`, spliced to `upstream`
    (WorkerService's Unix socket). `refused` counts the connections turned away."""

    def __init__(self, path: Path, uid: int, upstream: Path, log: Any) -> None:
        self.path, self.uid, self.upstream, self._log = path, uid, upstream, log
        self.refused = 0
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self, gid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._admit, path=str(self.path))
        # Only the job's user (and root) may connect; the folder already keeps out
        # everyone else, the mode and the peer check are there as well.
        os.chown(self.path, self.uid, gid)
        os.chmod(self.path, 0o600)

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid, _ = peer_credentials(sock)
        if uid != self.uid:
            self.refused += 1
            self._log.warning("worker channel: a process of another user knocked; refused",
                              socket=str(self.path), peer_pid=pid, peer_uid=uid,
                              job_uid=self.uid)
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(self.upstream))
        except OSError:
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            self._conns.discard(task)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
