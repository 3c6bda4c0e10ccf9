"""deploy/k8s: every manifest validates against the Kubernetes OpenAPI schemas
(kubernetes-validate, offline, strict: an unknown field fails), the kustomizations
hold together, and the workloads are what docs/operations.md promises: one
controller with Recreate on SQLite (the base, production), or a leader and a standby
on PostgreSQL (components/ha: dev, production-ha); hardened containers (the node
agent: root with exactly the capabilities its isolation uses, --isolation user),
health probes on the service port, and container args that the real CLIs accept."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml
from deploy_common import (
    AGENT_CAPS,
    BASE,
    DEPLOY,
    HA,
    K8S,
    OVERLAYS,
    ROOT,
    SECURITY_FLAGS,
    SECURITY_SETTINGS,
    base_resources,
    by_kind,
    containers,
    controller_parser,
    documents,
    expand_k8s,
    flags_in,
    kustomization,
    missing_security_flags,
    nodeagent_parser,
    one,
    option_strings,
    parse,
    pod_spec,
    uses_ha,
    without_flags,
    yaml_files,
)

# The oldest Kubernetes these manifests support, and the newest schemas bundled.
K8S_VERSIONS = ("1.29", kubernetes_validate.utils.major_minor(
    kubernetes_validate.utils.latest_version()))
NODE = "gpu-node-7"  # stands in for $(NODE_NAME)

BASE_DOCS = base_resources()


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------- schemas


@functools.cache
def _schema_validator(version: str, kind: str, api_version: str) -> jsonschema.Validator:
    """The strict schema of kind/api_version, as kubernetes_validate.validate builds it."""
    version = [v for v in kubernetes_validate.utils.all_versions()
               if kubernetes_validate.utils.major_minor(v) == version][-1]
    group = api_version.split("/")[0].split(".")[0] if "/" in api_version else ""
    name = f"{kind.lower()}-{group}-{api_version.split('/')[-1]}" if group else \
        f"{kind.lower()}-{api_version}"
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / \
        f"v{version}-local-strict"
    schema = json.loads((folder / f"{name}.json").read_text())
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry = referencing.Resource.from_contents(definitions) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def patch_errors(doc: dict[str, Any], version: str) -> list[str]:
    """Schema errors in a strategic-merge patch: everything but missing required
    fields (a patch names only what it changes), its directives left out (`$patch:
    delete`, and a field set to null: deleted)."""
    validator = _schema_validator(version, doc["kind"], doc["apiVersion"])
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(without_directives(doc))
            if e.validator != "required"]


def without_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_directives(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [without_directives(v) for v in value]
    return value


def test_patch_validation_still_rejects_an_unknown_field() -> None:
    """Leaving the directives out does not let a misspelt field through."""
    (doc,) = documents(HA / "controller-ha.yaml")
    bad = json.loads(json.dumps(doc))
    bad["spec"]["template"]["spec"]["volumes"][0]["emptyDirr"] = {}
    assert any("emptyDirr" in e for e in patch_errors(bad, K8S_VERSIONS[0]))
    assert not patch_errors(doc, K8S_VERSIONS[0])


def is_patch(path: Path) -> bool:
    """Whether a file is used as a patch by a kustomization next to it."""
    k = path.parent / "kustomization.yaml"
    if not k.exists():
        return False
    patches = yaml.safe_load(k.read_text()).get("patches", [])
    return any(p.get("path") == path.name for p in patches)


@pytest.mark.parametrize("path", yaml_files(), ids=rel)
def test_every_manifest_validates_strictly(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{rel(path)}: no YAML documents"
    for doc in docs:
        for version in K8S_VERSIONS:
            if is_patch(path):
                errors = patch_errors(doc, version)
                assert not errors, f"{rel(path)} (patch), Kubernetes {version}: {errors}"
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                e = err.caught
                where = ".".join(map(str, e.absolute_path))
                pytest.fail(f"{rel(path)}: {doc['kind']}/{doc['metadata']['name']}, "
                            f"Kubernetes {version}: {where}: {e.message}")


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The schemas are really strict: a misspelt field fails (not silently dropped)."""
    doc = one(BASE_DOCS, "Deployment", "sia-controller")
    bad = json.loads(json.dumps(doc))
    bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


