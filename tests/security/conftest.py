"""A TLS controller with tokens, and the certificates for it, made by our own tooling."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.security.certs import init_dev_pki
from sia_grpc.security.tokens import add_token

BASE = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                        early_round_delay=5.0, heartbeat_interval=30.0,
                        heartbeat_timeout=240.0, inline_solver=True)


@dataclass
class Pki:
    dir: Path
    other: Path  # a second, unrelated CA with an agent certificate for node-1

    def __getitem__(self, name: str) -> str:
        return str(self.dir / name)


@dataclass
class Tokens:
    file: Path
    a: str  # tenant team-a
    b: str  # tenant team-b
    admin: str  # tenant ops, admin


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    init_dev_pki(d, hosts=["controller.test"], agents=["node-1", "node-2"])
    other = tmp_path_factory.mktemp("other-pki")
    init_dev_pki(other, agents=["node-1"])
    return Pki(d, other)


@pytest.fixture
def tokens(tmp_path) -> Tokens:
    f = tmp_path / "tokens.toml"
    return Tokens(f, add_token(f, "team-a"), add_token(f, "team-b"),
                  add_token(f, "ops", admin=True, name="operator"))


@pytest.fixture
def secure_config(pki, tokens) -> ControllerConfig:
    return replace(BASE, tls_cert=pki["controller.crt"], tls_key=pki["controller.key"],
                   tls_client_ca=pki["ca.crt"], tokens_file=str(tokens.file))


@pytest.fixture
async def controller(secure_config):
    async with Controller(secure_config) as c:
        yield c
