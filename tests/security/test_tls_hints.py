"""TLS failures say what is wrong and the fix (docs/security.md, "When TLS fails"):
gRPC itself reports most as a bare UNAVAILABLE ("Socket closed"). All real TLS."""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sia_grpc.cli import main as sia
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.nodeagent import AgentConfig, AgentConfigError, AgentStatus, NodeAgent
from sia_grpc.security.tls import TlsProblem, probe_tls

pytestmark = pytest.mark.timeout(60)

BASE = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                        early_round_delay=5.0, heartbeat_interval=30.0,
                        heartbeat_timeout=240.0, inline_solver=True)


@pytest.fixture
async def plain():
    async with Controller(BASE) as c:
        yield c


def _agent(target: str, **tls) -> NodeAgent:
    return NodeAgent(AgentConfig(node_id="node-1", controller=target, gpu_type="rtx",
                                 num_gpus=8, backoff_base_s=0.05, backoff_cap_s=0.2,
                                 close_grace_s=0.2, **tls))


async def _fatal(agent: NodeAgent) -> str:
    """The agent gives up by itself (no retry can help): the error it ends with."""
    with pytest.raises(AgentConfigError) as err:
        async with asyncio.timeout(20):
            await agent.run()
    assert agent.status is AgentStatus.CLOSED and agent.registrations == 0
    return str(err.value)