# ---------------------------------------------------------------- kustomize


def kustomizations() -> list[Path]:
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


@pytest.mark.parametrize("directory", kustomizations(), ids=rel)
def test_kustomization_references_exist(directory: Path) -> None:
    k = kustomization(directory)
    named = [*k.get("resources", []), *k.get("components", []),
             *[p["path"] for p in k.get("patches", []) if "path" in p],
             *[f.split("=", 1)[-1] for g in k.get("configMapGenerator", [])
               for f in g.get("files", [])]]
    assert named, f"{rel(directory)}: references nothing"
    for entry in named:
        target = directory / entry
        assert target.exists(), f"{rel(directory)}/kustomization.yaml: {entry} does not exist"
        if target.is_dir():
            assert (target / "kustomization.yaml").exists(), f"{entry}: not a kustomization"
            kind = kustomization(target).get("kind", "Kustomization")
            assert kind == ("Component" if entry in k.get("components", []) else
                            "Kustomization"), f"{rel(directory)}: {entry} is a {kind}"
    # Every YAML file next to a kustomization is used by it (no forgotten manifest).
    used = {(directory / e).resolve() for e in named}
    for path in directory.glob("*.yaml"):
        if path.name != "kustomization.yaml":
            assert path.resolve() in used, f"{rel(path)} is not in its kustomization"


@pytest.mark.parametrize("overlay", [*OVERLAYS, HA], ids=lambda p: p.name)
def test_overlay_patches_target_base_resources(overlay: Path) -> None:
    k = kustomization(overlay)
    # Built on the base, directly or through another overlay (production-ha).
    bases = [(overlay / r).resolve() for r in k.get("resources", []) if (overlay / r).is_dir()]
    assert overlay == HA or bases and all(b == BASE.resolve() or b.parent == K8S / "overlays"
                                          for b in bases), bases
    base = {(d["kind"], d["metadata"]["name"])
            for d in base_resources(BASE) + base_resources(overlay)}
    for patch in k.get("patches", []):
        if "target" in patch:
            targets = [(patch["target"]["kind"], patch["target"]["name"])]
        else:
            targets = [(d["kind"], d["metadata"]["name"])
                       for d in documents(overlay / patch["path"])]
        for target in targets:
            assert target in base, f"{overlay.name}: patch {patch} targets {target}, " \
                                   "which the base does not have"
    images = {i["name"] for i in kustomization(BASE)["images"]}
    assert {i["name"] for i in k.get("images", [])} <= images


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlays_never_touch_replicas_or_strategy(overlay: Path) -> None:
    """The single-writer guarantee lives in the base, the pair's in components/ha: no
    overlay changes either (an overlay on SQLite with 2 replicas would corrupt it)."""
    k = kustomization(overlay)
    assert "replicas" not in k
    for patch in k.get("patches", []):
        for doc in documents(overlay / patch["path"]) if "path" in patch else []:
            spec = doc.get("spec", {})
            assert "replicas" not in spec and "strategy" not in spec, patch


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed: the overlays "
                    "are checked file by file only")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=rel)
def test_rendered_kustomization_validates_and_keeps_the_invariants(directory: Path) -> None:
    docs = render(directory)
    for doc in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    if uses_ha(directory):
        check_pair(docs)
    else:
        check_single_writer(docs)
    for doc in docs:
        if (spec := pod_spec(doc)) is not None:
            check_hardened(doc, spec)
    config = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(config) == 1 and config[0]["metadata"]["name"].startswith("sia-controller-config-")
    deploy = one(docs, "Deployment", "sia-controller")
    volumes = deploy["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": config[0]["metadata"]["name"]}} in volumes
    agent = one(docs, "DaemonSet", "sia-nodeagent")
    for c in [*containers(pod_spec(deploy)), *containers(pod_spec(agent))]:
        assert ":" in c["image"], f"{c['name']}: image {c['image']} has no tag"


