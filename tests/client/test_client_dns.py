"""One host name with several DNS records is several controller addresses
(`api/addresses.py`: `expand`; `client/failover.py`: `Targets`), and with TLS a
channel to a resolved or redirected IP verifies the certificate against the name
given. Real gRPC servers on ephemeral ports; a resolver injected where the test needs
records of its own, the real one (getaddrinfo) on `localhost`."""

from __future__ import annotations

import contextlib
import socket
from concurrent import futures

import grpc
import pytest

from sia_grpc.api import add_ClusterServiceServicer_to_server, add_JobServiceServicer_to_server
from sia_grpc.api.addresses import expand, normalize
from sia_grpc.api.addresses import resolve as dns_resolve
from sia_grpc.api.errors import ApiError
from sia_grpc.client import AsyncSiaClient, SiaClient
from sia_grpc.client.failover import Targets
from sia_grpc.nodeagent import AgentConfig
from sia_grpc.testing.tls import self_signed

LOOP = "127.0.0.1"


def records(table: dict[str, list[tuple[str, int]]], calls: list[str] | None = None):
    """A resolver answering from `table` (host -> records); unknown hosts fail as
    getaddrinfo does. `calls` collects the hosts asked."""
    def resolve(host: str, port: int) -> list[tuple[str, int]]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]
    return resolve


def refused_port() -> tuple[socket.socket, int]:
    """A port bound and not listening: a connection to it is refused at once (for as
    long as the socket is kept)."""
    sock = socket.socket()
    sock.bind((LOOP, 0))
    return sock, sock.getsockname()[1]


class Standby(grpc.GenericRpcHandler):
    """A standby controller: every call UNAVAILABLE, NOT_LEADER, naming `leader`."""

    def __init__(self, leader: str = "") -> None:
        self.leader, self.calls = leader, 0

    def service(self, details):
        def refuse(request, context):
            self.calls += 1
            context.abort_with_status(ApiError(
                grpc.StatusCode.UNAVAILABLE, "a standby", reason="NOT_LEADER",
                metadata={"leader": self.leader} if self.leader else {}).to_status())
        return grpc.unary_unary_rpc_method_handler(refuse)


