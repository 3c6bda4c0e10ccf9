"""Clusters for the simulator, from a small TOML file or by built-in name.

File format (exactly these keys; all required):

    name = "hetero64"            # the cluster's name, for reports

    [[gpu_types]]                # one table per GPU type, at least one
    name = "aws"                 # the type's name, as in the artifact's profiles
    nodes = 6                    # number of nodes of this type (positive integer)
    gpus_per_node = 4            # GPUs on each of them (positive integer)

    [[gpu_types]]
    name = "rtx"
    nodes = 3
    gpus_per_node = 8

Nodes are named `<type>-0`, `<type>-1`, ... as `Cluster.uniform` does. Type names
must be distinct. Nodes whose GPU count is not a power of two are split into
virtual nodes by `Cluster` (see `sia_grpc.policy.cluster`). The simulator has
ground truth only for the artifact's types (`aws`, `rtx`, `dgx-ext`, `dgx`,
`quad`, `azure`); jobs simply cannot use GPUs of any other type.

Built-in names: `hetero64` (the paper's heterogeneous cluster: 6×4 aws, 3×8 rtx,
2×8 dgx-ext) and `homo64` (16×4 aws); the same clusters ship as
`sia_grpc/data/clusters/<name>.toml`. `scale` multiplies every type's node count.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sia_grpc.policy.cluster import Cluster, paper_hetero_cluster, paper_homo_cluster

__all__ = ["BUILTIN_CLUSTERS", "ClusterConfigError", "ClusterSpec", "GpuTypeSpec",
           "load_cluster", "parse_cluster_toml", "read_cluster_spec"]

BUILTIN_CLUSTERS: Mapping[str, Callable[[int], Cluster]] = {
    "hetero64": paper_hetero_cluster,
    "homo64": paper_homo_cluster,
}

_TOP_KEYS = ("name", "gpu_types")
_TYPE_KEYS = ("name", "nodes", "gpus_per_node")


class ClusterConfigError(ValueError):
    """A malformed cluster file; the message names the file and the field."""


@dataclass(frozen=True)
class GpuTypeSpec:
    name: str
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed cluster file."""

    name: str
    gpu_types: tuple[GpuTypeSpec, ...]

    def build(self, scale: int = 1) -> Cluster:
        """The cluster, every type's node count multiplied by `scale`."""
        _check_scale(scale)
        return Cluster.uniform({t.name: (t.nodes * scale, t.gpus_per_node)
                                for t in self.gpu_types})


def _check_scale(scale: int) -> None:
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale: must be a positive integer, got {scale!r}")


def _positive_int(src: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ClusterConfigError(f"{src}: {field}: must be a positive integer, got {value!r}")
    return value


def _string(src: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ClusterConfigError(f"{src}: {field}: must be a non-empty string, got {value!r}")
    return value


def _unknown(src: str, where: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    extra = [k for k in table if k not in allowed]
    if extra:
        raise ClusterConfigError(f"{src}: {where}{extra[0]}: unknown key "
                                 f"(allowed: {', '.join(allowed)})")
    for key in allowed:
        if key not in table:
            raise ClusterConfigError(f"{src}: {where}{key}: missing")


def parse_cluster_toml(text: str, src: str = "<string>") -> ClusterSpec:
    """Parse and validate the TOML text of a cluster file (`src` names it in errors)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ClusterConfigError(f"{src}: invalid TOML: {e}") from None
    _unknown(src, "", doc, _TOP_KEYS)
    name = _string(src, "name", doc["name"])
    types = doc["gpu_types"]
    if not isinstance(types, list) or not types or not all(isinstance(t, dict) for t in types):
        raise ClusterConfigError(f"{src}: gpu_types: must be a non-empty array of tables "
                                 "([[gpu_types]])")
    specs: list[GpuTypeSpec] = []
    for i, t in enumerate(types):
        where = f"gpu_types[{i}]."
        _unknown(src, where, t, _TYPE_KEYS)
        tname = _string(src, where + "name", t["name"])
        if any(s.name == tname for s in specs):
            raise ClusterConfigError(f"{src}: {where}name: duplicate GPU type {tname!r}")
        specs.append(GpuTypeSpec(
            name=tname, nodes=_positive_int(src, where + "nodes", t["nodes"]),
            gpus_per_node=_positive_int(src, where + "gpus_per_node", t["gpus_per_node"])))
    spec = ClusterSpec(name=name, gpu_types=tuple(specs))
    try:
        spec.build()
    except ValueError as e:  # e.g. a type name Cluster rejects
        raise ClusterConfigError(f"{src}: gpu_types: {e}") from None
    return spec


def _shipped(name: str):
    return resources.files("sia_grpc").joinpath("data", "clusters", f"{name}.toml")


def read_cluster_spec(path_or_name: str | os.PathLike[str]) -> ClusterSpec:
    """The spec in a TOML file on disk, or in a shipped one by name (`"hetero64"`)."""
    path = Path(path_or_name)
    if path.is_file():
        src = str(path_or_name)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ClusterConfigError(f"{src}: cannot read: {e}") from None
        return parse_cluster_toml(text, src)
    name = str(path_or_name)
    if name and "/" not in name and "\\" not in name and _shipped(name).is_file():
        return parse_cluster_toml(_shipped(name).read_text(encoding="utf-8"),
                                  f"clusters/{name}.toml")
    raise ClusterConfigError(f"{path_or_name}: no such cluster file or built-in cluster "
                             f"(built-in: {', '.join(BUILTIN_CLUSTERS)})")


def load_cluster(path_or_name: str | os.PathLike[str], scale: int = 1) -> Cluster:
    """A built-in cluster by name (`"hetero64"`, `"homo64"`), or one from a TOML
    file (see the module docstring), every type's node count times `scale`."""
    _check_scale(scale)
    builtin = BUILTIN_CLUSTERS.get(str(path_or_name))
    if builtin is not None and not Path(path_or_name).is_file():
        return builtin(scale)
    return read_cluster_spec(path_or_name).build(scale)
