"""Clusters as the policy sees them: nodes of one GPU type each, and Sia's
configuration set over them.

Sia's configuration set for a GPU type with N nodes of R GPUs is

    {(1 node, 1 GPU), (1, 2), (1, 4), ... (1, R)}  ∪  {(2, 2R), (3, 3R), ... (N, NR)}

i.e. power-of-two partial-node allocations and whole-node multi-node ones. With
that set, any allocation that fits the per-type GPU count also fits the nodes
(the paper's Submesh Shape Covering theorem), which is what lets the ILP carry a
single capacity row per type.

The theorem needs R to be a power of two and equal on all nodes of a type.
Physical nodes that break that are split into *virtual nodes*: every node of a
type is cut into pieces of the largest power of two that divides every node of
that type (a 6-GPU node becomes three 2-GPU virtual nodes; 4- and 8-GPU nodes of
one type become 4-GPU virtual nodes). This gives up some single-node shapes on
odd hardware but never produces an allocation the placer cannot honour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from sia_grpc.names import is_name
from sia_grpc.policy.errors import FieldError


@dataclass(frozen=True, slots=True)
class Node:
    """A physical machine: one GPU type, `num_gpus` GPUs."""

    name: str
    gpu_type: str
    num_gpus: int

    def __post_init__(self) -> None:
        if not is_name(self.name):
            raise FieldError("node.name", f"{self.name!r} is not a valid node name")
        if not is_name(self.gpu_type):
            raise FieldError("node.gpu_type", f"{self.gpu_type!r} is not a valid GPU type name")
        if not isinstance(self.num_gpus, int) or self.num_gpus <= 0:
            raise FieldError("node.num_gpus", f"must be a positive integer, got {self.num_gpus!r}")


@dataclass(frozen=True, slots=True)
class VirtualNode:
    """A power-of-two slice of a physical node; the unit the placer works with.

    GPUs are named by (physical node name, local index); a virtual node owns the
    local indices ``offset .. offset + num_gpus - 1`` of its physical node.
    """

    index: int  # position within its GPU type's virtual-node list
    physical: str
    gpu_type: str
    offset: int
    num_gpus: int

    def gpus(self) -> tuple[GpuId, ...]:
        return tuple(GpuId(self.physical, self.offset + k) for k in range(self.num_gpus))


# GpuId and Config are named tuples, not dataclasses: a round at 32,768 GPUs hashes,
# compares and sorts hundreds of thousands of them, and a tuple's comparisons run in
# C where a dataclass's generated methods run in Python (5-10x slower each).
class GpuId(NamedTuple):
    node: str
    index: int  # type: ignore[assignment]  # (the field, meant to hide tuple.index)

    def __str__(self) -> str:
        return f"{self.node}/{self.index}"


class Config(NamedTuple):
    """An allocation shape: `num_gpus` GPUs of `gpu_type` on `num_nodes` (virtual) nodes."""

    gpu_type: str
    num_nodes: int
    num_gpus: int

    def __str__(self) -> str:
        return f"{self.num_gpus}x{self.gpu_type}" + (
            f" ({self.num_nodes} nodes)" if self.num_nodes > 1 else ""
        )


def _pow2_divisor(n: int) -> int:
    return n & -n


@dataclass(frozen=True)
class Cluster:
    """An immutable set of nodes. Build one with `Cluster.of(nodes)`."""

    nodes: tuple[Node, ...]
    _by_name: Mapping[str, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in by_name:
                raise ValueError(f"nodes: duplicate node name {node.name!r}")
            by_name[node.name] = node
        object.__setattr__(self, "_by_name", by_name)

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Cluster:
        return cls(tuple(sorted(nodes, key=lambda n: (n.gpu_type, n.name))))

    @classmethod
    def uniform(cls, spec: Mapping[str, tuple[int, int]]) -> Cluster:
        """`{"rtx": (3, 8)}` → 3 nodes `rtx-0..2` of 8 GPUs each."""
        return cls.of(
            Node(f"{t}-{i}", t, per_node) for t, (count, per_node) in spec.items()
            for i in range(count)
        )

    def node(self, name: str) -> Node:
        return self._by_name[name]

    @cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_type for n in self.nodes}))

    @cached_property
    def gpus_per_vnode(self) -> Mapping[str, int]:
        """R per type: the largest power of two dividing every node of the type."""
        out: dict[str, int] = {}
        for t in self.gpu_types:
            out[t] = min(_pow2_divisor(n.num_gpus) for n in self.nodes if n.gpu_type == t)
        return out

    @cached_property
    def vnodes(self) -> Mapping[str, tuple[VirtualNode, ...]]:
        out: dict[str, list[VirtualNode]] = {t: [] for t in self.gpu_types}
        for node in self.nodes:
            r = self.gpus_per_vnode[node.gpu_type]
            vs = out[node.gpu_type]
            for off in range(0, node.num_gpus, r):
                vs.append(VirtualNode(len(vs), node.name, node.gpu_type, off, r))
        return {t: tuple(v) for t, v in out.items()}

    @cached_property
    def capacity(self) -> Mapping[str, int]:
        return {t: sum(v.num_gpus for v in self.vnodes[t]) for t in self.gpu_types}

    @property
    def total_gpus(self) -> int:
        return sum(self.capacity.values())

    @cached_property
    def configs(self) -> tuple[Config, ...]:
        """Sia's configuration set, grouped by type (sorted), ascending GPU count."""
        out: list[Config] = []
        for t in self.gpu_types:
            r = self.gpus_per_vnode[t]
            n = len(self.vnodes[t])
            out.extend(Config(t, 1, 2**k) for k in range(int(math.log2(r)) + 1))
            out.extend(Config(t, m, m * r) for m in range(2, n + 1))
        return tuple(out)

    @cached_property
    def config_index(self) -> Mapping[Config, int]:
        """Position of each configuration in `configs`."""
        return {c: k for k, c in enumerate(self.configs)}

    @cached_property
    def gpu_numbering(self) -> Mapping[str, tuple[str, int, int, int, int]]:
        """Physical node -> (type, index of its first virtual node, virtual node size,
        GPU count, number of its first GPU): the placer handles GPUs as these ints,
        which hash far faster than GpuIds."""
        info: dict[str, tuple[str, int, int, int, int]] = {}
        base = 0
        for t in self.gpu_types:
            r = self.gpus_per_vnode[t]
            for vn in self.vnodes[t]:
                if vn.offset == 0:
                    size = self.node(vn.physical).num_gpus
                    info[vn.physical] = (t, vn.index, r, size, base)
                    base += size
        return info

    @cached_property
    def config_arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                     npt.NDArray[np.int64]]:
        """(GPU count, type index into `gpu_types`, node count) per entry of
        `configs`, for vectorised work: the set has ~N per type, thousands at scale."""
        index = {t: k for k, t in enumerate(self.gpu_types)}
        out = (np.array([c.num_gpus for c in self.configs], dtype=np.int64),
               np.array([index[c.gpu_type] for c in self.configs], dtype=np.int64),
               np.array([c.num_nodes for c in self.configs], dtype=np.int64))
        for arr in out:
            arr.setflags(write=False)
        return out

    def first_count(self, want: int, multiple_of: int = 1,
                    gpu_type: str | None = None) -> int | None:
        """The smallest GPU count in the configuration set (of `gpu_type`, or of
        any type) that is ≥ `want` and a multiple of `multiple_of` (None if none)."""
        cache: dict[tuple[int, int, str | None], int | None] = self.__dict__.setdefault(
            "_first_count", {})
        key = (want, multiple_of, gpu_type)
        if key not in cache:
            gpus, types, _ = self.config_arrays
            ok = (gpus >= want) & (gpus % multiple_of == 0)
            if gpu_type is not None:
                ok &= types == self.gpu_types.index(gpu_type)
            cache[key] = int(gpus[ok].min()) if ok.any() else None
        return cache[key]

    @cached_property
    def type_ranges(self) -> tuple[tuple[int, int], ...]:
        """Per type (in `gpu_types` order), its [start, end) slice of `configs`."""
        types = self.config_arrays[1]
        return tuple((int(np.searchsorted(types, k)), int(np.searchsorted(types, k, "right")))
                     for k in range(len(self.gpu_types)))



def paper_hetero_cluster(scale: int = 1) -> Cluster:
    """The paper's heterogeneous 64-GPU cluster: 6×4 aws (t4), 3×8 rtx, 2×8 dgx-ext (a100)."""
    return Cluster.uniform({"aws": (6 * scale, 4), "rtx": (3 * scale, 8),
                            "dgx-ext": (2 * scale, 8)})


def paper_homo_cluster(scale: int = 1) -> Cluster:
    """The paper's homogeneous 64-GPU cluster: 16×4 aws (t4)."""
    return Cluster.uniform({"aws": (16 * scale, 4)})
