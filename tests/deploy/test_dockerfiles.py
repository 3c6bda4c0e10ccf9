"""deploy/docker: the images cannot be built here (no Docker daemon), so these check
what can be checked without one: pinned bases, the controller's non-root user (the
agent's root, as its isolation needs), the entry points
the project really installs, the files copied exist and pass the ignore files."""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest
from deploy_common import DEPLOY, ROOT

DOCKER = DEPLOY / "docker"
IMAGES = {"controller": DOCKER / "controller.Dockerfile", "agent": DOCKER / "agent.Dockerfile"}


def instructions(name: str) -> list[tuple[str, str]]:
    text = IMAGES[name].read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def args_defaults(name: str) -> dict[str, str]:
    return dict(rest.split("=", 1) for op, rest in instructions(name) if op == "ARG")


@pytest.mark.parametrize("name", IMAGES)
def test_base_images_are_pinned(name: str) -> None:
    for image in args_defaults(name).values():
        repo, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), image


def test_controller_runs_as_a_fixed_non_root_user() -> None:
    users = [rest for op, rest in instructions("controller") if op == "USER"]
    assert users and users[-1].split(":")[0] == "10001"


def test_agent_runs_as_root_with_what_its_start_up_step_needs() -> None:
    """The agent isolates jobs under uids and cgroups of their own, which takes root
    (the DaemonSet grants it only the capabilities that uses); its start-up step
    (deploy/k8s/base/nodeagent-daemonset.yaml) needs setpriv and mount."""
    users = [rest for op, rest in instructions("agent") if op == "USER"]
    assert users and users[-1] == "0:0", "say so explicitly"
    runs = " ".join(rest for op, rest in instructions("agent") if op == "RUN")
    assert "command -v setpriv" in runs and "command -v mount" in runs
    assert "useradd" not in runs
    # The work directory's parent is searchable by the jobs' uids.
    assert "-m 0755 /var/lib/sia " in runs and "-m 0711 /var/lib/sia/agent" in runs


def test_entry_points_are_the_installed_scripts() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = {n: [rest for op, rest in instructions(n) if op == "ENTRYPOINT"][-1] for n in IMAGES}
    assert entry["controller"] == '["tini", "--", "sia-controller"]'
    assert entry["agent"] == '["tini", "--", "sia-nodeagent", "--backend", "torch"]'
    assert {"sia-controller", "sia-nodeagent"} <= set(scripts)


def test_controller_image_has_no_torch_and_agent_image_has_train_extra() -> None:
    controller = IMAGES["controller"].read_text()
    runs = " ".join(rest for op, rest in instructions("controller") if op == "RUN")
    assert "pip install ." in runs and "[train]" not in runs and "torch" not in runs
    assert "cuda" not in controller.lower().replace("no cuda", "")
    agent_runs = " ".join(rest for op, rest in instructions("agent") if op == "RUN")
    assert '".[train]"' in agent_runs and re.search(r'"nvidia-ml-py==[\d.]+"', agent_runs)
    assert "cuda" in args_defaults("agent")["TORCH_IMAGE"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["train"])


def test_controller_image_exposes_its_ports_and_keeps_the_store_in_a_volume() -> None:
    ops = instructions("controller")
    assert ("EXPOSE", "50051 50052 9464") in ops  # clients, agents, /metrics
    assert ("VOLUME", '["/var/lib/sia"]') in ops
    env = " ".join(rest for op, rest in ops if op == "ENV")
    assert "SIA_DB_PATH=/var/lib/sia/sia.db" in env


def _ignored(patterns: list[str], path: str) -> bool:
    """.dockerignore semantics, enough for these files: last match wins, ! re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pattern == "**" or any(fnmatch.fnmatch(p, pattern) for p in prefixes) or \
                (pattern.startswith("**/") and any(fnmatch.fnmatch(part, pattern[3:])
                                                   for part in parts)):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("name", IMAGES)
def test_copied_files_exist_and_are_not_ignored(name: str) -> None:
    ignore = DOCKER / f"{IMAGES[name].name}.dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for op, rest in instructions(name):
        if op != "COPY" or rest.startswith("--from"):
            continue
        for source in rest.split()[:-1]:
            assert (ROOT / source).exists(), f"{name}: COPY {source}: no such file"
            assert not _ignored(patterns, source.rstrip("/")), f"{ignore.name} drops {source}"
    for junk in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "docs/agent.md",
                 "sia_grpc/__pycache__/api.cpython-311.pyc"):
        assert _ignored(patterns, junk), f"{ignore.name} lets {junk} into the context"
    assert not _ignored(patterns, "sia_grpc/controller/shell/server.py")
