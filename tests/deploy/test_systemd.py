"""deploy/systemd: the units parse, are hardened as docs/operations.md says, and
their ExecStart lines (with the example configuration) are accepted by the real
CLI parsers; the example controller.toml loads."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from deploy_common import (
    DEPLOY,
    SECURITY_FLAGS,
    SECURITY_SETTINGS,
    controller_parser,
    flags_in,
    missing_security_flags,
    nodeagent_parser,
    option_strings,
    parse,
    without_flags,
)

SYSTEMD = DEPLOY / "systemd"
UNITS = {"controller": SYSTEMD / "sia-controller.service",
         "nodeagent": SYSTEMD / "sia-nodeagent.service"}
HOST = "gpu-node-7"  # what %H expands to in the test


def unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # systemd keys are case-sensitive
    cp.read_string(path.read_text())
    return cp


def values(path: Path, key: str) -> list[str]:
    """Every value of a key that may repeat (configparser keeps only the last)."""
    return [line.split("=", 1)[1] for line in path.read_text().splitlines()
            if line.startswith(f"{key}=")]


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def exec_start(path: Path) -> list[str]:
    """ExecStart as systemd runs it: continuation lines joined, Environment= and the
    example EnvironmentFile applied, ${VAR} one word, $VAR split at whitespace."""
    env: dict[str, str] = {}
    for value in values(path, "Environment"):
        key, _, v = value.partition("=")
        env[key] = v.replace("%H", HOST)
    for value in values(path, "EnvironmentFile"):
        example = SYSTEMD / Path(value.lstrip("-")).name
        if example.exists():
            env.update(env_file(example))
    line = unit(path)["Service"]["ExecStart"].replace("\\\n", " ")
    words = []
    for word in shlex.split(line):
        if m := re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word):
            words += env.get(m[1], "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                                lambda m: env.get(m[1], ""), word))
    return words


@pytest.mark.parametrize("name", UNITS)
def test_unit_is_hardened(name: str) -> None:
    service = unit(UNITS[name])["Service"]
    assert service["User"] == "sia" or service.get("DynamicUser") == "yes"
    for key, value in {"NoNewPrivileges": "yes", "PrivateTmp": "yes",
                       "ProtectSystem": "strict", "Restart": "on-failure",
                       "KillSignal": "SIGTERM", "KillMode": "mixed",
                       "CapabilityBoundingSet": ""}.items():
        assert service.get(key) == value, f"{name}: {key}={service.get(key)!r}"
    assert "sia" in service["StateDirectory"].split()
    assert service.get("ProtectHome") in ("yes", "read-only")
    assert service["ExecStart"].split()[0].startswith("/opt/sia/bin/")


def test_controller_reload_sends_sighup() -> None:
    service = unit(UNITS["controller"])["Service"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"


def test_agent_stop_timeout_covers_checkpointing() -> None:
    service = unit(UNITS["nodeagent"])["Service"]
    ns = parse(nodeagent_parser(), _agent_args_without_missing_security())
    assert int(service["TimeoutStopSec"]) >= ns.stop_grace + 30
    # The checkpoint directory is writable despite ProtectSystem=strict, and mounted.
    assert str(ns.checkpoint_root) in service["ReadWritePaths"].split()
    assert str(ns.checkpoint_root) in unit(UNITS["nodeagent"])["Unit"]["RequiresMountsFor"]
    assert str(ns.workdir).startswith("/var/lib/sia/")


def _agent_args_without_missing_security() -> list[str]:
    p = nodeagent_parser()
    args = exec_start(UNITS["nodeagent"])[1:]
    return without_flags(args, missing_security_flags(p, args), p)


def test_controller_exec_start_parses() -> None:
    p = controller_parser()
    args = exec_start(UNITS["controller"])[1:]
    ns = parse(p, without_flags(args, missing_security_flags(p, args), p))
    assert ns.config == "/etc/sia/controller.toml" and ns.log_format == "json"


def test_agent_exec_start_parses() -> None:
    from sia_grpc.nodeagent.__main__ import _check_args

    p = nodeagent_parser()
    ns = parse(p, _agent_args_without_missing_security())
    try:
        _check_args(p, ns)
    except SystemExit:
        pytest.fail("sia-nodeagent rejects the unit's arguments")
    assert ns.node_id == HOST and ns.backend == "torch"
    assert ns.controller.endswith(":50052")  # the controller's mutual-TLS agent port


@pytest.mark.parametrize("name", UNITS)
def test_exec_start_flags_exist(name: str) -> None:
    parser = controller_parser() if name == "controller" else nodeagent_parser()
    flags = set(flags_in(exec_start(UNITS[name])[1:]))
    missing = flags - option_strings(parser)
    assert not missing - SECURITY_FLAGS, f"{parser.prog} has no {sorted(missing)}"
    if missing:
        pytest.skip(f"security flags {sorted(missing)} are not in {parser.prog} yet "
                    "(added with docs/security.md)")


def test_example_controller_toml_loads() -> None:
    from sia_grpc.controller.config import ControllerConfig, load_config

    settings = tomllib.loads((SYSTEMD / "controller.toml").read_text())["controller"]
    fields = set(ControllerConfig.__dataclass_fields__)
    assert set(settings) <= fields | SECURITY_SETTINGS
    missing = set(settings) - fields
    if missing:
        pytest.skip(f"settings {sorted(missing)} are not in ControllerConfig yet "
                    "(added with docs/security.md)")
    config = load_config(SYSTEMD / "controller.toml", env={})
    assert config.db_path.startswith("/var/lib/sia/") and config.tls and config.tokens_file
    agent_env = env_file(SYSTEMD / "nodeagent.env")
    assert agent_env["SIA_CONTROLLER"].endswith(":" + config.agent_address.rsplit(":", 1)[1])
    assert config.checkpoint_root == str(parse(
        nodeagent_parser(), _agent_args_without_missing_security()).checkpoint_root)


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd's own checker, where it is installed (binaries pointed at this venv)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    venv_bin = Path(sys.executable).parent
    if not (venv_bin / "sia-controller").exists():
        pytest.skip("the project's entry points are not installed next to this python")
    for path in UNITS.values():
        text = path.read_text().replace("/opt/sia/bin/", f"{venv_bin}/")
        (tmp_path / path.name).write_text(text)
    out = subprocess.run([tool, "verify", "--man=no", *sorted(map(str, tmp_path.iterdir()))],
                         capture_output=True, text=True, timeout=60)
    # Only complaints about our files count (the host's own units may be odd).
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if "sia-" in line]
    assert not problems, problems


def test_the_pair_config_makes_a_leader_and_a_standby_on_postgres(tmp_path: Path) -> None:
    """controller-ha.toml (the same on both hosts) with each host's controller.env: a
    valid controller on PostgreSQL, its password from a file, each advertising its own
    name; the unit reads that env file."""
    from sia_grpc.controller.config import load_config
    from sia_grpc.controller.stores import is_postgres

    assert "-/etc/sia/controller.env" in values(UNITS["controller"], "EnvironmentFile")
    text = (SYSTEMD / "controller-ha.toml").read_text()
    settings = tomllib.loads(text)["controller"]
    assert ":" not in settings["store"].split("@")[0].removeprefix("postgresql://"), \
        "the DSN must not carry the password"
    password = tmp_path / "pg-password"
    password.write_text("s3cret\n")
    config_file = tmp_path / "controller.toml"
    config_file.write_text(text.replace(settings["store_password_file"], str(password)))
    advertised = []
    for host in ("ctl-a", "ctl-b"):
        env = env_file(SYSTEMD / "controller-ha.env")
        env["SIA_ADVERTISE"] = env["SIA_ADVERTISE"].replace("ctl-a", host)
        config = load_config(config_file, env=env)
        assert is_postgres(config.store_target) and config.store_password() == "s3cret"
        assert config.tls and config.tokens_file
        advertised.append(config.advertise)
    assert advertised == ["ctl-a.internal:50051", "ctl-b.internal:50051"]
    assert "ctl-b.internal:50051" in (SYSTEMD / "controller-ha.env").read_text()
    assert "0640 -o root -g sia" in text  # how the password file is installed
