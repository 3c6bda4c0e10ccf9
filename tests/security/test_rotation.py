"""The controller re-reads its certificate, key and client CA when the files change:
new handshakes see the new files, no restart (docs/operations.md, "Rotating")."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from sia_grpc.api import AgentServiceStub, pb
from sia_grpc.client.sdk import AsyncSiaClient
from sia_grpc.controller.config import ConfigError
from sia_grpc.controller.shell.server import Controller
from sia_grpc.security.certs import init_dev_pki, issue
from sia_grpc.security.tls import channel_credentials

pytestmark = pytest.mark.timeout(60)
_fresh = 0


def install(src: Path | bytes, dst: Path) -> None:
    """Replace `dst` the way deploy tools do: write aside, rename over (new inode)."""
    tmp = dst.with_name(dst.name + ".new")
    if isinstance(src, bytes):
        tmp.write_bytes(src)
    else:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def fresh() -> list[tuple[str, int]]:
    """Channel options that force a new connection, hence a new TLS handshake."""
    global _fresh
    _fresh += 1
    return [("grpc.use_local_subchannel_pool", 1), ("sia.test.fresh", _fresh)]


async def serves(port: int, ca: Path) -> bool:
    """Whether a new TLS connection trusting only `ca` gets a health answer."""
    creds = channel_credentials(ca)
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=fresh()) as ch:
        try:
            reply = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def registers(port: int, ca: Path, pki_dir: Path, node: str) -> bool:
    """Whether an agent certificate from `pki_dir` passes the agent port's handshake."""
    creds = channel_credentials(ca, pki_dir / f"agent-{node}.crt", pki_dir / f"agent-{node}.key")
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=fresh()) as ch:
        call = AgentServiceStub(ch).Connect(timeout=5)
        try:
            await call.write(pb.AgentMessage(register=pb.Register(
                node_id=node, gpus=[pb.GpuInventory(gpu_type="rtx", count=8)],
                agent_version="t")))
            first = await call.read()
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return False
        finally:
            call.cancel()
    return first.WhichOneof("kind") == "registered"


@pytest.fixture
def live(tmp_path, pki) -> Path:
    """The controller's files in a directory the tests may overwrite."""
    d = tmp_path / "live"
    d.mkdir()
    for name in ("controller.crt", "controller.key", "ca.crt"):
        shutil.copyfile(pki.dir / name, d / name)
    return d


@pytest.fixture
def new_pki(tmp_path) -> Path:
    """A second CA with a controller certificate and an agent certificate for node-9."""
    d = tmp_path / "new-pki"
    init_dev_pki(d, agents=["node-9"])
    return d


@pytest.fixture
async def controller(secure_config, live):
    cfg = replace(secure_config, tls_cert=str(live / "controller.crt"),
                  tls_key=str(live / "controller.key"), tls_client_ca=str(live / "ca.crt"))
    async with Controller(cfg) as c:
        yield c


def serial(cert: Path) -> int:
    return x509.load_pem_x509_certificate(cert.read_bytes()).serial_number


async def test_new_server_certificate_is_served_without_restart(controller, pki, new_pki,
                                                                live, tokens):
    old_ca, new_ca = pki.dir / "ca.crt", new_pki / "ca.crt"
    assert await serves(controller.port, old_ca)
    assert not await serves(controller.port, new_ca)
    assert serial(new_pki / "controller.crt") != serial(live / "controller.crt")
    before = AsyncSiaClient(f"127.0.0.1:{controller.port}", ca=str(old_ca), token=tokens.a,
                            read_retries=0, timeout=5)
    async with before:
        await before.cluster()  # connected, with the old certificate
        with capture_logs() as logs:
            install(new_pki / "controller.key", live / "controller.key")
            install(new_pki / "controller.crt", live / "controller.crt")
            assert await serves(controller.port, new_ca)
        assert not await serves(controller.port, old_ca)
        await before.cluster()  # an open connection keeps its session
    # Both ports: the agent port presents the new server certificate too (node-1's
    # client certificate is still from the old CA, which tls_client_ca still holds).
    assert await registers(controller.agent_port, new_ca, pki.dir, "node-1")
    assert not await registers(controller.agent_port, old_ca, pki.dir, "node-1")
    reloaded = [e for e in logs if e["event"] == "TLS certificates reloaded"]
    assert len(reloaded) == 1  # once, not once per port or handshake
    assert reloaded[0]["tls_cert"] == str(live / "controller.crt")
    expiry = x509.load_pem_x509_certificate((new_pki / "controller.crt").read_bytes())
    assert reloaded[0]["expires"] == expiry.not_valid_after_utc.isoformat()
    async with AsyncSiaClient(f"127.0.0.1:{controller.port}", ca=str(new_ca),
                              token=tokens.a, read_retries=0, timeout=5) as sia:
        assert (await sia.cluster()).policy == "sia"