# ---------------------------------------------------------------- the workloads


def check_single_writer(docs: list[dict[str, Any]]) -> None:
    deploy = one(docs, "Deployment", "sia-controller")
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert not by_kind(docs, "HorizontalPodAutoscaler")
    claims = [v["persistentVolumeClaim"]["claimName"]
              for v in deploy["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["sia-store"]
    pvc = one(docs, "PersistentVolumeClaim", "sia-store")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_controller_is_a_single_writer() -> None:
    check_single_writer(BASE_DOCS)


def is_agent(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == "DaemonSet" and doc["metadata"]["name"] == "sia-nodeagent"


def check_hardened(doc: dict[str, Any], spec: dict[str, Any]) -> None:
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    pod = spec.get("securityContext", {})
    assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, name
    assert spec.get("automountServiceAccountToken") is False, name
    assert not spec.get("hostPID") and not spec.get("hostIPC"), name
    if is_agent(doc):
        check_agent_privileges(doc, spec)
        return
    assert pod.get("runAsNonRoot") is True, name
    for c in containers(spec):
        sc = c.get("securityContext", {})
        where = f"{name} container {c['name']}"
        assert sc.get("runAsNonRoot") is True, where
        assert sc.get("readOnlyRootFilesystem") is True, where
        assert sc.get("allowPrivilegeEscalation") is False, where
        assert sc.get("privileged") in (None, False), where
        assert sc.get("capabilities") == {"drop": ["ALL"]}, where
        assert sc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert sc.get("runAsUser", pod.get("runAsUser", 0)) != 0, where


# ---------------------------------------------------------------- the agent's privileges

# What the container holds beyond AGENT_CAPS, only for its start-up step: the cgroup
# remount (SYS_ADMIN) and setpriv's cut of the bounding set (SETPCAP).
START_UP_CAPS = frozenset({"SYS_ADMIN", "SETPCAP"})
APPARMOR = "container.apparmor.security.beta.kubernetes.io/"


def check_agent_privileges(doc: dict[str, Any], spec: dict[str, Any]) -> None:
    """The node agent runs as root, as its isolation needs, with no more than it
    needs: no privileged container, no host devices or hostPath, exactly AGENT_CAPS
    (plus the start-up step's two), the runtime's seccomp profile."""
    pod = spec.get("securityContext", {})
    assert pod.get("runAsNonRoot") is not True
    assert "fsGroup" not in pod and "supplementalGroups" not in pod
    (c,) = spec["containers"]
    assert not spec.get("initContainers")
    sc = c["securityContext"]
    assert sc["runAsUser"] == 0 and sc.get("runAsNonRoot") is False
    assert sc.get("privileged") is False
    assert sc.get("readOnlyRootFilesystem") is True
    assert sc.get("seccompProfile") == {"type": "RuntimeDefault"}
    assert "procMount" not in sc and "seLinuxOptions" not in sc
    caps = sc["capabilities"]
    assert caps["drop"] == ["ALL"]
    assert len(caps["add"]) == len(set(caps["add"]))
    assert set(caps["add"]) == AGENT_CAPS | START_UP_CAPS, caps["add"]
    assert not [a for a in caps["add"] if a.startswith("CAP_")], "Kubernetes' spelling"
    # The API refuses allowPrivilegeEscalation: false with CAP_SYS_ADMIN; it is not
    # to be had by spelling the capability SYS_ADMIN instead.
    assert sc.get("allowPrivilegeEscalation") is ("SYS_ADMIN" in caps["add"])
    # AppArmor off for the agent only (the default profile denies the remount).
    notes = doc["spec"]["template"]["metadata"].get("annotations", {})
    apparmor = {k: v for k, v in notes.items() if k.startswith(APPARMOR)}
    assert apparmor == {APPARMOR + c["name"]: "unconfined"}
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    assert start_up_script(c) is not None


def start_up_script(c: dict[str, Any]) -> str:
    """The DaemonSet's start-up step: tini as PID 1, then `sh -c SCRIPT`, whose last
    word execs the agent with the container's args."""
    command = c["command"]
    assert command[:5] == ["tini", "--", "/bin/sh", "-c", command[4]], command
    assert command[5:] == ["sia-nodeagent"], "$0 of the script"
    return command[4]


def _agent_container(docs: list[dict[str, Any]] = BASE_DOCS) -> dict[str, Any]:
    (c,) = pod_spec(one(docs, "DaemonSet", "sia-nodeagent"))["containers"]
    return c


def test_the_agent_keeps_exactly_the_isolation_capabilities() -> None:
    """The capabilities setpriv leaves the agent are AGENT_CAPS, the systemd unit's."""
    script = start_up_script(_agent_container())
    (keep,) = re.findall(r"^caps=(\S+)$", script, re.M)
    items = keep.split(",")
    assert items[0] == "-all"
    assert {i.lstrip("+").upper() for i in items[1:]} == AGENT_CAPS
    assert '--bounding-set="$caps"' in script and "--inh-caps=-all" in script
    assert re.search(r'sia-nodeagent --backend torch "\$@"\s*$', script)
    assert "$(" not in script, "Kubernetes would expand $(...) in a command"


def _run_start_up(tmp_path: Path, mountinfo: str) -> tuple[list[str], list[str], list[str]]:
    """The start-up script, with `mount`, `chmod` and `setpriv` replaced by stubs that
    record their arguments, reading `mountinfo` instead of /proc/self/mountinfo."""
    script = start_up_script(_agent_container())
    info = tmp_path / "mountinfo"
    info.write_text(mountinfo)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("mount", "chmod", "setpriv"):
        stub = stubs / tool
        stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{tmp_path}/{tool}.log"\n')
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    assert "/proc/self/mountinfo" in script
    out = subprocess.run(
        ["/bin/sh", "-c", script.replace("/proc/self/mountinfo", str(info)), "sia-nodeagent",
         "--controller=x:50052", "--isolation=user"],
        env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr

    def log(tool: str) -> list[str]:
        path = tmp_path / f"{tool}.log"
        return path.read_text().splitlines() if path.exists() else []
    return log("mount"), log("chmod"), log("setpriv")


_V2_MOUNTINFO = """\
1 0 0:1 / / rw - overlay overlay rw
2 1 0:2 / /proc rw,nosuid - proc proc rw
3 1 0:3 / /sys ro,nosuid - sysfs sysfs ro
4 3 0:4 / /sys/fs/cgroup ro,nosuid,nodev,noexec - cgroup2 cgroup rw,nsdelegate
5 1 0:5 / /tmp rw - tmpfs tmpfs rw
"""
_V1_MOUNTINFO = """\
1 0 0:1 / / rw - overlay overlay rw
3 1 0:3 / /sys ro,nosuid - sysfs sysfs ro
4 3 0:4 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
5 4 0:5 /kubepods/pod1/c1 /sys/fs/cgroup/memory ro shared:9 - cgroup cgroup rw,memory
6 4 0:6 /kubepods/pod1/c1 /sys/fs/cgroup/devices ro - cgroup cgroup rw,devices
7 4 0:7 /kubepods/pod1/c1 /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct
"""


def test_start_up_on_cgroup_v2_drops_sys_admin(tmp_path: Path) -> None:
    mounts, chmods, setpriv = _run_start_up(tmp_path, _V2_MOUNTINFO)
    assert mounts == ["-o", "remount,bind,rw", "/sys/fs/cgroup"]
    assert chmods == ["1777", "/tmp", "/dev/shm"]
    bounding = setpriv[0].removeprefix("--bounding-set=").split(",")
    assert bounding[0] == "-all"
    assert {b.lstrip("+").upper() for b in bounding[1:]} == AGENT_CAPS
    assert setpriv[1:] == ["--inh-caps=-all", "--", "sia-nodeagent", "--backend", "torch",
                           "--controller=x:50052", "--isolation=user"]


def test_start_up_on_cgroup_v1_keeps_sys_admin_for_the_devices_list(tmp_path: Path) -> None:
    mounts, _, setpriv = _run_start_up(tmp_path, _V1_MOUNTINFO)
    remounted = [m for m in mounts if m.startswith("/")]
    assert remounted == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/devices",
                         "/sys/fs/cgroup/cpu,cpuacct"]
    bounding = setpriv[0].removeprefix("--bounding-set=").split(",")
    assert {b.lstrip("+").upper() for b in bounding[1:]} == AGENT_CAPS | {"SYS_ADMIN"}


def test_agent_isolation_level_is_user() -> None:
    ns = parse(nodeagent_parser(), without_flags(_agent_args(), SECURITY_FLAGS,
                                                 nodeagent_parser()))
    assert ns.isolation == "user"


TOOL_DOCS = [d for p in sorted((K8S / "tools").glob("*.yaml")) for d in documents(p)]
# What overlays add beside their patches (the dev overlay's example PostgreSQL).
OVERLAY_DOCS = [d for o in OVERLAYS for p in sorted(o.glob("*.yaml"))
                if p.name != "kustomization.yaml" and not is_patch(p) for d in documents(p)]


@pytest.mark.parametrize("doc", [d for d in [*BASE_DOCS, *TOOL_DOCS, *OVERLAY_DOCS]
                                 if pod_spec(d) is not None],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_container_is_hardened(doc: dict[str, Any]) -> None:
    check_hardened(doc, pod_spec(doc))


def test_maintenance_pod_mounts_the_store_the_controller_uses() -> None:
    (pod,) = TOOL_DOCS
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]]
    assert claims == ["sia-store"]
    assert pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == "/var/lib/sia"
    assert pod["metadata"]["namespace"] == kustomization(BASE)["namespace"]


def test_overlay_patches_do_not_weaken_security() -> None:
    for overlay in [*OVERLAYS, HA]:
        for path in filter(is_patch, overlay.glob("*.yaml")):
            text = path.read_text()
            for word in ("securityContext", "privileged", "hostPath", "capabilities"):
                assert word not in text, f"{rel(path)} touches {word}"


def test_secrets_are_referenced_never_committed() -> None:
    for path in [*yaml_files(), *DEPLOY.rglob("*.toml"), *DEPLOY.rglob("*.env")]:
        text = path.read_text()
        assert "kind: Secret" not in text, rel(path)
        assert "PRIVATE KEY" not in text, rel(path)
    readme = (K8S / "README.md").read_text()
    for doc in [*BASE_DOCS, *documents(HA / "controller-ha.yaml")]:
        for volume in (pod_spec(doc) or {}).get("volumes", []):
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert f"create secret generic {name}" in readme, \
                    f"deploy/k8s/README.md does not say how to create the Secret {name}"


def test_secret_files_used_in_args_are_created_by_the_readme() -> None:
    readme = (K8S / "README.md").read_text()
    for doc in BASE_DOCS:
        spec = pod_spec(doc)
        if spec is None:
            continue
        for c in containers(spec):
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            secret_volumes = {v["name"] for v in spec["volumes"] if "secret" in v}
            for arg in [*c.get("args", []), *_probe_commands(c)]:
                value = arg.split("=", 1)[-1]
                for mount, volume in mounts.items():
                    if volume in secret_volumes and value.startswith(mount + "/"):
                        key = value[len(mount) + 1:].replace("$(NODE_NAME)", "")
                        # agent-$(NODE_NAME).crt: the README adds agent-<node>.crt files
                        assert key.split(".")[0].rstrip("-") in readme, (c["name"], value)


def _probe_commands(c: dict[str, Any]) -> list[str]:
    return [a for p in ("readinessProbe", "livenessProbe", "startupProbe")
            for a in c.get(p, {}).get("exec", {}).get("command", [])]


def _healthcheck_parser():
    path = DEPLOY / "docker" / "sia-healthcheck.py"
    spec = importlib.util.spec_from_file_location("sia_healthcheck", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parser()


def test_probes_check_grpc_health_on_the_service_port() -> None:
    deploy = one(BASE_DOCS, "Deployment", "sia-controller")
    service = one(BASE_DOCS, "Service", "sia-controller")
    (c,) = pod_spec(deploy)["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    svc = {p["name"]: p for p in service["spec"]["ports"]}
    assert svc["grpc"]["targetPort"] == "grpc" and svc["grpc"]["port"] == ports["grpc"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    for probe in ("readinessProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        assert command[0] == "sia-healthcheck", probe
        args = parse(_healthcheck_parser(), command[1:])
        host, port = args.addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) == ports["grpc"], probe
        # TLS, verified against the name the agents and clients use too.
        assert args.ca and args.server_name == \
            f"{service['metadata']['name']}.sia-system.svc", probe
        assert c[probe]["timeoutSeconds"] >= 3, probe


# ---------------------------------------------------------------- args vs the CLIs


def _controller() -> dict[str, Any]:
    (c,) = pod_spec(one(BASE_DOCS, "Deployment", "sia-controller"))["containers"]
    return c


def _agent() -> dict[str, Any]:
    (c,) = pod_spec(one(BASE_DOCS, "DaemonSet", "sia-nodeagent"))["containers"]
    return c


def _agent_args() -> list[str]:
    return expand_k8s(_agent()["args"], {"NODE_NAME": NODE})


def _controller_toml() -> dict[str, Any]:
    return tomllib.loads((BASE / "controller.toml").read_text())["controller"]


def test_controller_args_parse_and_make_a_valid_config(tmp_path: Path) -> None:
    from sia_grpc.controller.config import ControllerConfig, load_config

    p = controller_parser()
    args = without_flags(_controller()["args"], missing_security_flags(p, _controller()["args"]),
                         p)
    ns = parse(p, args)
    settings = _controller_toml()
    fields = set(ControllerConfig.__dataclass_fields__)
    assert set(settings) <= fields | SECURITY_SETTINGS, set(settings) - fields
    config_file = tmp_path / "controller.toml"
    config_file.write_text(tomllib_dump({k: v for k, v in settings.items() if k in fields}))
    overrides = {k: v for k, v in vars(ns).items()
                 if k in fields and k not in ("config",)}
    if not {"tls_cert", "tokens_file"} <= fields:
        overrides["listen"] = "127.0.0.1:50051"  # plaintext is loopback-only without them
    config = load_config(config_file, env={}, **overrides)
    assert config.db_path.startswith("/var/lib/sia/")
    mounts = {m["mountPath"] for m in _controller()["volumeMounts"]}
    assert str(Path(config.db_path).parent) in mounts
    assert ns.config == "/etc/sia/config/controller.toml"
    assert "/etc/sia/config" in mounts


def tomllib_dump(values: dict[str, Any]) -> str:
    lines = ["[controller]"]
    for key, value in values.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def test_agent_args_parse() -> None:
    from sia_grpc.nodeagent.__main__ import _check_args

    p = nodeagent_parser()
    args = without_flags(_agent_args(), missing_security_flags(p, _agent_args()), p)
    ns = parse(p, args)
    try:
        _check_args(p, ns)
    except SystemExit:
        pytest.fail(f"sia-nodeagent rejects {args}")
    assert ns.backend == "torch" and ns.node_id == NODE and ns.gpus is None
    daemonset = one(BASE_DOCS, "DaemonSet", "sia-nodeagent")
    # The agent stops its workers within --stop-grace; the pod must wait longer.
    assert daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= \
        ns.stop_grace + 30


ALL_FLAGS = sorted({*flags_in(_controller()["args"]), *flags_in(_agent_args())})


@pytest.mark.parametrize("flag", ALL_FLAGS)
def test_every_flag_exists_in_its_cli(flag: str) -> None:
    agent = flag in flags_in(_agent_args())
    parser = nodeagent_parser() if agent else controller_parser()
    if flag not in option_strings(parser) and flag in SECURITY_FLAGS:
        pytest.skip(f"{flag} is a security flag that {parser.prog} does not have yet "
                    "(added with docs/security.md)")
    assert flag in option_strings(parser), f"{parser.prog} has no {flag}"


def test_agents_reach_the_controller_agent_port() -> None:
    from sia_grpc.controller.config import ControllerConfig

    service = one(BASE_DOCS, "Service", "sia-controller")
    ns = parse(nodeagent_parser(), without_flags(_agent_args(), SECURITY_FLAGS,
                                                 nodeagent_parser()))
    host, port = ns.controller.rsplit(":", 1)
    assert host == f"{service['metadata']['name']}.{kustomization(BASE)['namespace']}.svc"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    if not hasattr(ControllerConfig, "agent_address"):
        pytest.skip("the controller has no separate agent port yet (docs/security.md)")
    listen = _controller_toml()["listen"]
    config = ControllerConfig(listen=listen.replace("0.0.0.0", "127.0.0.1"),
                              tls_cert="c", tls_key="k", tls_client_ca="ca")
    assert int(port) == ports["agents"] == int(config.agent_address.rsplit(":", 1)[1])
    (c,) = pod_spec(one(BASE_DOCS, "Deployment", "sia-controller"))["containers"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["agents"] == ports["agents"]


def test_checkpoints_are_on_the_shared_volume_everywhere() -> None:
    root = _controller_toml()["checkpoint_root"]
    agent = _agent()
    ns = parse(nodeagent_parser(), without_flags(_agent_args(), SECURITY_FLAGS,
                                                 nodeagent_parser()))
    assert str(ns.checkpoint_root) == root
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(one(BASE_DOCS, "DaemonSet",
                                                  "sia-nodeagent"))["volumes"]}
    claim = volumes[mounts[root]]["persistentVolumeClaim"]["claimName"]
    assert one(BASE_DOCS, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == \
        ["ReadWriteMany"]


def test_agent_daemonset_runs_on_gpu_nodes_only() -> None:
    daemonset = one(BASE_DOCS, "DaemonSet", "sia-nodeagent")
    spec = pod_spec(daemonset)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]
    (term,) = spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for e in term["matchExpressions"]}
    assert "nvidia.com/gpu.present" in keys
    priority = one(BASE_DOCS, "PriorityClass", spec["priorityClassName"])
    assert priority["value"] >= 1_000_000
    env = {e["name"]: e for e in _agent()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    gpus = _agent()["resources"]["limits"]["nvidia.com/gpu"]
    count = next(e for e in term["matchExpressions"] if e["key"] == "nvidia.com/gpu.count")
    assert count["values"] == [str(gpus)]
    for overlay in OVERLAYS:  # an overlay that changes the GPU count changes both
        for path in overlay.glob("nodeagent*.yaml"):
            (doc,) = documents(path)
            ospec = doc["spec"]["template"]["spec"]
            ogpus = ospec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            terms = ospec.get("affinity", {}).get("nodeAffinity", {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution")
            ocount = count["values"] if terms is None else next(
                e["values"] for e in terms["nodeSelectorTerms"][0]["matchExpressions"]
                if e["key"] == "nvidia.com/gpu.count")
            assert ocount == [str(ogpus)], rel(path)


def test_security_flag_names_are_the_agreed_ones() -> None:
    """The manifests use exactly the flag names of docs/security.md."""
    used = {f for f in ALL_FLAGS if f.startswith("--tls") or f == "--tokens"}
    assert used <= SECURITY_FLAGS


def test_the_metrics_port_is_the_one_the_controller_serves_and_prometheus_scrapes() -> None:
    from sia_grpc.controller.config import ControllerConfig

    listen = _controller_toml()["metrics_listen"]
    ControllerConfig(metrics_listen=listen)  # a valid setting
    port = int(listen.rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in _controller()["ports"]}
    assert ports["metrics"] == port
    service = one(BASE_DOCS, "Service", "sia-controller")
    svc = {p["name"]: p for p in service["spec"]["ports"]}
    assert svc["metrics"]["targetPort"] == "metrics" and svc["metrics"]["port"] == port
    deploy = one(BASE_DOCS, "Deployment", "sia-controller")
    notes = deploy["spec"]["template"]["metadata"]["annotations"]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                     "prometheus.io/path": "/metrics"}


# ---------------------------------------------------------------- the pair (components/ha)


def controller_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = pod_spec(one(docs, "Deployment", "sia-controller"))["containers"]
    return c


def resolved(value: int | str, replicas: int, *, up: bool) -> int:
    """A rollingUpdate count or percentage as Kubernetes resolves it (surge rounds up,
    unavailable down)."""
    if isinstance(value, int):
        return value
    fraction = int(value.rstrip("%")) * replicas / 100
    return int(-(-fraction // 1)) if up else int(fraction)


def check_pair(docs: list[dict[str, Any]]) -> None:
    deploy = one(docs, "Deployment", "sia-controller")
    replicas = deploy["spec"]["replicas"]
    assert 2 <= replicas <= 3
    # Only the leader is Ready. Kubernetes stops a Ready old pod only while more than
    # replicas - maxUnavailable pods are available, so anything less than all of them
    # unavailable would wait forever for a new pod to become Ready.
    strategy = deploy["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    rolling = strategy["rollingUpdate"]
    assert resolved(rolling["maxUnavailable"], replicas, up=False) >= replicas, rolling
    assert resolved(rolling.get("maxSurge", 0), replicas, up=True) == 0, rolling
    spec = pod_spec(deploy)
    assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert not [d for d in by_kind(docs, "PersistentVolumeClaim")
                if d["metadata"]["name"] == "sia-store"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (term,) = spec["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    check_pair_container(docs, controller_container(docs), spec)


def check_pair_container(docs: list[dict[str, Any]], c: dict[str, Any],
                         spec: dict[str, Any]) -> None:
    env = {e["name"]: e for e in c["env"]}
    # The DSN and the password come from one Secret, never from the ConfigMap.
    secret = env["SIA_STORE"]["valueFrom"]["secretKeyRef"]
    assert secret["key"] == "dsn"
    password_file = Path(env["SIA_STORE_PASSWORD_FILE"]["value"])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[str(password_file.parent)])
    assert volume["secret"]["secretName"] == secret["name"]
    assert password_file.name == "password" and "items" not in volume["secret"]
    (config,) = by_kind(docs, "ConfigMap")
    toml = tomllib.loads(config["data"]["controller.toml"])["controller"]
    assert not {"store", "store_password_file"} & set(toml)
    assert "postgres" not in config["data"]["controller.toml"].replace("PostgreSQL", "")
    # A standby names the leader by its pod IP and the client port.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--advertise=$(POD_IP):{ports['grpc']}" in c["args"]
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # Ready: SERVING (the leader only). Alive: any answer (a standby too).
    ready = parse(_healthcheck_parser(), c["readinessProbe"]["exec"]["command"][1:])
    live = parse(_healthcheck_parser(), c["livenessProbe"]["exec"]["command"][1:])
    assert not ready.any_status and live.any_status
    assert (ready.addr, ready.ca, ready.server_name) == (live.addr, live.ca, live.server_name)
    # Agents: one DNS name, the Service, which routes to the leader.
    (agent,) = pod_spec(one(docs, "DaemonSet", "sia-nodeagent"))["containers"]
    (target,) = [a.split("=", 1)[1] for a in agent["args"] if a.startswith("--controller=")]
    service = one(docs, "Service", "sia-controller")
    assert target == f"sia-controller.sia-system.svc:{ports['agents']}"
    assert "," not in target and service["metadata"]["namespace"] == "sia-system"


def test_the_pair_component_patches_only_the_controller_and_its_claim() -> None:
    k = kustomization(HA)
    assert k["kind"] == "Component"
    targets = [(d["kind"], d["metadata"]["name"]) for p in k["patches"]
               for d in documents(HA / p["path"])]
    assert sorted(targets) == [("Deployment", "sia-controller"),
                               ("PersistentVolumeClaim", "sia-store")]
