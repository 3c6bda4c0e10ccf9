"""Checking a submitted `JobSpec` and filling in what the application implies: what a
spec means, for whoever schedules it (the controller, the Slurm bridge).

Every rule raises `errors.invalid(field, message)`, so a bad request comes back
as INVALID_ARGUMENT naming the field ("spec.max_gpus: 2 is below min_gpus 4"),
never as a crash or a silent default. Zero means "unset" in proto3; where an
unset field has a default, the default is stated here and nowhere else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError, invalid
from sia_grpc.models.catalogue import SUPPORTED_APPLICATIONS, AppInfo, application
from sia_grpc.names import MAX_ID, is_name
from sia_grpc.policy.types import Adaptivity

__all__ = ["ADAPTIVITY", "Resolved", "resolve"]

_MAX_GPUS = 1 << 16
_MAX_BATCH = 1 << 24
_MAX_LABELS = 64
_MAX_LIST = 64  # allowed_gpu_types, type_batch_limits
_MAX_ARGS, _MAX_ARG = 256, 4096  # command: arguments, characters each
_MAX_EPOCHS = 1e6
_MAX_SAMPLES = 1 << 48
_MAX_APPLICATION = 128

ADAPTIVITY = {pb.ADAPTIVITY_ADAPTIVE: Adaptivity.ADAPTIVE,
              pb.ADAPTIVITY_STRONG_SCALING: Adaptivity.STRONG_SCALING,
              pb.ADAPTIVITY_RIGID: Adaptivity.RIGID}


@dataclass(frozen=True)
class Resolved:
    """A valid spec's scheduling parameters, defaults applied."""

    adaptivity: Adaptivity
    min_gpus: int
    max_gpus: int | None
    num_gpus: int | None
    pipeline_gpus: int
    allowed_types: frozenset[str] | None
    batch_size: int | None  # fixed global batch (strong-scaling, rigid)
    init_batch_size: int  # the batch the gradient statistics are normalised to
    max_batch_size: int
    local_bsz_limits: Mapping[str, tuple[int, int]]  # per GPU type, (min, max) micro-batch
    restart_cost: float


def _application(name: str) -> AppInfo | None:
    """The catalogue's entry for a known application, or None."""
    return application(name) if name in SUPPORTED_APPLICATIONS else None


def _app_limits(name: str) -> Mapping[str, tuple[int, int]]:
    app = _application(name)
    return app.local_bsz_limits if app is not None else {}


def resolve(spec: pb.JobSpec, path: str = "spec") -> Resolved:
    """Validate `spec` and return its scheduling parameters; raises ApiError."""
    bad = _invalid_in(path)
    if spec.name and not is_name(spec.name, MAX_ID):
        raise bad("name", f"{spec.name!r} is not a valid name ([A-Za-z0-9._-], at most 63)")
    if spec.adaptivity not in ADAPTIVITY:
        raise bad("adaptivity", "must be set to adaptive, strong-scaling or rigid")
    adaptivity = ADAPTIVITY[spec.adaptivity]
    app = _application(spec.application)
    _check_program(spec, app, bad)
    pipeline, min_gpus, max_gpus, num_gpus = _gpus(spec, adaptivity, bad)
    for i, t in enumerate(spec.allowed_gpu_types):
        if not is_name(t, MAX_ID):
            raise bad(f"allowed_gpu_types[{i}]", f"{t!r} is not a valid GPU type name")
    limits, init, max_batch = _batches(spec, adaptivity, app, bad)
    which = spec.WhichOneof("target")
    if which == "epochs" and not (math.isfinite(spec.epochs) and 0 <= spec.epochs <= _MAX_EPOCHS):
        raise bad("epochs", f"must be a number in [0, {_MAX_EPOCHS:g}], got {spec.epochs}")
    if which == "samples" and spec.samples > _MAX_SAMPLES:
        raise bad("samples", f"{spec.samples} is above the limit of {_MAX_SAMPLES}")
    if not (math.isfinite(spec.restart_cost_s) and 0 <= spec.restart_cost_s <= 86400):
        raise bad("restart_cost_s", f"must be within [0, 86400] seconds, got {spec.restart_cost_s}")
    restart = spec.restart_cost_s or (app.restart_delay if app is not None else 30.0)
    _check_owner(spec, bad)
    _check_env(spec.env, path)
    mem = spec.memory_mib_per_gpu
    if mem and not _MIN_MEMORY_MIB <= mem <= _MAX_MEMORY_MIB:
        raise bad("memory_mib_per_gpu", f"must be within [{_MIN_MEMORY_MIB}, "
                  f"{_MAX_MEMORY_MIB}] MiB (0: the node's share), got {mem}")
    return Resolved(
        adaptivity=adaptivity, min_gpus=min_gpus, max_gpus=max_gpus, num_gpus=num_gpus,
        pipeline_gpus=pipeline,
        allowed_types=frozenset(spec.allowed_gpu_types) if spec.allowed_gpu_types else None,
        batch_size=spec.batch_size if adaptivity is not Adaptivity.ADAPTIVE else None,
        init_batch_size=int(init), max_batch_size=int(max_batch),
        local_bsz_limits=limits, restart_cost=float(restart))


