"""A PostgreSQL store whose connection is blackholed (packets dropped, no RST, no
FIN: a pulled cable) fails its call in seconds instead of hanging: the store sets
libpq's keepalives and tcp_user_timeout.

The store runs in a network namespace and reaches the database through a TcpProxy
in the root namespace; the partition takes the namespace's link down
(tests/chaos/netns.py). A proxy that only holds the bytes back (TcpProxy.partition)
would not do: its kernel still acknowledges them, so TCP sees a live peer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest
from netns import Netns, NetnsUnavailable

from sia_grpc.testing.tcpproxy import TcpProxy

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(120)]

# In the namespace: open the store, say so, and on a line from stdin read the lease.
_CALL = """
import sys, time
from sia_grpc.controller.stores.postgres import PostgresStore
from sia_grpc.controller.stores.contract import StoreError
store = PostgresStore(sys.argv[1], pool_size=1)
store.leader()
print("ready", flush=True)
sys.stdin.readline()
try:
    store.leader()
except StoreError as e:
    print("StoreError", e, flush=True)
else:
    print("answered", flush=True)
"""


async def test_a_blackholed_connection_fails_within_seconds(postgres_dsn):
    try:
        net = Netns.create(["d"])
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    proxy = None
    try:
        parts = urlsplit(postgres_dsn)
        proxy = await TcpProxy.start("127.0.0.1", parts.port, listen=net.controller_ip)
        dsn = urlunsplit(parts._replace(
            netloc=f"{parts.netloc.rpartition('@')[0]}@{net.controller_ip}:{proxy.port}"))
        with subprocess.Popen(net.exec_argv("d", [sys.executable, "-c", _CALL, dsn]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            try:
                line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
                assert line.strip() == "ready", line + proc.stderr.read()
                net.partition("d")
                proc.stdin.write("go\n")
                proc.stdin.flush()
                # Without keepalives and tcp_user_timeout this waits for TCP's
                # retransmissions to give up (~15 minutes): TimeoutError here.
                out = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            finally:
                proc.kill()  # (which also ends a read still waiting)
            assert out.startswith("StoreError"), out
    finally:
        if proxy is not None:
            await proxy.close()
        net.close()
