"""The test harness's ports (sia_grpc.testing.ports)."""

from __future__ import annotations

import errno
import socket

import pytest

from sia_grpc.testing.ports import free_port, started_record


def test_a_free_port_is_kept_from_other_binds_but_a_server_can_take_it():
    port = free_port()
    # Held in TIME_WAIT: a plain bind (what bind(port 0) would need) is refused...
    with socket.socket() as plain, pytest.raises(OSError) as err:
        plain.bind(("127.0.0.1", port))
    assert err.value.errno == errno.EADDRINUSE
    # ...while a server that sets SO_REUSEADDR, as gRPC and torch's TCPStore do, binds it.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()


def test_the_started_record_gives_the_bound_ports_and_keeps_the_lines_read():
    log = ['{"event": "telemetry"}\n',
           '{"event": "controller started", "port": 41234, "metrics_port": 41235}\n',
           '{"event": "controller stopped"}\n']
    seen: list[str] = []
    record = started_record(iter(log), seen)
    assert (record["port"], record["metrics_port"]) == (41234, 41235)
    assert seen == log[:2]
    with pytest.raises(AssertionError, match="exited before it started"):
        started_record(iter(log[:1]))
