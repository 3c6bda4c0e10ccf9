"""deploy/systemd: the units parse, are hardened as docs/operations.md says, and
their ExecStart lines (with the example configuration) are accepted by the real
CLI parsers; the example controller.toml loads. The node agent runs as root with
exactly the capabilities its isolation uses, its own cgroup subtree and
--isolation strict."""

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
    AGENT_CAPS,
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
    for key, value in {"NoNewPrivileges": "yes", "PrivateTmp": "yes",
                       "ProtectSystem": "strict", "Restart": "on-failure",
                       "KillSignal": "SIGTERM", "KillMode": "mixed",
                       "AmbientCapabilities": ""}.items():
        assert service.get(key) == value, f"{name}: {key}={service.get(key)!r}"
    assert service.get("ProtectHome") in ("yes", "read-only")
    assert service["ExecStart"].split()[0].startswith("/opt/sia/bin/")


def test_controller_runs_unprivileged() -> None:
    service = unit(UNITS["controller"])["Service"]
    assert service["User"] == "sia" or service.get("DynamicUser") == "yes"
    assert service["CapabilityBoundingSet"] == ""
    assert service["ProtectControlGroups"] == "yes"
    assert "sia" in service["StateDirectory"].split()


def test_agent_runs_as_root_with_exactly_the_isolation_capabilities() -> None:
    """Switching a job's workers to its uid, its cgroups and its folders take root;
    root keeps only what the isolation uses (deploy_common.AGENT_CAPS)."""
    path = UNITS["nodeagent"]
    for key in ("User", "Group", "DynamicUser"):
        assert not values(path, key), f"sia-nodeagent.service still sets {key}="
    bounding = values(path, "CapabilityBoundingSet")
    assert len(bounding) == 1, bounding  # one list, no ~inverted or merged one
    assert set(bounding[0].split()) == {f"CAP_{c}" for c in AGENT_CAPS}
    assert values(path, "AmbientCapabilities") == [""]
    # cgroup v1's SYS_ADMIN is a documented drop-in, never in the unit itself.
    assert "CapabilityBoundingSet=CAP_SYS_ADMIN" in path.read_text()


def test_agent_manages_its_own_cgroup_subtree() -> None:
    path = UNITS["nodeagent"]
    service = unit(path)["Service"]
    assert service["Delegate"] == "yes"
    assert service.get("ProtectControlGroups", "no") == "no"
    # /sys read-only, but the cgroup filesystem, which the agent writes.
    assert "/sys" in " ".join(values(path, "ReadOnlyPaths")).split()
    assert "/sys/fs/cgroup" in " ".join(values(path, "ReadWritePaths")).split()


def test_agent_leaves_bubblewrap_what_the_sandbox_needs() -> None:
    """bwrap mounts a fresh /proc in the job's user and pid namespaces, which the
    kernel refuses when locked mounts cover parts of the /proc it would reveal
    (ProtectKernelTunables=, ProtectProc=, ProcSubset=); and it makes namespaces."""
    service = unit(UNITS["nodeagent"])["Service"]
    for key, harmless in {"ProtectKernelTunables": "no", "ProtectProc": "default",
                          "ProcSubset": "all", "RestrictNamespaces": "no",
                          "PrivateUsers": "no"}.items():
        assert service.get(key, harmless) == harmless, f"{key}={service.get(key)}"


def test_agent_state_directory_lets_job_users_through() -> None:
    """Job uids reach their 0700 run folders under the work directory: it and its
    parents must be searchable by them (0711), and /var/lib/sia is not the agent's
    to re-own (the controller's unit owns it where both run)."""
    service = unit(UNITS["nodeagent"])["Service"]
    assert service["StateDirectory"].split() == ["sia/agent"]
    assert service["StateDirectoryMode"] == "0711"
    ns = parse(nodeagent_parser(), _agent_args_without_missing_security())
    assert str(ns.workdir) == "/var/lib/sia/agent"


def test_agent_isolation_is_strict_and_a_refusal_is_not_restarted() -> None:
    path = UNITS["nodeagent"]
    args = exec_start(path)[1:]
    assert "--isolation" in flags_in(args)
    ns = parse(nodeagent_parser(), _agent_args_without_missing_security())
    assert ns.isolation == "strict"
    assert "SIA_ISOLATION=strict" in values(path, "Environment")
    # strict refusing to start exits 2: systemd must not restart it in a loop.
    assert "2" in unit(path)["Service"]["RestartPreventExitStatus"].split()
    # The example env file documents the setting without overriding the unit's.
    example = (SYSTEMD / "nodeagent.env").read_text()
    assert "#SIA_ISOLATION=strict" in example
    assert "SIA_ISOLATION" not in env_file(SYSTEMD / "nodeagent.env")


def test_example_isolation_flags_parse() -> None:
    """The commented SIA_AGENT_ARGS example in nodeagent.env is what the agent takes."""
    from sia_grpc.nodeagent.__main__ import _check_args

    (line,) = [line for line in (SYSTEMD / "nodeagent.env").read_text().splitlines()
               if line.startswith("#SIA_AGENT_ARGS=")]
    extra = line.split("=", 1)[1].split()
    assert {"--tenant-user", "--memory-per-gpu", "--sandbox-ro"} <= set(flags_in(extra))
    p = nodeagent_parser()
    ns = parse(p, [*_agent_args_without_missing_security(), *extra])
    _check_args(p, ns)
    assert ns.tenant_user == [("team-a", (1500, 1500))]
    assert ns.memory_per_gpu == 65536 and ns.sandbox_ro == ["/shared/code"]


def test_controller_reload_sends_sighup() -> None:
    service = unit(UNITS["controller"])["Service"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"


def test_agent_stop_timeout_covers_checkpointing() -> None:
    service = unit(UNITS["nodeagent"])["Service"]
    ns = parse(nodeagent_parser(), _agent_args_without_missing_security())
    assert int(service["TimeoutStopSec"]) >= ns.stop_grace + 30
    # The checkpoint directory is writable despite ProtectSystem=strict, and mounted.
    assert str(ns.checkpoint_root) in " ".join(values(UNITS["nodeagent"],
                                                      "ReadWritePaths")).split()
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