async def _cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert await asyncio.to_thread(sia, [*argv]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


# -- the sia CLI -------------------------------------------------------------------------


async def test_cli_plaintext_against_a_tls_controller_says_pass_ca(controller, capsys):
    line = await _cli(capsys, "ls", "--controller", f"127.0.0.1:{controller.port}")
    assert line == (f"error: the controller at 127.0.0.1:{controller.port} speaks TLS and "
                    "this connection was plaintext: pass --ca FILE (or SIA_CA)")


async def test_cli_with_the_wrong_ca_names_the_file_and_the_signer(controller, pki, capsys):
    ca = str(pki.other / "ca.crt")
    line = await _cli(capsys, "ls", "--controller", f"127.0.0.1:{controller.port}", "--ca", ca)
    assert line == (f"error: the controller's certificate at 127.0.0.1:{controller.port} is "
                    f"not signed by the CA in {ca} (unable to get local issuer certificate): "
                    "give --ca the CA that signed it")


async def test_cli_tls_against_a_plaintext_controller_says_drop_ca(plain, pki, capsys):
    line = await _cli(capsys, "ls", "--controller", f"127.0.0.1:{plain.port}",
                      "--ca", pki["ca.crt"])
    assert line.startswith(f"error: the controller at 127.0.0.1:{plain.port} does not speak "
                           "TLS (it serves plaintext): drop --ca")


async def test_cli_dialling_a_name_the_certificate_does_not_list(secure_config, pki, capsys):
    # 127.0.0.2 is loopback too, but not among the certificate's names.
    async with Controller(replace(secure_config, listen="127.0.0.2:0")) as c:
        line = await _cli(capsys, "ls", "--controller", f"127.0.0.2:{c.port}",
                          "--ca", pki["ca.crt"])
    assert line.startswith(f"error: the controller's certificate at 127.0.0.2:{c.port} is "
                           "not for this host name (")
    assert line.endswith("reissue it with `sia certs issue DIR --controller --hosts HOST`")


def test_a_refused_expired_certificate_says_when_it_expired(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-1")])
    end = datetime.datetime(2020, 1, 2, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(end - datetime.timedelta(days=1)).not_valid_after(end)
            .sign(key, hashes.SHA256()))
    path = tmp_path / "old.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    hint = TlsProblem("cert-refused", "ctl:50052").hint(
        ca=None, cert=str(path), ca_flag="--tls-ca FILE", cert_flags="", issue="ISSUE")
    assert hint == (f"the controller at ctl:50052 refused the client certificate {path} "
                    "(expired on 2020-01-02): it must be signed by the controller's "
                    "--tls-client-ca; issue one with `ISSUE`")


async def test_cli_against_nothing_still_says_cannot_reach(capsys):
    line = await _cli(capsys, "ls", "--controller", "127.0.0.1:1")
    assert line == "error: cannot reach the controller at 127.0.0.1:1 (UNAVAILABLE)"


async def test_the_sia_process_prints_one_line_and_no_grpc_core_line(controller, pki):
    """gRPC core writes its own "Handshake failed" line to stderr unless told not to."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.cli", "ls", "--controller",
        f"127.0.0.1:{controller.port}", "--ca", str(pki.other / "ca.crt"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, err = await proc.communicate()
    assert proc.returncode == 1
    (line,) = err.decode().splitlines()
    assert line.startswith("error: the controller's certificate at ")


# -- probes ------------------------------------------------------------------------------


async def test_probe_finds_nothing_wrong_with_the_right_files(controller, pki):
    assert await asyncio.to_thread(probe_tls, f"127.0.0.1:{controller.port}",
                                   pki["ca.crt"]) is None
    assert await asyncio.to_thread(
        probe_tls, f"127.0.0.1:{controller.agent_port}", pki["ca.crt"],
        pki["agent-node-1.crt"], pki["agent-node-1.key"]) is None
    no_cert = await asyncio.to_thread(probe_tls, f"127.0.0.1:{controller.agent_port}",
                                      pki["ca.crt"])
    assert no_cert is not None and no_cert.kind == "cert-required"


# -- the node agent ----------------------------------------------------------------------


def test_agent_with_a_ca_but_no_client_certificate_is_refused_at_once(pki):
    with pytest.raises(ValueError, match=r"tls_cert, tls_key: an agent connecting with TLS "
                                         r"needs its client certificate .*`sia certs issue DIR "
                                         r"--agent node-1`"):
        AgentConfig(node_id="node-1", controller="127.0.0.1:1", gpu_type="rtx", num_gpus=8,
                    tls_ca=pki["ca.crt"])


async def test_agent_whose_certificate_the_controller_refuses_gives_up(controller, pki):
    cert = str(pki.other / "agent-node-1.crt")
    error = await _fatal(_agent(f"127.0.0.1:{controller.agent_port}", tls_ca=pki["ca.crt"],
                                tls_cert=cert, tls_key=str(pki.other / "agent-node-1.key")))
    assert error == (f"the controller at 127.0.0.1:{controller.agent_port} refused the client "
                     f"certificate {cert}: it must be signed by the controller's "
                     "--tls-client-ca; issue one with `sia certs issue DIR --agent node-1`")
    assert not controller.agents


async def test_plaintext_agent_against_a_tls_controller_gives_up(controller):
    error = await _fatal(_agent(f"127.0.0.1:{controller.agent_port}"))
    assert error == (f"the controller at 127.0.0.1:{controller.agent_port} speaks TLS and "
                     "this connection was plaintext: pass --tls-ca FILE")


async def test_agent_with_the_wrong_ca_gives_up(controller, pki):
    ca = str(pki.other / "ca.crt")
    error = await _fatal(_agent(f"127.0.0.1:{controller.agent_port}", tls_ca=ca,
                                tls_cert=str(pki.other / "agent-node-1.crt"),
                                tls_key=str(pki.other / "agent-node-1.key")))
    assert error.startswith(f"the controller's certificate at 127.0.0.1:"
                            f"{controller.agent_port} is not signed by the CA in {ca} ")


async def test_tls_agent_against_a_plaintext_controller_gives_up(plain, pki):
    error = await _fatal(_agent(f"127.0.0.1:{plain.port}", tls_ca=pki["ca.crt"],
                                tls_cert=pki["agent-node-1.crt"],
                                tls_key=pki["agent-node-1.key"]))
    assert error.startswith(f"the controller at 127.0.0.1:{plain.port} does not speak TLS")


async def test_agent_keeps_retrying_while_the_controller_is_down(pki):
    agent = _agent("127.0.0.1:1", tls_ca=pki["ca.crt"], tls_cert=pki["agent-node-1.crt"],
                   tls_key=pki["agent-node-1.key"])
    async with agent:
        async with asyncio.timeout(20):
            while agent.status is not AgentStatus.BACKOFF:
                await asyncio.sleep(0.01)
            while agent.status is AgentStatus.BACKOFF:  # and then tries again
                await asyncio.sleep(0.01)
        assert agent.fatal is None


async def test_sia_nodeagent_exits_2_naming_the_fix(controller, pki):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.nodeagent", "--controller",
        f"127.0.0.1:{controller.agent_port}", "--node-id", "node-1", "--gpus", "rtx:8",
        "--tls-ca", pki["ca.crt"], "--tls-cert", str(pki.other / "agent-node-1.crt"),
        "--tls-key", str(pki.other / "agent-node-1.key"), "--log-level", "critical",
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    async with asyncio.timeout(40):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    (line,) = err.decode().splitlines()
    assert line.startswith("sia nodeagent: the controller at ") and line.endswith(
        "issue one with `sia certs issue DIR --agent node-1`")


async def test_an_agent_registered_before_only_logs_a_later_tls_failure(controller, pki,
                                                                         tmp_path):
    """After a first registration the files were good: a later refusal (a renewal
    gone wrong) is logged with its fix and retried, not fatal: files are read again
    on every reconnect, so fixing them is enough."""
    cert, key = tmp_path / "agent.crt", tmp_path / "agent.key"
    cert.write_bytes((pki.dir / "agent-node-1.crt").read_bytes())
    key.write_bytes((pki.dir / "agent-node-1.key").read_bytes())
    agent = _agent(f"127.0.0.1:{controller.agent_port}", tls_ca=pki["ca.crt"],
                   tls_cert=str(cert), tls_key=str(key))
    async with agent:
        async with asyncio.timeout(20):
            while agent.registrations == 0:
                await asyncio.sleep(0.01)
        cert.write_bytes((pki.other / "agent-node-1.crt").read_bytes())
        key.write_bytes((pki.other / "agent-node-1.key").read_bytes())
        controller._agents["node-1"].outbox.put_nowait(None)  # the stream ends: reconnect
        async with asyncio.timeout(20):
            while "tls" not in agent._told:
                await asyncio.sleep(0.01)
        assert agent.fatal is None and agent.status is not AgentStatus.CLOSED
        cert.write_bytes((pki.dir / "agent-node-1.crt").read_bytes())  # fixed
        key.write_bytes((pki.dir / "agent-node-1.key").read_bytes())
        async with asyncio.timeout(20):
            while agent.registrations < 2:
                await asyncio.sleep(0.01)




def test_probing_a_server_that_resets_each_connection_at_once_leaves_nothing_open(
        monkeypatch):
    """A controller stopping resets the probe's connection as it is accepted. Before,
    when the reset came before the TLS wrap, the TLS socket wrapping it was left open
    (Python's wrap raised without closing it; the garbage collector found it: a
    ResourceWarning in CI); the probe owns its socket now."""
    import gc
    import socket
    import struct
    import threading
    import time

    from sia_grpc.security import tls

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    port = server.getsockname()[1]
    stop = threading.Event()

    def reset_all() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # RST

    connect = socket.create_connection

    def connected_then_reset(*args, **kw):
        sock = connect(*args, **kw)
        time.sleep(0.05)  # the reset arrives before the handshake begins
        return sock

    monkeypatch.setattr(tls.socket, "create_connection", connected_then_reset)
    thread = threading.Thread(target=reset_all, daemon=True)
    thread.start()
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    try:
        for _ in range(5):
            assert probe_tls(f"127.0.0.1:{port}") is None  # plaintext: nothing to say
        gc.collect()
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert [u.exc_value for u in unraisable] == []
