"""This node's GPUs: found through NVML, declared on the command line, or emulated.

One agent is one node is one GPU type: `Register` lists a single inventory entry.

* NVML (`pynvml`, optional and not a dependency): the GPUs the agent may use
  (all, or those its own CUDA_VISIBLE_DEVICES names), their device names mapped
  to the scheduler's type names (`gpu_type_for`). A node with mixed GPU models
  is refused: run one agent per model, each with its CUDA_VISIBLE_DEVICES.
* Declared (`--gpus TYPE:COUNT`): taken as given when NVML is missing; with
  NVML it renames the type and may use fewer GPUs than were found.
* Emulated (`--emulate TYPE:COUNT`): THIS IS EMULATION, NOT A GPU NODE. Workers
  run on the CPU, and each step is stretched to `SIA_PACE` times its measured
  time (`emulation_pace`), so a declared type runs at its speed relative to the
  fastest type in the shipped profiles. The absolute speed is the CPU's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_PACE_APPLICATION", "NodeGpus", "discover_nvml", "emulated_types",
    "emulation_pace", "gpu_type_for", "parse_gpu_spec", "resolve_inventory",
]

# The application whose profiles give the relative GPU speeds when a job's own
# application has no profile for the emulated type (or names none).
DEFAULT_PACE_APPLICATION = "cifar10"

# NVML device names -> the type names the shipped profiles and clusters use
# (sia_grpc/data/artifact/README.md). First match wins. H100 and H200 are newer than
# the profiles: they get a type of their own, one per model whatever the variant
# ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe" -> h100), which no shipped profile
# knows (`unknown_type_warning`; docs/gpu-check.md).
_NVML_TYPES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), t) for p, t in (
        (r"\ba100\b", "dgx-ext"),
        (r"\bv100\b", "azure"),
        (r"\bt4\b", "aws"),
        (r"\b2080\s*ti\b", "rtx"),
        (r"\brtx\s*6000\b", "quad"),
        (r"\bh100\b", "h100"),
        (r"\bh200\b", "h200"),
    ))


@dataclass(frozen=True)
class NodeGpus:
    """The node's inventory as the agent registers it."""

    gpu_type: str
    count: int
    source: str  # "nvml", "declared" or "emulated"
    names: tuple[str, ...] = ()  # NVML device names, when known

    @property
    def emulated(self) -> bool:
        return self.source == "emulated"


def parse_gpu_spec(text: str) -> tuple[str, int]:
    """`TYPE:COUNT` -> (type, count); ValueError with a message for a user. The type
    is named as NVML discovery would name it (`a100:4` is 4 dgx-ext GPUs), so a
    declared node and a discovered one of the same model are one type."""
    if "," in text:
        raise ValueError(
            f"one agent is one node with one GPU type, got {text!r}: run one agent per "
            f"type (e.g. one with rtx:2 and another with a100:2)")
    gpu_type, sep, count = text.rpartition(":")
    if not sep or not gpu_type or not count.isdigit() or int(count) < 1:
        raise ValueError(f"expected TYPE:COUNT such as rtx:8, got {text!r}")
    return gpu_type_for(gpu_type), int(count)


def gpu_type_for(device_name: str) -> str:
    """The scheduler's type name for an NVML device name: the profiles' name for
    known models (A100 -> dgx-ext, V100 -> azure, T4 -> aws, RTX 2080 Ti -> rtx,
    Quadro RTX 6000 -> quad; every H100 -> h100, every H200 -> h200: types of their
    own, with no shipped profile), else the name in lower case with dashes
    ("NVIDIA GeForce RTX 4090" -> "geforce-rtx-4090")."""
    for pattern, gpu_type in _NVML_TYPES:
        if pattern.search(device_name):
            return gpu_type
    name = re.sub(r"^(nvidia|tesla)\s+", "", device_name.strip(), flags=re.IGNORECASE)
    name = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return name or "gpu"


def unknown_type_warning(gpu_type: str) -> str | None:
    """What to tell the operator of a node whose type no shipped profile knows, or
    None: its GPUs can run only jobs that give batch limits for it (the shipped
    applications' jobs never go there)."""
    from sia_grpc.models.profiles import profiled_gpu_types

    known = profiled_gpu_types()
    if gpu_type in known:
        return None
    return (f"GPU type {gpu_type!r} has no shipped profile (known: {', '.join(known)}): "
            f"only jobs whose type_batch_limits name {gpu_type!r} can run here, and the "
            f"controller profiles each of them on it when it arrives; if these are "
            f"one of the known models, name them so (e.g. --gpus dgx-ext:N for A100s)")


