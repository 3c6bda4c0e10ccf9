"""The controller pair as the HA overlays deploy it (components/ha): the rendered
Deployment's arguments, environment, Secret and ConfigMap make a valid controller
on PostgreSQL that advertises its pod IP; and its probes, run as the kubelet runs
them against a real leader and standby, keep the standby alive but not Ready."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from deploy_common import (
    DEPLOY,
    OVERLAYS,
    controller_parser,
    expand_k8s,
    one,
    parse,
    pod_spec,
    uses_ha,
)
from test_healthcheck import run_probe
from test_manifests import controller_container, render

from sia_grpc.controller.config import ControllerConfig, load_config
from sia_grpc.controller.shell.server import Controller
from sia_grpc.controller.stores import is_postgres

HA_OVERLAYS = [o for o in OVERLAYS if uses_ha(o)]
POD_IP = "10.4.2.7"  # stands in for $(POD_IP)


def test_the_ha_overlays_are_the_dev_and_production_pair() -> None:
    assert sorted(o.name for o in HA_OVERLAYS) == ["dev", "production-ha"]


def secret_data(docs: list[dict[str, Any]], name: str) -> dict[str, str] | None:
    """A Secret the overlay generates (dev), decoded; None where you create it."""
    found = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    return {k: base64.b64decode(v).decode() for k, v in found[0]["data"].items()} \
        if found else None


def store_secret(docs: list[dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    ref = next(e for e in c["env"] if e["name"] == "SIA_STORE")["valueFrom"]["secretKeyRef"]
    # production-ha: the Secret of deploy/k8s/README.md §3b, with an example DSN.
    return secret_data(docs, ref["name"]) or {
        "dsn": "postgresql://sia@db.example.com:5432/sia?sslmode=verify-full",
        "password": "example"}


def pod_config(docs: list[dict[str, Any]], tmp_path: Path) -> ControllerConfig:
    """The controller's settings in a pod of this overlay: its ConfigMap's file, its
    environment (the Secret's DSN, the password file), its arguments."""
    c = controller_container(docs)
    secret = store_secret(docs, c)
    password = tmp_path / "password"
    password.write_text(secret["password"] + "\n")
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env.update(SIA_STORE=secret["dsn"], POD_IP=POD_IP,
               SIA_STORE_PASSWORD_FILE=str(password))
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    toml = tmp_path / "controller.toml"
    toml.write_text(config_map["data"]["controller.toml"])
    ns = parse(controller_parser(), expand_k8s(c["args"], env))
    overrides = {k: v for k, v in vars(ns).items()
                 if k in ControllerConfig.__dataclass_fields__ and k != "config"}
    return load_config(toml, env={k: v for k, v in env.items() if k.startswith("SIA_")},
                       **overrides)


@pytest.mark.parametrize("overlay", HA_OVERLAYS, ids=lambda p: p.name)
def test_a_pod_of_the_pair_is_a_valid_controller_on_postgres(overlay: Path,
                                                            tmp_path: Path) -> None:
    docs = render(overlay)
    config = pod_config(docs, tmp_path)
    assert is_postgres(config.store_target)
    assert config.store_password() == store_secret(docs, controller_container(docs))["password"]
    assert config.advertise == f"{POD_IP}:{config.listen.rsplit(':', 1)[1]}"
    assert config.tls and config.tokens_file


def test_the_dev_postgres_is_what_the_dsn_names() -> None:
    docs = render(next(o for o in HA_OVERLAYS if o.name == "dev"))
    c = controller_container(docs)
    secret = store_secret(docs, c)
    dsn = urlsplit(secret["dsn"])
    service = one(docs, "Service", "sia-postgres")
    assert dsn.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert dsn.port == service["spec"]["ports"][0]["port"]
    (pg,) = pod_spec(one(docs, "StatefulSet", "sia-postgres"))["containers"]
    env = {e["name"]: e for e in pg["env"]}
    assert env["POSTGRES_USER"]["value"] == dsn.username and dsn.password is None
    assert env["POSTGRES_DB"]["value"] == dsn.path.lstrip("/")
    ref = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    controller_ref = next(e for e in c["env"] if e["name"] == "SIA_STORE")
    assert ref == {"name": controller_ref["valueFrom"]["secretKeyRef"]["name"],
                   "key": "password"}


# ---------------------------------------------------------------- the probes, live


@contextlib.asynccontextmanager
async def tls_pair(dsn: str, pki: Path):
    base = tomllib.loads((DEPLOY / "k8s" / "base" / "controller.toml").read_text())
    settings = dict(base["controller"], listen="127.0.0.1:0", inline_solver=True,
                    store=dsn, lease_ttl_s=1.5, metrics_listen="",
                    checkpoint_root=str(pki / "ckpt"), tls_cert=str(pki / "controller.crt"),
                    tls_key=str(pki / "controller.key"), tls_client_ca=str(pki / "ca.crt"))
    pair = [Controller(ControllerConfig(**settings)) for _ in range(2)]
    try:
        for c in pair:
            await c.start()
        yield pair
    finally:
        for c in pair:
            await c.close(grace=0)


async def test_the_standby_is_alive_but_not_ready(postgres_dsn: str, tmp_path: Path) -> None:
    from sia_grpc.security.certs import init_dev_pki

    pki = tmp_path / "pki"
    init_dev_pki(pki, hosts=["sia-controller.sia-system.svc"], agents=["gpu-node-7"])
    c = controller_container(render(next(o for o in HA_OVERLAYS if o.name == "production-ha")))

    def probe(kind: str, port: int) -> list[str]:
        return [a.replace("/etc/sia/tls/ca.crt", str(pki / "ca.crt"))
                 .replace(":50051", f":{port}") for a in c[kind]["exec"]["command"][1:]]

    async with tls_pair(postgres_dsn, pki) as (a, b):
        deadline = time.monotonic() + 20
        while not (a.leading or b.leading) or not (a.leader_address or b.leader_address):
            assert time.monotonic() < deadline, "no leader"
            await asyncio.sleep(0.01)
        leader, standby = (a, b) if a.leading else (b, a)
        assert await run_probe(probe("readinessProbe", leader.port)) == (0, "")
        assert await run_probe(probe("livenessProbe", leader.port)) == (0, "")
        code, out = await run_probe(probe("readinessProbe", standby.port))
        assert code == 1 and "NOT_SERVING" in out  # not Ready: the Service skips it
        assert await run_probe(probe("livenessProbe", standby.port)) == (0, "")  # alive
        port = standby.port
    # Neither answers once stopped: liveness fails too (a hung process is restarted).
    code, out = await run_probe(probe("livenessProbe", port))
    assert code == 1 and "UNAVAILABLE" in out