# `bad(field, message)`: the INVALID_ARGUMENT error naming `path.field`.
_Bad = Callable[[str, str], ApiError]


def _invalid_in(path: str) -> _Bad:
    def bad(field: str, message: str) -> ApiError:
        return invalid(f"{path}.{field}", message)

    return bad


def _check_program(spec: pb.JobSpec, app: AppInfo | None, bad: _Bad) -> None:
    """What the job runs (its application, its command) and the sizes of its lists
    and counts."""
    if not spec.application:
        raise bad("application", "must be set (the model the job trains, e.g. cifar10)")
    if len(spec.application) > _MAX_APPLICATION:
        raise bad("application", f"at most {_MAX_APPLICATION} characters")
    if len(spec.command) > _MAX_ARGS:
        raise bad("command", f"at most {_MAX_ARGS} arguments")
    for i, arg in enumerate(spec.command):
        if len(arg) > _MAX_ARG or "\x00" in arg:
            raise bad(f"command[{i}]", f"at most {_MAX_ARG} characters, no NUL")
    if spec.command and not spec.command[0]:
        raise bad("command[0]", "the program to run must not be empty")
    for field in ("allowed_gpu_types", "type_batch_limits"):
        if len(getattr(spec, field)) > _MAX_LIST:
            raise bad(field, f"at most {_MAX_LIST} entries")
    if app is None and not spec.command:
        raise bad("application", f"unknown application {spec.application!r} and no command to run")
    for field in ("min_gpus", "max_gpus", "num_gpus", "pipeline_gpus"):
        if getattr(spec, field) > _MAX_GPUS:
            raise bad(field, f"{getattr(spec, field)} is above the limit of {_MAX_GPUS}")
    for field in ("batch_size", "max_batch_size"):
        if getattr(spec, field) > _MAX_BATCH:
            raise bad(field, f"{getattr(spec, field)} is above the limit of {_MAX_BATCH}")


def _gpus(spec: pb.JobSpec, adaptivity: Adaptivity,
          bad: _Bad) -> tuple[int, int, int | None, int | None]:
    """The GPU counts, defaults applied: (pipeline, min, max, fixed count)."""
    pipeline = spec.pipeline_gpus or 1
    min_gpus = spec.min_gpus or 1
    max_gpus = spec.max_gpus or None
    if max_gpus is not None and max_gpus < min_gpus:
        raise bad("max_gpus", f"{max_gpus} is below min_gpus {min_gpus}")
    num_gpus = spec.num_gpus or None
    if adaptivity is Adaptivity.RIGID and num_gpus is None:
        raise bad("num_gpus", "required for rigid jobs")
    if num_gpus is not None:
        if num_gpus % pipeline:
            raise bad("num_gpus", f"{num_gpus} is not a multiple of pipeline_gpus {pipeline}")
        if num_gpus < min_gpus or (max_gpus is not None and num_gpus > max_gpus):
            raise bad("num_gpus", f"{num_gpus} is outside [min_gpus, max_gpus]")
    if adaptivity is not Adaptivity.ADAPTIVE and not spec.batch_size:
        raise bad("batch_size", f"required for {adaptivity.value} jobs")
    return pipeline, min_gpus, max_gpus, num_gpus