def _visible(env: Mapping[str, str]) -> list[str] | None:
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return [d.strip() for d in text.split(",") if d.strip()]


def discover_nvml(env: Mapping[str, str] | None = None) -> NodeGpus | None:
    """The GPUs NVML sees (restricted to CUDA_VISIBLE_DEVICES when set), or None
    when pynvml is not installed or NVML does not start (no driver, no GPU).
    ValueError for a node with more than one GPU model."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver, no device
        return None
    try:
        visible = _visible(os.environ if env is None else env)
        if visible is None:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(pynvml.nvmlDeviceGetCount())]
        else:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit()
                       else pynvml.nvmlDeviceGetHandleByUUID(d) for d in visible]
        names = tuple(_text(pynvml.nvmlDeviceGetName(h)) for h in handles)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    if not names:
        return None
    types = sorted({gpu_type_for(n) for n in names})
    if len(types) > 1:
        raise ValueError(
            f"this node has more than one GPU model ({', '.join(sorted(set(names)))}); "
            f"one agent serves one type: run one agent per model, each with its own "
            f"CUDA_VISIBLE_DEVICES")
    return NodeGpus(types[0], len(names), "nvml", names)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def resolve_inventory(*, declared: tuple[str, int] | None = None,
                      emulate: tuple[str, int] | None = None,
                      nvml: Callable[[], NodeGpus | None] = discover_nvml) -> NodeGpus:
    """The inventory a torch-backed agent registers. ValueError says what to pass."""
    if emulate is not None:
        if declared is not None:
            raise ValueError("give either --gpus (real GPUs) or --emulate (CPU), not both")
        gpu_type, count = emulate
        emulation_pace(gpu_type)  # a type the profiles know, or a clear error
        return NodeGpus(gpu_type, count, "emulated")
    found = nvml()
    if found is None:
        if declared is None:
            raise ValueError(
                "no GPUs found (pynvml is not installed, or NVML sees no GPU): declare them "
                "with --gpus TYPE:COUNT, or run on the CPU with --emulate TYPE:COUNT")
        return NodeGpus(declared[0], declared[1], "declared")
    if declared is None:
        return found
    if declared[1] > found.count:
        raise ValueError(f"--gpus declares {declared[1]} GPUs but NVML finds {found.count} "
                         f"({', '.join(found.names)})")
    return NodeGpus(declared[0], declared[1], "declared", found.names[:declared[1]])


@functools.cache
def _paces(application: str) -> dict[str, float]:
    """Relative 1-GPU step time of every type `application` has a profile for: the
    step time at the application's initial batch size (clamped to the local batch
    range every type measured) over the fastest type's."""
    from sia_grpc.emulation import load_app  # the profile data: loaded on first use

    app = load_app(application)
    limits = [app.local_bsz_limits(t) for t in app.gpu_types]
    lo, hi = max(lim[0] for lim in limits), min(lim[1] for lim in limits)
    b = min(max(app.init_batch_size, lo), hi) if lo <= hi else lo
    times = {t: app.step_time(t, 1, 1, b)[0] for t in app.gpu_types}
    fastest = min(times.values())
    return {t: s / fastest for t, s in times.items()}


def emulated_types() -> tuple[str, ...]:
    """GPU types `--emulate` accepts: those the default application has a profile for."""
    return tuple(sorted(_paces(DEFAULT_PACE_APPLICATION)))


def emulation_pace(gpu_type: str, application: str = "") -> float:
    """SIA_PACE for an emulated `gpu_type`: its step time over the fastest type's
    (1.0 for the fastest, > 1 for slower types), from `application`'s profiles when
    it has one for the type, else from `DEFAULT_PACE_APPLICATION`'s. ValueError for
    a type no shipped profile knows."""
    if application:
        try:
            paces = _paces(application)
        except ValueError:  # not an application with shipped profiles
            paces = {}
        if gpu_type in paces:
            return paces[gpu_type]
    paces = _paces(DEFAULT_PACE_APPLICATION)
    if gpu_type not in paces:
        raise ValueError(f"cannot emulate GPU type {gpu_type!r}: no shipped profile gives "
                         f"its speed (known: {', '.join(sorted(paces))})")
    return paces[gpu_type]