@contextlib.contextmanager
def serving(handler, *, creds=None, v6: bool = False):
    """A gRPC server for `handler` (a Standby, or the fake controller) on an ephemeral
    port of 127.0.0.1, and of ::1 too with `v6`; yields the port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if isinstance(handler, Standby):
        server.add_generic_rpc_handlers((handler,))
    else:
        add_JobServiceServicer_to_server(handler, server)
        add_ClusterServiceServicer_to_server(handler, server)

    def bind(address: str) -> int:
        return (server.add_insecure_port(address) if creds is None
                else server.add_secure_port(address, creds))
    port = bind(f"{LOOP}:0")
    if v6:
        assert bind(f"[::1]:{port}") == port
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait(5)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


# -- which addresses a target is ------------------------------------------------------


def test_a_name_with_several_records_is_one_address_per_record_named_after_it():
    resolve = records({"ctl.test": [("10.0.0.1", 50051), ("fd00::2", 50051)]})
    found = expand(["ctl.test:50051"], resolve)
    assert found == {"10.0.0.1:50051": "ctl.test", "[fd00::2]:50051": "ctl.test"}
    targets = Targets("dns:///ctl.test:50051", None, resolve=resolve)
    assert not targets.several  # not resolved yet: the first call does that
    targets.refresh()
    assert targets.several and targets.current == "10.0.0.1:50051"


def test_ip_literals_schemes_one_record_and_unknown_names_are_dialled_as_given():
    calls: list[str] = []
    resolve = records({"one.test": [("10.0.0.1", 1)]}, calls)
    given = ["10.0.0.9:1", "[::1]:2", "unix:/run/sia.sock", "one.test:1", "gone.test:1", "ctl"]
    assert expand(given, resolve) == dict.fromkeys(given)
    assert calls == ["one.test", "gone.test"]  # no lookup for IPs, schemes, no port


@pytest.mark.parametrize("target, match", [
    ("dns://8.8.8.8/ctl.test:50051", "target: 'dns://8.8.8.8/ctl.test:50051': a DNS server"),
    ("xds:///sia-controller", "target: 'xds:///sia-controller': unsupported scheme"),
    ("https://ctl.test:50051", "unsupported scheme"),
])
def test_schemes_it_cannot_resolve_are_refused_naming_the_field(target, match):
    with pytest.raises(ValueError, match=match):
        SiaClient(target)
    with pytest.raises(ValueError, match="controller: .*" if "dns" not in target else
                       "controller: 'dns://"):
        AgentConfig(node_id="n", controller=target, gpu_type="rtx", num_gpus=1)
    assert normalize("dns:ctl.test:1") == normalize("dns:///ctl.test:1") == "ctl.test:1"


# -- a call over several records -------------------------------------------------------


def test_a_name_whose_first_record_is_a_standby_reaches_the_leader_behind_it(fake):
    # read_retries=0: one address would give up at once; two records are two addresses.
    standby = Standby()  # names no leader: the client moves to the next record
    with serving(standby) as s_port, serving(fake) as l_port:
        resolve = records({"ctl.test": [(LOOP, s_port), (LOOP, l_port)]})
        with SiaClient(f"ctl.test:{s_port}", read_retries=0, timeout=5, sleep=lambda s: None,
                       resolve=resolve) as sia:
            assert sia.cluster().policy == "sia"
            assert sia._targets.current == f"{LOOP}:{l_port}" and standby.calls == 1


def test_the_name_is_resolved_again_once_every_record_has_failed(fake):
    # The pods behind the name were replaced: both old records refuse; the new one serves.
    (a, a_port), (b, b_port) = refused_port(), refused_port()
    with a, b, serving(fake) as port:
        calls: list[str] = []
        table = {"ctl.test": [(LOOP, a_port), (LOOP, b_port)]}
        with SiaClient("ctl.test:50051", timeout=5, sleep=lambda s: None,
                       resolve=records(table, calls)) as sia:
            sia._targets.refresh()
            table["ctl.test"] = [(LOOP, b_port), (LOOP, port)]
            assert sia.cluster().policy == "sia"
            assert calls == ["ctl.test", "ctl.test"]
            assert sia._targets.addresses == [f"{LOOP}:{b_port}", f"{LOOP}:{port}"]


async def test_the_async_client_resolves_off_the_event_loop_and_follows_the_leader(fake):
    standby = Standby()
    with serving(standby) as s_port, serving(fake) as l_port:
        standby.leader = f"{LOOP}:{l_port}"
        resolve = records({"ctl.test": [(LOOP, s_port), ("127.0.0.2", s_port)]})
        async with AsyncSiaClient(f"ctl.test:{s_port}", read_retries=0, timeout=5,
                                  resolve=resolve) as sia:
            job = await sia.submit({"name": "j", "application": "cifar10"}, request_id="r")
            assert job.job_id and sia._targets.current == f"{LOOP}:{l_port}"
            assert sia._targets.several and standby.calls == 1


# -- TLS: the certificate names the host name, not the IPs ------------------------------


@pytest.fixture(scope="module")
def localhost_cert() -> tuple[bytes, bytes]:
    """A self-signed certificate for DNS:localhost only (no IP addresses): (cert, key)."""
    return self_signed("localhost")


@pytest.mark.parametrize("resolver", ["getaddrinfo", "two records"])
async def test_tls_to_a_record_and_to_the_leader_a_standby_names_verifies_the_name(
        fake, localhost_cert, resolver):
    cert, key = localhost_cert
    creds = grpc.ssl_server_credentials([(key, cert)])
    v6 = ipv6_loopback()
    standby = Standby()
    with serving(standby, creds=creds, v6=v6) as s_port, serving(fake, creds=creds) as l_port:
        # The standby names the leader by IP, as a pod advertises itself.
        standby.leader = f"{LOOP}:{l_port}"
        if resolver == "getaddrinfo":
            resolve = dns_resolve  # localhost: 127.0.0.1, and ::1 where it is listed
        else:
            sock, refused = refused_port()
            stack = [("::1", s_port)] if v6 else []
            resolve = records({"localhost": [(LOOP, refused), *stack, (LOOP, s_port)]})
        with sock if resolver != "getaddrinfo" else contextlib.nullcontext():
            async with AsyncSiaClient(f"localhost:{s_port}", ca=cert, timeout=5,
                                      resolve=resolve) as sia:
                assert (await sia.cluster()).policy == "sia"
                targets = sia._targets
                assert targets.current == f"{LOOP}:{l_port}"
                assert targets.names[targets.current] == "localhost"
                assert standby.calls == 1
                if resolver == "two records":
                    assert targets.several and set(targets.names.values()) == {"localhost"}