async def test_client_ca_rotation_admits_agents_of_the_new_ca(controller, pki, new_pki, live):
    old_ca = pki.dir / "ca.crt"
    assert await registers(controller.agent_port, old_ca, pki.dir, "node-1")
    assert not await registers(controller.agent_port, old_ca, new_pki, "node-9")
    bundle = old_ca.read_bytes() + (new_pki / "ca.crt").read_bytes()
    install(bundle, live / "ca.crt")
    assert await registers(controller.agent_port, old_ca, new_pki, "node-9")
    assert await registers(controller.agent_port, old_ca, pki.dir, "node-1")  # old CA too
    # Dropping the old CA from the bundle then shuts out the old agent certificates.
    install(new_pki / "ca.crt", live / "ca.crt")
    assert not await registers(controller.agent_port, old_ca, pki.dir, "node-1")
    assert await registers(controller.agent_port, old_ca, new_pki, "node-9")
    assert await serves(controller.port, old_ca)  # the client port is unaffected


@pytest.mark.parametrize("breakage", ["garbage", "mismatched key", "missing"])
async def test_a_bad_rotation_keeps_the_last_good_certificate(controller, pki, new_pki, live,
                                                              breakage):
    old_ca = pki.dir / "ca.crt"
    with capture_logs() as logs:
        if breakage == "garbage":
            install(b"-----BEGIN CERTIFICATE-----\nnot base64\n", live / "controller.crt")
        elif breakage == "mismatched key":  # a new certificate, but the old key
            install(new_pki / "controller.crt", live / "controller.crt")
        else:
            (live / "controller.key").unlink()
        for _ in range(2):  # the warning is logged once per change, not per handshake
            assert await serves(controller.port, old_ca)
            assert not await serves(controller.port, new_pki / "ca.crt")
        assert await registers(controller.agent_port, old_ca, pki.dir, "node-1")
    warnings = [e for e in logs if e["event"].startswith("TLS certificates not reloaded")]
    assert len(warnings) == 1, logs
    assert warnings[0]["log_level"] == "warning"
    assert not [e for e in logs if e["event"] == "TLS certificates reloaded"]
    # Fixing the files then takes effect on the next connection.
    install(new_pki / "controller.key", live / "controller.key")
    install(new_pki / "controller.crt", live / "controller.crt")
    assert await serves(controller.port, new_pki / "ca.crt")


async def test_rewriting_the_same_files_reloads_nothing(controller, pki, live):
    with capture_logs() as logs:
        os.utime(live / "controller.crt", ns=(1, 1))
        assert await serves(controller.port, pki.dir / "ca.crt")
    assert not [e for e in logs if e["event"].startswith("TLS certificates")]


async def test_a_key_that_does_not_match_at_startup_is_a_config_error(secure_config, pki,
                                                                      new_pki):
    cfg = replace(secure_config, tls_key=str(new_pki / "controller.key"))
    with pytest.raises(ConfigError, match="tls_key: does not match"):
        await Controller(cfg).start()


async def test_new_certificate_from_the_same_ca(controller, pki, live, tmp_path):
    """The everyday case: `sia certs issue --controller --force` with the same CA."""
    same = tmp_path / "same-ca"
    same.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copyfile(pki.dir / name, same / name)
    issued = issue(same, "controller", "sia-controller")
    with capture_logs() as logs:
        install(issued.key, live / "controller.key")
        install(issued.cert, live / "controller.crt")
        assert await serves(controller.port, pki.dir / "ca.crt")
    assert [e for e in logs if e["event"] == "TLS certificates reloaded"]
