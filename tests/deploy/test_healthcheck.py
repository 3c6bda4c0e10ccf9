"""The controller's Kubernetes probe (deploy/docker/sia-healthcheck.py), run exactly as
the Deployment runs it, against a real controller started with the Deployment's
settings: over TLS with the certificate verified against the Service's name."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
from deploy_common import BASE, DEPLOY, base_resources, one, pod_spec

from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller

SCRIPT = DEPLOY / "docker" / "sia-healthcheck.py"


def probe_command(probe: str = "readinessProbe") -> list[str]:
    deploy = one(base_resources(), "Deployment", "sia-controller")
    (c,) = pod_spec(deploy)["containers"]
    return c[probe]["exec"]["command"]


async def run_probe(args: list[str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    return proc.returncode, out.decode()


def k8s_settings(tmp_path: Path) -> dict:
    settings = tomllib.loads((BASE / "controller.toml").read_text())["controller"]
    # Ephemeral ports for everything the pod binds (the file's 9464 for /metrics too:
    # two of these tests run at once under pytest-xdist).
    settings.update(listen="127.0.0.1:0", db_path=str(tmp_path / "sia.db"),
                    checkpoint_root=str(tmp_path / "ckpt"), inline_solver=True,
                    metrics_listen="127.0.0.1:0" if settings.get("metrics_listen") else "")
    return settings


async def test_probe_over_tls_as_in_the_deployment(tmp_path: Path) -> None:
    if "tls_cert" not in {f.name for f in fields(ControllerConfig)}:
        pytest.skip("the controller has no TLS settings yet (docs/security.md)")
    from sia_grpc.security.certs import init_dev_pki

    pki = tmp_path / "pki"
    init_dev_pki(pki, hosts=["sia-controller.sia-system.svc"], agents=["gpu-node-7"])
    config = ControllerConfig(**k8s_settings(tmp_path), tls_cert=str(pki / "controller.crt"),
                              tls_key=str(pki / "controller.key"),
                              tls_client_ca=str(pki / "ca.crt"))
    command = probe_command()
    assert command[0] == "sia-healthcheck"

    async with Controller(config) as controller:
        args = [a.replace("/etc/sia/tls/ca.crt", str(pki / "ca.crt"))
                 .replace(":50051", f":{controller.port}") for a in command[1:]]
        assert await run_probe(args) == (0, "")
        for probe in ("livenessProbe",):
            live = [a.replace("/etc/sia/tls/ca.crt", str(pki / "ca.crt"))
                     .replace(":50051", f":{controller.port}")
                    for a in probe_command(probe)[1:]]
            assert (await run_probe(live))[0] == 0
        # The check really verifies: plaintext, or a name not in the certificate, fail.
        plain = [a for a in args if not a.startswith(("--ca", "--server-name"))]
        assert (await run_probe(plain))[0] == 1
        wrong = [*args[:-1], "--server-name=someone-else.example.com"] \
            if args[-1].startswith("--server-name") else [*args, "--server-name=x.example"]
        code, out = await run_probe(wrong)
        assert code == 1 and "UNAVAILABLE" in out
    code, out = await run_probe(args)
    assert code == 1 and "UNAVAILABLE" in out


async def test_probe_plaintext_on_loopback(tmp_path: Path) -> None:
    config = ControllerConfig(**k8s_settings(tmp_path))
    async with Controller(config) as controller:
        assert await run_probe([f"--addr=127.0.0.1:{controller.port}"]) == (0, "")
        code, out = await run_probe([f"--addr=127.0.0.1:{controller.port}",
                                     "--service=no.such.Service"])
        assert code == 1 and "NOT_FOUND" in out
