"""TLS, mutual TLS for agents, bearer tokens and tenant isolation (docs/security.md)."""

from __future__ import annotations

import asyncio
import datetime
import os
import stat
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sia_grpc.api import AgentServiceStub, ClusterServiceStub, PolicyServiceStub, pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client.sdk import AsyncSiaClient, SiaClient
from sia_grpc.controller.config import ConfigError, ControllerConfig, load_config
from sia_grpc.controller.shell.server import Controller
from sia_grpc.nodeagent import AgentConfig, NodeAgent
from sia_grpc.security.auth import PeerCert
from sia_grpc.security.tls import channel_credentials, is_loopback
from sia_grpc.security.tokens import (
    TokenError,
    TokenStore,
    add_token,
    hash_token,
    list_tokens,
    revoke_token,
)

BASE = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                        early_round_delay=5.0, heartbeat_interval=30.0,
                        heartbeat_timeout=240.0, inline_solver=True)
pytestmark = pytest.mark.timeout(60)


def spec(tenant: str = "", app: str = "ncf") -> pb.JobSpec:
    return pb.JobSpec(name=app, application=app, adaptivity=pb.ADAPTIVITY_ADAPTIVE,
                      tenant=tenant)


def client(c: Controller, pki, token: str | None = None, **kw) -> AsyncSiaClient:
    return AsyncSiaClient(f"127.0.0.1:{c.port}", ca=pki["ca.crt"], token=token,
                          read_retries=0, timeout=5, **kw)


def register(node_id: str) -> pb.AgentMessage:
    return pb.AgentMessage(register=pb.Register(
        node_id=node_id, gpus=[pb.GpuInventory(gpu_type="rtx", count=8)], agent_version="t"))


async def connect(target: str, creds: grpc.ChannelCredentials, node_id: str):
    """Open AgentService.Connect, send Register, return the first reply (or raise)."""
    async with grpc.aio.secure_channel(target, creds) as ch:
        call = AgentServiceStub(ch).Connect(timeout=5)
        await call.write(register(node_id))
        first = await call.read()
        call.cancel()
        return first


# -- TLS ---------------------------------------------------------------------------------


async def test_tls_client_works_and_plaintext_client_fails(controller, pki, tokens):
    async with client(controller, pki, tokens.a) as sia:
        job = await (await sia.submit(spec())).job()
        assert job.spec.tenant == "team-a"
        assert (await sia.cluster()).policy == "sia"
    async with AsyncSiaClient(f"127.0.0.1:{controller.port}", token=tokens.a,
                              read_retries=0, timeout=3) as plain:
        with pytest.raises(ApiError) as err:
            await plain.get(job.job_id)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE


async def test_client_that_does_not_trust_the_ca_fails(controller, pki, tokens):
    async with AsyncSiaClient(f"127.0.0.1:{controller.port}", ca=str(pki.other / "ca.crt"),
                              token=tokens.a, read_retries=0, timeout=3) as sia:
        with pytest.raises(ApiError) as err:
            await sia.cluster()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE


async def test_sync_client_over_tls(controller, pki, tokens):
    def work() -> str:
        with SiaClient(f"127.0.0.1:{controller.port}", ca=pki["ca.crt"], token=tokens.b,
                       read_retries=0) as sia:
            h = sia.submit(spec())
            return sia.get(h.job_id).spec.tenant
    assert await asyncio.to_thread(work) == "team-b"


# -- agents: mutual TLS ------------------------------------------------------------------


async def test_agent_with_its_certificate_registers(controller, pki):
    assert controller.agent_port and controller.agent_port != controller.port
    cfg = AgentConfig(node_id="node-1", controller=f"127.0.0.1:{controller.agent_port}",
                      gpu_type="rtx", num_gpus=8, backoff_base_s=0.05, backoff_cap_s=0.2,
                      close_grace_s=0.2, tls_ca=pki["ca.crt"],
                      tls_cert=pki["agent-node-1.crt"], tls_key=pki["agent-node-1.key"])
    async with NodeAgent(cfg):
        async with asyncio.timeout(10):
            while "node-1" not in controller.agents:
                await asyncio.sleep(0.02)