def _batches(spec: pb.JobSpec, adaptivity: Adaptivity, app: AppInfo | None,
             bad: _Bad) -> tuple[dict[str, tuple[int, int]], int, int]:
    """The batch sizes, the application's where the spec leaves them unset: (the
    micro-batch limits per GPU type, the initial batch, the largest batch)."""
    limits = dict(_app_limits(spec.application))
    for i, lim in enumerate(spec.type_batch_limits):
        f = f"type_batch_limits[{i}]"
        if not is_name(lim.gpu_type, MAX_ID):
            raise bad(f"{f}.gpu_type", f"{lim.gpu_type!r} is not a valid GPU type name")
        if not 1 <= lim.min_local_batch_size <= lim.max_local_batch_size <= _MAX_BATCH:
            raise bad(f, "needs 1 <= min_local_batch_size <= max_local_batch_size")
        limits[lim.gpu_type] = (lim.min_local_batch_size, lim.max_local_batch_size)
    if not limits:
        raise bad("type_batch_limits", "required for an application without shipped profiles")
    init = app.init_batch_size if app is not None else (spec.batch_size or 0)
    if init <= 0:
        raise bad("batch_size", "required for an application without shipped profiles")
    max_batch = spec.max_batch_size or (app.max_batch_size if app is not None else init)
    if adaptivity is Adaptivity.ADAPTIVE and spec.batch_size > max_batch:
        raise bad("batch_size", f"{spec.batch_size} is above max_batch_size {max_batch}")
    max_batch = max(max_batch, spec.batch_size)  # a fixed batch is its own limit
    if max_batch < init:
        raise bad("max_batch_size", f"{max_batch} is below the initial batch size {init}")
    return limits, init, max_batch


def _check_owner(spec: pb.JobSpec, bad: _Bad) -> None:
    """The tenant and the labels."""
    if spec.tenant and not is_name(spec.tenant, MAX_ID):
        raise bad("tenant", f"{spec.tenant!r} is not a valid tenant name")
    if len(spec.labels) > _MAX_LABELS:
        raise bad("labels", f"at most {_MAX_LABELS} labels")
    for key, value in spec.labels.items():
        if not is_name(key, MAX_ID) or len(value) > 256:
            raise bad(f"labels[{key!r}]", "keys are names ([A-Za-z0-9._-]), values at most 256")


# A job's memory per GPU (the nodes' share caps it too): below 64 MiB not even the
# worker's Python starts; 4 TiB per GPU is beyond any machine's share.
_MIN_MEMORY_MIB, _MAX_MEMORY_MIB = 64, 4 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_ENV = 64
# Set by the agent for every worker (sia_grpc.train.contract, torch.distributed): a
# job's own value would be ignored, so it is refused rather than silently dropped.
_AGENT_ENV = frozenset(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "HOME", "TMPDIR"))
# sia_grpc.train's own settings (train/env.py), which a job may choose.
_LIBRARY_SETTINGS = frozenset(("SIA_REPORT_INTERVAL_S", "SIA_CHECKPOINT_INTERVAL_S"))


def _check_env(env: Mapping[str, str], path: str) -> None:
    bad = _invalid_in(path)
    if len(env) > _MAX_ENV:
        raise bad("env", f"at most {_MAX_ENV} variables")
    for key, value in env.items():
        where = f"env[{key!r}]"
        if not _ENV_NAME.match(key):
            raise bad(where, "names are [A-Za-z_][A-Za-z0-9_]*")
        if key in _AGENT_ENV or (key.startswith("SIA_") and key not in _LIBRARY_SETTINGS):
            raise bad(where, "set by the agent for every worker (SIA_* and the "
                             "torch.distributed variables); a job cannot set it")
        if len(value) > 4096 or "\0" in value:
            raise bad(where, "values at most 4096 characters, without NUL")
