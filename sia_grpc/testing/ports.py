"""Ports for tests and dev harnesses, safe when many run at once (pytest-xdist
workers, other test runs on the same machine).

First choice: listen on port 0 and read the port that was bound (`Controller.port`,
or a `sia-controller` process's "controller started" log line: `started_record`).
`free_port` is for when a port must be named before anything binds it: a process
that must come back on the same port after a restart, or torch's MASTER_PORT for
workers started together.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable

__all__ = ["free_port", "started_record"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on, kept from other tests for a while.

    Binding port 0 and closing the socket (the usual way) races: the kernel may hand
    the same port to the next bind(port 0) before our server binds it. Here the port
    is left with a connection in TIME_WAIT (the accepting side closes first), and
    for that minute the kernel gives it to no bind(port 0) and no outgoing
    connection; a server that sets SO_REUSEADDR (gRPC, sia-controller, torch's
    TCPStore) can still bind it explicitly.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.create_connection(address[:2]):
            accepted, _ = listener.accept()
            accepted.close()  # first: the TIME_WAIT is on our side, on this port
        return address[1]


def started_record(lines: Iterable[str], seen: list[str] | None = None) -> dict:
    """The "controller started" record of a `sia-controller --log-format json` log
    (read up to it, each line read appended to `seen`): its `port`, `agent_port` and
    `metrics_port` are the ones bound, so the process can be started on port 0.
    AssertionError if the log ends first."""
    seen = [] if seen is None else seen
    for line in lines:
        seen.append(line)
        if '"controller started"' in line:
            return json.loads(line)
    raise AssertionError("sia-controller exited before it started:\n" + "".join(seen[-20:]))