async def test_agent_without_client_certificate_is_unauthenticated(controller, pki):
    creds = channel_credentials(pki["ca.crt"])  # TLS, but no client certificate
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await connect(f"127.0.0.1:{controller.port}", creds, "node-1")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "client certificate" in err.value.details()
    assert str(controller.agent_port) in err.value.details()  # says where to go instead
    assert not controller.agents
    # On the agent port the handshake itself demands a certificate.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await connect(f"127.0.0.1:{controller.agent_port}", creds, "node-1")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_agent_certificate_from_another_ca_fails_the_handshake(controller, pki):
    creds = channel_credentials(pki["ca.crt"], pki.other / "agent-node-1.crt",
                                pki.other / "agent-node-1.key")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await connect(f"127.0.0.1:{controller.agent_port}", creds, "node-1")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not controller.agents


async def test_agent_node_id_must_match_its_certificate_unless_admin(controller, pki):
    target = f"127.0.0.1:{controller.agent_port}"
    node2 = channel_credentials(pki["ca.crt"], pki["agent-node-2.crt"], pki["agent-node-2.key"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await connect(target, node2, "node-1")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "node-1" in err.value.details() and "node-2" in err.value.details()
    first = await connect(target, node2, "node-2")
    assert first.WhichOneof("kind") == "registered"
    admin = channel_credentials(pki["ca.crt"], pki["admin.crt"], pki["admin.key"])
    first = await connect(target, admin, "any-node-7")
    assert first.WhichOneof("kind") == "registered"


def test_peer_cert_wildcard_names():
    assert PeerCert("rtx-*", (), ("agent",)).matches("rtx-12")
    assert not PeerCert("rtx-*", (), ("agent",)).matches("aws-1")
    assert not PeerCert("*", (), ()).matches("x")  # any node: only an admin certificate
    assert PeerCert("n", ("node-a",), ()).matches("node-a")
    assert PeerCert("admin", (), ("admin",)).matches("anything")


# -- tokens and tenants ------------------------------------------------------------------


async def test_missing_bad_or_malformed_token_is_unauthenticated(controller, pki, tokens):
    for token in (None, "not-a-real-token"):
        async with client(controller, pki, token) as sia:
            for call in (sia.cluster(), sia.get("x"), sia.submit(spec())):
                with pytest.raises(ApiError) as err:
                    await call
                assert err.value.code == grpc.StatusCode.UNAUTHENTICATED, token
                assert "token" in err.value.message
    async with grpc.aio.secure_channel(f"127.0.0.1:{controller.port}",
                                       channel_credentials(pki["ca.crt"])) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ClusterServiceStub(ch).GetCluster(
                pb.GetClusterRequest(), metadata=(("authorization", "Basic abc"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "Bearer" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:  # PolicyService: any token, not none
            await PolicyServiceStub(ch).Optimize(pb.OptimizeRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:  # a token: past the check
            await PolicyServiceStub(ch).Optimize(
                pb.OptimizeRequest(), metadata=(("authorization", f"Bearer {tokens.b}"),))
        assert err.value.code() != grpc.StatusCode.UNAUTHENTICATED
        # Health checks stay open (probes carry no token).
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_tenant_isolation(controller, pki, tokens):
    async with client(controller, pki, tokens.a) as a, client(controller, pki, tokens.b) as b, \
            client(controller, pki, tokens.admin) as admin:
        ja = (await a.submit(spec())).job_id
        jb = (await b.submit(spec("team-b"))).job_id
        # B neither sees nor touches A's job: NOT_FOUND, as for a job that does not exist.
        for call in (b.get(ja), b.cancel(ja), b.delete(ja)):
            with pytest.raises(ApiError) as err:
                await call
            assert err.value.code == grpc.StatusCode.NOT_FOUND
        assert [j.job_id async for j in b.list()] == [jb]
        assert [j.job_id async for j in a.list()] == [ja]
        with pytest.raises(ApiError) as err:
            _ = [j async for j in b.list(tenant="team-a")]
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        # A spec naming another tenant is refused.
        with pytest.raises(ApiError) as err:
            await b.submit(spec("team-a"))
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "spec.tenant" in err.value.message
        # The admin sees and cancels everything.
        assert {j.job_id async for j in admin.list()} == {ja, jb}
        assert (await admin.get(ja)).spec.tenant == "team-a"
        assert [j.job_id async for j in admin.list(tenant="team-b")] == [jb]
        await admin.cancel(jb)
        assert (await a.get(ja)).status.state != pb.JOB_STATE_CANCELLED
        await a.cancel(ja)  # its own: fine


async def test_job_ids_are_scoped_by_tenant_and_leak_nothing(controller, pki, tokens):
    """Two tenants may each name a job `train-1`; whether another tenant holds a name
    or a request id is never said (defect: CreateJob answered ALREADY_EXISTS for
    another tenant's id where GetJob said NOT_FOUND)."""
    async with client(controller, pki, tokens.a) as a, client(controller, pki, tokens.b) as b, \
            client(controller, pki, tokens.admin) as admin:
        ja = await a.submit(spec(), job_id="train-1", request_id="r-1")
        jb = await b.submit(spec("team-b"), job_id="train-1", request_id="r-1")
        assert (ja.job_id, jb.job_id) == ("team-a/train-1", "team-b/train-1")
        # A names its own job by its name or its full id.
        assert (await a.get("train-1")).job_id == (await a.get("team-a/train-1")).job_id
        # A repeat of A's own request is the same job; a new id under A's used name is
        # A's own conflict.
        assert (await a.submit(spec(), job_id="train-1", request_id="r-1")).job_id == ja.job_id
        with pytest.raises(ApiError) as err:
            await a.submit(spec(), job_id="train-1")
        assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
        # B asking for A's job by its full id hears exactly what it hears for a job that
        # never was.
        answers = []
        for job_id in ("team-a/train-1", "team-a/never-was"):
            with pytest.raises(ApiError) as err:
                await b.get(job_id)
            answers.append((err.value.code, err.value.message.replace(job_id, "ID")))
        assert answers[0] == answers[1] and answers[0][0] == grpc.StatusCode.NOT_FOUND
        # The admin sees both, and names either by its full id.
        assert {j.job_id async for j in admin.list()} == {ja.job_id, jb.job_id}
        assert (await admin.get("team-b/train-1")).spec.tenant == "team-b"
        await b.cancel("train-1")
        assert (await a.get("train-1")).status.state != pb.JOB_STATE_CANCELLED


async def test_the_cluster_view_hides_other_tenants_job_ids(controller, pki, tokens):
    """Regression (defect: `sia cluster` listed another tenant's job on its GPUs)."""
    ok = await connect(f"127.0.0.1:{controller.agent_port}", channel_credentials(
        pki["ca.crt"], pki["agent-node-1.crt"], pki["agent-node-1.key"]), "node-1")
    assert ok.WhichOneof("kind") == "registered"
    async with client(controller, pki, tokens.a) as a, client(controller, pki, tokens.b) as b, \
            client(controller, pki, tokens.admin) as admin:
        ja = (await a.submit(spec())).job_id
        jb = (await b.submit(spec("team-b"))).job_id
        holder = controller.state.nodes["node-1"].holder
        holder.update({0: ja, 1: jb})  # as a round would have placed them
        try:
            def gpus(cluster):
                (node,) = [n for n in cluster.nodes if n.name == "node-1"]
                return [g.job_id for g in node.gpus][:3]
            assert gpus(await a.cluster()) == [ja, "(other tenant)", ""]
            assert gpus(await b.cluster()) == ["(other tenant)", jb, ""]
            assert gpus(await admin.cluster()) == [ja, jb, ""]
        finally:
            holder.clear()


async def test_only_an_admin_may_drain_a_node(controller, pki, tokens):
    ok = await connect(f"127.0.0.1:{controller.agent_port}", channel_credentials(
        pki["ca.crt"], pki["agent-node-1.crt"], pki["agent-node-1.key"]), "node-1")
    assert ok.WhichOneof("kind") == "registered"
    async with client(controller, pki, tokens.a) as a, \
            client(controller, pki, tokens.admin) as admin:
        for call in (a.drain("node-1", "mine now"), a.undrain("node-1"),
                     a.forget_node("node-1")):
            with pytest.raises(ApiError) as err:
                await call
            assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert err.value.reason == "ADMIN_ONLY" and "only an admin" in err.value.message
        assert "node-1" not in controller.state.drained
        node = await admin.drain("node-1", "maintenance")
        assert node.state == pb.NODE_STATE_DRAINING
        assert controller.state.drained == {"node-1": "maintenance"}
        with pytest.raises(ApiError) as err:
            await admin.drain("node-1", "x" * 300)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == "reason"


async def test_watch_shows_only_the_callers_jobs(controller, pki, tokens):
    async with client(controller, pki, tokens.a) as a, client(controller, pki, tokens.b) as b:
        await a.submit(spec())
        seen: list[pb.JobEvent] = []

        async def watch() -> None:
            async for ev in b.watch():
                seen.append(ev)

        async def until_seen(job_id: str) -> None:
            async with asyncio.timeout(10):
                while not any(ev.job.job_id == job_id for ev in seen):
                    await asyncio.sleep(0.02)

        task = asyncio.create_task(watch())
        jb = (await b.submit(spec())).job_id
        await until_seen(jb)  # the watch is past its snapshot: a's next job is an event
        await a.submit(spec())
        # Events come in revision order: once b's later job is seen, a's was passed over.
        await until_seen((await b.submit(spec())).job_id)
        task.cancel()
        assert seen and {ev.job.spec.tenant for ev in seen} == {"team-b"}


async def test_token_rotation_without_restart(controller, pki, tokens):
    controller.tokens.check_every = 0.0  # the test does not wait out the once-a-second check
    async with client(controller, pki, tokens.a) as a:
        await a.cluster()
        # Revoke team-a by rewriting the file without its hash; add a new token.
        lines = tokens.file.read_text().split("\n\n")
        kept = [e for e in lines if hash_token(tokens.a) not in e]
        tokens.file.write_text("\n\n".join(kept))
        fresh = add_token(tokens.file, "team-a")
        with pytest.raises(ApiError) as err:
            await a.cluster()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    async with client(controller, pki, fresh) as a2:
        await a2.cluster()
    # A broken file keeps the tokens in force, and SIGHUP's reload says it failed.
    tokens.file.write_text("[[token]\nbroken")
    assert controller.reload_tokens() is False
    async with client(controller, pki, fresh) as a2:
        await a2.cluster()


async def test_tokens_list_and_revoke_and_the_revoked_token_is_refused_at_once(
        controller, pki, tokens, capsys):
    from sia_grpc.cli import main

    controller.tokens.check_every = 0.0  # "at once": on the next call, not a second later
    file = str(tokens.file)
    os.chmod(file, 0o640)
    ci = add_token(tokens.file, "team-a", name="ci")
    assert main(["tokens", "list", file]) == 0
    out = capsys.readouterr().out
    lines = [ln.split() for ln in out.splitlines()]
    assert lines[0] == ["ID", "NAME", "TENANT", "ROLE", "QUEUES", "CREATED"]
    assert [ln[1:4] for ln in lines[1:]] == [["-", "team-a", "user"], ["-", "team-b", "user"],
                                             ["operator", "ops", "admin"],
                                             ["ci", "team-a", "user"]]
    assert all(len(ln[0]) == 12 and ln[4] == "-" and ln[5].endswith("Z") for ln in lines[1:])
    for secret in (tokens.a, tokens.b, tokens.admin, ci):  # neither a token nor its hash
        assert secret not in out and hash_token(secret) not in out
    async with client(controller, pki, ci) as c, client(controller, pki, tokens.b) as b:
        await c.cluster()
        assert main(["tokens", "revoke", file, "ci"]) == 0
        assert "revoked token" in capsys.readouterr().out
        with pytest.raises(ApiError) as err:
            await c.cluster()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        await b.cluster()  # the others stay
        # By id (a prefix of the hash, as listed); the file keeps its mode.
        assert main(["tokens", "revoke", file, hash_token(tokens.b)[:8]]) == 0
        with pytest.raises(ApiError):
            await b.cluster()
    assert stat.S_IMODE(os.stat(file).st_mode) == 0o640
    assert main(["tokens", "revoke", file, "ci"]) == 2
    assert "no token named 'ci'" in capsys.readouterr().err
    add_token(tokens.file, "team-c", name="ops")
    add_token(tokens.file, "team-d", name="ops")
    assert main(["tokens", "revoke", file, "ops"]) == 2
    assert "2 tokens match 'ops'" in capsys.readouterr().err
    async with client(controller, pki, tokens.a) as a, client(controller, pki, tokens.admin) as o:
        await a.cluster()
        await o.cluster()


async def test_plaintext_loopback_with_tokens_uses_call_metadata(tokens):
    cfg = replace(BASE, tokens_file=str(tokens.file))
    async with Controller(cfg) as c:
        async with AsyncSiaClient(f"127.0.0.1:{c.port}", token=tokens.a, read_retries=0) as a:
            assert (await (await a.submit(spec())).job()).spec.tenant == "team-a"
        async with AsyncSiaClient(f"127.0.0.1:{c.port}", read_retries=0) as anon:
            with pytest.raises(ApiError) as err:
                await anon.cluster()
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_no_tokens_file_is_an_anonymous_admin(pki):
    async with Controller(BASE) as c, AsyncSiaClient(f"127.0.0.1:{c.port}") as sia:
        job = await (await sia.submit(spec("team-z"))).job()
        assert job.spec.tenant == "team-z"
        assert [j.job_id async for j in sia.list()] == [job.job_id]


# -- configuration and files -------------------------------------------------------------


@pytest.mark.parametrize(("listen", "loopback"), [
    ("127.0.0.1:1", True), ("127.9.9.9:1", True), ("[::1]:1", True), ("localhost:1", True),
    ("0.0.0.0:1", False), ("[::]:1", False), ("10.0.0.5:1", False), (":1", False),
    ("controller.example:1", False)])
def test_is_loopback(listen, loopback):
    assert is_loopback(listen) is loopback


def test_non_loopback_listen_needs_tls_and_tokens(pki, tokens):
    with pytest.raises(ConfigError, match="tls_cert: listen 0.0.0.0:50051 is not a loopback"):
        ControllerConfig(listen="0.0.0.0:50051")
    with pytest.raises(ConfigError, match="^tokens_file:"):
        ControllerConfig(listen="0.0.0.0:50051", tls_cert=pki["controller.crt"],
                         tls_key=pki["controller.key"])
    with pytest.raises(ConfigError, match="^tls_key:"):
        ControllerConfig(tls_cert=pki["controller.crt"])
    with pytest.raises(ConfigError, match="^tls_client_ca:"):
        ControllerConfig(tls_client_ca=pki["ca.crt"])
    assert ControllerConfig(listen="0.0.0.0:50051", allow_insecure=True).allow_insecure
    cfg = load_config(None, env={"SIA_TLS_CERT": pki["controller.crt"],
                                 "SIA_TLS_KEY": pki["controller.key"],
                                 "SIA_TLS_CLIENT_CA": pki["ca.crt"],
                                 "SIA_TOKENS_FILE": str(tokens.file)},
                      listen="0.0.0.0:50051")
    assert cfg.tls and cfg.agent_address == "0.0.0.0:50052"


def test_sia_controller_refuses_plaintext_on_all_interfaces(capsys):
    from sia_grpc.controller.__main__ import main

    assert main(["--listen", "0.0.0.0:50051", "--db", ":memory:"]) == 2
    assert "allow_insecure" in capsys.readouterr().err


async def test_unreadable_certificate_is_a_config_error(tmp_path, pki):
    cfg = replace(BASE, tls_cert=str(tmp_path / "missing.crt"), tls_key=pki["controller.key"])
    with pytest.raises(ConfigError, match="tls_cert: cannot read"):
        await Controller(cfg).start()


def test_tokens_file_stores_only_hashes(tmp_path):
    f = tmp_path / "t.toml"
    token = add_token(f, "team-a", admin=True, name="ci")
    text = f.read_text()
    assert token not in text and hash_token(token) in text
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    store = TokenStore(f)
    p = store.lookup(token)
    assert p is not None and p.tenant == "team-a" and p.admin and p.name == "ci"
    assert store.lookup(token + "x") is None
    with pytest.raises(ValueError, match="tenant"):
        add_token(f, "Not A Tenant!")


def test_revoking_keeps_the_rest_of_the_file_as_it_was(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("# tokens for the lab cluster\n\n"
                 f'[[token]]\nsha256 = "{hash_token("old")}"\ntenant = "legacy"  # no name\n\n')
    when = datetime.datetime(2026, 1, 5, 9, 30, 7, 123, tzinfo=datetime.UTC)
    ci = add_token(f, "team-a", name="ci", now=when)
    add_token(f, "team-b", name="nightly", now=when)
    before = f.read_text()
    assert [(t.name, t.tenant, t.created) for t in list_tokens(f)] == [
        ("", "legacy", None), ("ci", "team-a", when.replace(microsecond=0)),
        ("nightly", "team-b", when.replace(microsecond=0))]
    (gone,) = revoke_token(f, "ci")
    assert (gone.name, gone.id) == ("ci", hash_token(ci)[:12])
    # Exactly its [[token]] table went (up to the next one); comments and others stay.
    ci_table = (f'[[token]]\nsha256 = "{hash_token(ci)}"\ntenant = "team-a"\nrole = "user"\n'
                'name = "ci"\ncreated = 2026-01-05T09:30:07Z\n\n')
    after = f.read_text()
    assert ci_table in before and after == before.replace(ci_table, "")
    assert [t.name for t in list_tokens(f)] == ["", "nightly"]
    f.write_text(after + '\n[[token]]\nsha256 = "' + "0" * 64 + '"\ntenant = "x"\n'
                 'created = "yesterday"\n')
    with pytest.raises(TokenError, match=r"token\[2\]\.created: expected a TOML date-time"):
        list_tokens(f)


def test_cert_keys_are_private(pki):
    for key in pki.dir.glob("*.key"):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600, key


def test_sia_certs_and_tokens_commands(tmp_path, capsys):
    from sia_grpc.cli import main

    d = tmp_path / "pki"
    assert main(["certs", "init", str(d), "--hosts", "ctl.example,10.0.0.5",
                 "--agents", "n1,n2"]) == 0
    assert {p.name for p in d.iterdir()} >= {"ca.crt", "ca.key", "controller.crt",
                                             "agent-n1.crt", "agent-n2.key", "admin.crt"}
    assert main(["certs", "issue", str(d), "--agent", "n3"]) == 0
    assert main(["certs", "issue", str(d), "--agent", "n3"]) == 2  # never overwritten
    assert "already exists" in capsys.readouterr().err
    assert main(["tokens", "add", "--file", str(tmp_path / "t.toml"), "--tenant", "a"]) == 0
    token = capsys.readouterr().out.strip()
    assert len(token) >= 43 and token not in (tmp_path / "t.toml").read_text()
    assert main(["tokens", "add", "--file", str(tmp_path / "t.toml"), "--tenant", "ops",
                 "--admin"]) == 0
    assert capsys.readouterr().err.startswith("added an admin token for tenant 'ops'")


def test_sia_certs_takes_names_separated_by_spaces_or_commas(tmp_path):
    """As `--agents $(kubectl get nodes ... -o jsonpath=...)` gives them (deploy/k8s)."""
    from cryptography import x509

    from sia_grpc.cli import main

    d = tmp_path / "pki"
    assert main(["certs", "init", str(d), "--hosts", "ctl.svc", "ctl.svc.local,10.0.0.5",
                 "--agents", "n1", "n2,n3"]) == 0
    assert {"agent-n1.crt", "agent-n2.crt", "agent-n3.crt"} <= {p.name for p in d.iterdir()}
    cert = x509.load_pem_x509_certificate((d / "controller.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"ctl.svc", "ctl.svc.local"} <= set(names.get_values_for_type(x509.DNSName))


async def test_sia_cli_with_ca_and_token_file(controller, pki, tokens, tmp_path, capsys):
    from sia_grpc.cli import main

    tf = tmp_path / "token"
    tf.write_text(tokens.a + "\n")
    base = ["--controller", f"127.0.0.1:{controller.port}", "--ca", pki["ca.crt"]]
    async with client(controller, pki, tokens.b) as b:
        jb = (await b.submit(spec())).job_id
    capsys.readouterr()  # the controller's log lines so far
    assert await asyncio.to_thread(main, ["ls", *base, "--token-file", str(tf)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no jobs"  # team-a sees none of b's
    assert await asyncio.to_thread(main, ["get", jb, *base, "--token-file", str(tf)]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["ls", *base]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_nodeagent_tls_flags_are_checked(tmp_path, pki, capsys):
    from sia_grpc.nodeagent.__main__ import main as agent_main

    base = ["--controller", "127.0.0.1:1", "--gpus", "rtx:8", "--node-id", "node-1"]
    assert agent_main([*base, "--tls-ca", str(tmp_path / "nope.crt")]) == 2
    assert "--tls-ca: cannot read" in capsys.readouterr().err
    assert agent_main([*base, "--tls-ca", pki["ca.crt"], "--tls-cert",
                       pki["agent-node-1.crt"]]) == 2
    assert "tls_key" in capsys.readouterr().err
