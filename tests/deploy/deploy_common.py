"""Helpers shared by the deployment tests: the repository's deploy/ tree, YAML
documents, and the command-line parsers the manifests and units must agree with."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
HA = K8S / "components" / "ha"  # the controller pair, a kustomize Component

# The security settings another change adds to the CLIs (docs/security.md). Where a
# parser does not have one yet, its tests skip naming it; every other flag must exist.
SECURITY_FLAGS = frozenset({"--tls-cert", "--tls-key", "--tls-client-ca", "--tokens",
                            "--allow-insecure", "--agent-listen", "--tls-ca"})
SECURITY_SETTINGS = frozenset({"tls_cert", "tls_key", "tls_client_ca", "tokens_file",
                               "allow_insecure", "agent_listen"})

# The capabilities the node agent's isolation uses (sia_grpc/nodeagent/isolation/,
# workers.py; deploy/systemd/sia-nodeagent.service says what each is for): the unit
# and the DaemonSet leave the running agent exactly these (Kubernetes' spelling).
# cgroup v1 adds SYS_ADMIN (its devices allow-list), a drop-in on systemd.
AGENT_CAPS = frozenset({"SETUID", "SETGID", "CHOWN", "FOWNER", "DAC_OVERRIDE", "KILL"})


def yaml_files() -> list[Path]:
    """Every YAML file under deploy/k8s except the kustomizations."""
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def base_resources(directory: Path = BASE) -> list[dict[str, Any]]:
    """The documents a kustomization's `resources` name, following directories (and
    components, whose resources are added too)."""
    out: list[dict[str, Any]] = []
    k = kustomization(directory)
    for component in k.get("components", []):
        out += base_resources((directory / component).resolve())
    for entry in k.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            out += base_resources(target)
        else:
            out += documents(target)
    return out


def uses_ha(directory: Path) -> bool:
    """Whether an overlay (or one it builds on) adds the HA component."""
    k = kustomization(directory)
    if any((directory / c).resolve() == HA.resolve() for c in k.get("components", [])):
        return True
    return any(uses_ha((directory / r).resolve()) for r in k.get("resources", [])
               if (directory / r).is_dir())


def by_kind(docs: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if doc.get("kind") == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if doc.get("kind") == "Pod":
        return doc["spec"]
    return None


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def flags_in(args: Sequence[str]) -> list[str]:
    """The option names in an argument list (`--x=1` and `--x 1` both give `--x`)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def without_flags(args: Sequence[str], drop: set[str],
                  parser: argparse.ArgumentParser) -> list[str]:
    """`args` less the options in `drop` and their values."""
    takes_value = {s: a.nargs != 0 for a in parser._actions for s in a.option_strings}
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in drop:
            skip = "=" not in a and takes_value.get(name, True)
            continue
        out.append(a)
    return out


def controller_parser() -> argparse.ArgumentParser:
    from sia_grpc.controller.__main__ import parser

    return parser()


def nodeagent_parser() -> argparse.ArgumentParser:
    from sia_grpc.nodeagent.__main__ import _parser

    return _parser()


def parse(parser: argparse.ArgumentParser, args: Sequence[str]) -> argparse.Namespace:
    """parse_args, with argparse's exit turned into an assertion naming the problem."""
    try:
        return parser.parse_args(list(args))
    except SystemExit as exc:
        raise AssertionError(f"{parser.prog} rejects {list(args)} (exit {exc.code}); "
                             "see its usage message above") from None


def missing_security_flags(parser: argparse.ArgumentParser, args: Sequence[str]) -> set[str]:
    return {f for f in flags_in(args) if f in SECURITY_FLAGS} - option_strings(parser)


def expand_k8s(args: Sequence[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a)
            for a in args]
