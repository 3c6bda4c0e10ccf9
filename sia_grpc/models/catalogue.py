"""The catalogue of known applications: what the shipped artifact data says about
each one, as the scheduler needs it (names, batch sizes, per-type micro-batch
limits, restart cost).

Model data, read from the same files as `sia_grpc.models.profiles`: the controller
validates job specs against it, the simulator and the modeled agents build their
emulation of an application on it (`sia_grpc.emulation`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sia_grpc.models.profiles import (
    APPLICATIONS,
    available_models,
    available_types,
    load_placements,
    validation_batch_sizes,
)

__all__ = ["SUPPORTED_APPLICATIONS", "UNSUPPORTED", "AppInfo", "application"]

UNSUPPORTED = MappingProxyType(
    {"gpt_pmp": "pipeline-parallel profiles (sync > step) are not supported"})
SUPPORTED_APPLICATIONS: tuple[str, ...] = tuple(a for a in APPLICATIONS if a not in UNSUPPORTED)


@dataclass(frozen=True)
class AppInfo:
    """One known application."""

    name: str
    init_batch_size: int  # smallest validation batch size
    max_batch_size: int  # largest validation batch size
    num_epochs: int
    restart_delay: float  # s of checkpoint-restore per (re)allocation
    slowdown: float  # measured step and sync times are multiplied by this
    gpu_types: tuple[str, ...]  # types with a placements file
    # per type: (min, max) local batch size measured in its placements file
    local_bsz_limits: Mapping[str, tuple[int, int]]


@functools.cache
def application(name: str) -> AppInfo:
    """The catalogue's entry for `name`; ValueError naming the known ones otherwise."""
    if name in UNSUPPORTED:
        raise ValueError(f"application: {name!r}: {UNSUPPORTED[name]}")
    if name not in APPLICATIONS or name not in available_models():
        known = ", ".join(SUPPORTED_APPLICATIONS)
        raise ValueError(f"application: unknown {name!r}; choose one of {known}")
    spec = APPLICATIONS[name]
    sizes = validation_batch_sizes(name)
    if not sizes:
        raise ValueError(f"application: {name!r} has no validation files")
    types = available_types(name)
    limits = {}
    for t in types:
        bsz = load_placements(name, t).local_bsz
        limits[t] = (int(bsz.min()), int(bsz.max()))
    return AppInfo(name=name, init_batch_size=sizes[0], max_batch_size=sizes[-1],
                   num_epochs=spec.num_epochs, restart_delay=spec.restart_delay,
                   slowdown=spec.slowdown, gpu_types=types,
                   local_bsz_limits=MappingProxyType(limits))
