"""Loaders for the Sia artifact's job profiles shipped in `sia_grpc/data/artifact/`,
the per-application facts the simulator needs, and ready-made job models.

Columns are read by header name: their order differs between files.
"""

from __future__ import annotations

import copy
import csv
import functools
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from sia_grpc.models.bootstrap import JobGoodputModel
from sia_grpc.models.efficiency import grad_params_at_progress
from sia_grpc.models.estimator import ThroughputEstimator

__all__ = [
    "Application",
    "APPLICATIONS",
    "StepTimes",
    "ValidationTable",
    "available_models",
    "available_types",
    "validation_batch_sizes",
    "load_placements",
    "load_scalability",
    "load_seed_profiles",
    "load_validation",
    "job_model_from_artifact",
]

# Seed profiles name GPUs as the paper does; everything else uses the cluster names.
_SEED_TYPE_NAMES = {"t4": ("aws",), "v100": ("azure",), "dgx": ("dgx", "dgx-ext")}


@dataclass(frozen=True)
class Application:
    name: str
    num_epochs: int  # training ends after this many epochs
    restart_delay: float  # seconds of checkpoint-restore per (re)allocation, in the simulator
    slowdown: float  # simulated-time slowdown calibrated against the physical cluster


# From the artifact README. gpt_pmp's epoch count is not stated there; 2 is the
# length of its validation files (copies of bert's).
APPLICATIONS: Mapping[str, Application] = MappingProxyType({
    a.name: a for a in (
        Application("bert", 2, 120.0, 1.2),
        Application("cifar10", 100, 50.0, 1.8),
        Application("deepspeech2", 80, 25.0, 1.2),
        Application("imagenet", 90, 250.0, 1.2),
        Application("yolov3", 50, 80.0, 1.2),
        Application("ncf", 10, 15.0, 1.5),
        Application("gpt_pmp", 2, 30.0, 1.2),
    )
})


@dataclass(frozen=True, eq=False)
class StepTimes:
    """Measured step times, one row per (placement, local batch size)."""

    num_nodes: np.ndarray  # int64
    num_replicas: np.ndarray  # int64
    local_bsz: np.ndarray  # int64
    step_time: np.ndarray  # s per optimizer step (syncing micro-batch)
    sync_time: np.ndarray  # s of all-reduce within step_time
    placement: tuple[str, ...] | None = None  # digit strings, placements files only

    def __len__(self) -> int:
        return len(self.step_time)


@dataclass(frozen=True, eq=False)
class ValidationTable:
    """Per-epoch training record at one initial batch size."""

    init_batch_size: int
    progress: np.ndarray  # cumulative, at the end of each epoch
    iteration: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray

    def __len__(self) -> int:
        return len(self.progress)


def _root() -> Traversable:
    return resources.files("sia_grpc").joinpath("data", "artifact")


def _read_csv(*parts: str) -> dict[str, list[str]]:
    path = _root().joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"no artifact file {'/'.join(parts)}")
    with io.StringIO(path.read_text(encoding="utf-8")) as f:
        reader = csv.DictReader(f)
        cols: dict[str, list[str]] = {name.strip(): [] for name in reader.fieldnames or ()}
        for row in reader:
            for name, value in row.items():
                cols[name.strip()].append(value.strip())
    return cols


def _frozen(values: npt.ArrayLike, dtype: npt.DTypeLike) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype)
    arr.setflags(write=False)
    return arr


def _ints(values: list[str]) -> npt.NDArray[np.int64]:
    arr = np.asarray(values, dtype=float)
    if np.any(arr != np.round(arr)):
        raise ValueError("expected integer values")
    return _frozen(arr.astype(np.int64), np.int64)


def _step_times(cols: dict[str, list[str]], nodes: npt.ArrayLike, reps: npt.ArrayLike,
                placement: tuple[str, ...] | None = None) -> StepTimes:
    return StepTimes(num_nodes=_frozen(nodes, np.int64), num_replicas=_frozen(reps, np.int64),
                     local_bsz=_ints(cols["local_bsz"]),
                     step_time=_frozen(cols["step_time"], float),
                     sync_time=_frozen(cols["sync_time"], float), placement=placement)


@functools.cache
def available_models() -> tuple[str, ...]:
    return tuple(sorted(p.name for p in _root().joinpath("profiles").iterdir() if p.is_dir()))


@functools.cache
def available_types(model: str) -> tuple[str, ...]:
    """GPU types with a placements file for `model`."""
    names = (p.name for p in _root().joinpath("profiles", model).iterdir())
    return tuple(sorted(n[len("placements-"):-len(".csv")] for n in names
                        if n.startswith("placements-") and n.endswith(".csv")))


@functools.cache
def profiled_gpu_types() -> tuple[str, ...]:
    """Every GPU type some shipped application has a profile for."""
    models = (p.name for p in _root().joinpath("profiles").iterdir() if p.is_dir())
    return tuple(sorted({t for m in models for t in available_types(m)}))


@functools.cache
def validation_batch_sizes(model: str) -> tuple[int, ...]:
    names = (p.name for p in _root().joinpath("profiles", model).iterdir())
    return tuple(sorted(int(n[len("validation-"):-len(".csv")]) for n in names
                        if n.startswith("validation-") and n.endswith(".csv")))


@functools.cache
def load_placements(model: str, gpu_type: str) -> StepTimes:
    """`placements-<type>.csv`: nodes = digits of the placement, replicas = their sum."""
    cols = _read_csv("profiles", model, f"placements-{gpu_type}.csv")
    placement = tuple(cols["placement"])
    if not all(p.isdigit() for p in placement):
        raise ValueError(f"bad placement in {model}/{gpu_type}")
    return _step_times(cols, [len(p) for p in placement],
                       [sum(map(int, p)) for p in placement], placement)


@functools.cache
def load_scalability(model: str, gpu_type: str) -> StepTimes:
    cols = _read_csv("profiles", model, f"scalability-{gpu_type}.csv")
    return _step_times(cols, _ints(cols["num_nodes"]), _ints(cols["num_replicas"]))


@functools.cache
def _seed_profiles(model: str) -> tuple[tuple[str, StepTimes], ...]:
    if not _root().joinpath("seed-profiles", f"{model}.csv").is_file():
        return ()
    cols = _read_csv("seed-profiles", f"{model}.csv")
    types = np.asarray(cols["gpu_type"])
    out: list[tuple[str, StepTimes]] = []
    for seed_name in sorted(set(types.tolist())):
        mask = types == seed_name
        sub = {k: [v for v, m in zip(vals, mask, strict=True) if m] for k, vals in cols.items()}
        reps = [sum(map(int, p)) for p in sub["placement"]]
        if any(r != 1 for r in reps):
            raise ValueError(f"seed profile of {model} on {seed_name} is not 1-GPU")
        table = _step_times(sub, [1] * len(reps), reps, tuple(sub["placement"]))
        out.extend((name, table) for name in _SEED_TYPE_NAMES.get(seed_name, (seed_name,)))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def load_seed_profiles(model: str) -> dict[str, StepTimes]:
    """1-GPU profiles by cluster type name (t4 -> aws, v100 -> azure; dgx -> dgx and
    dgx-ext). Empty for a model without seed profiles (gpt_pmp)."""
    return dict(_seed_profiles(model))


@functools.cache
def load_validation(model: str, init_bsz: int) -> ValidationTable:
    cols = _read_csv("profiles", model, f"validation-{init_bsz}.csv")
    return ValidationTable(
        init_batch_size=int(init_bsz),
        progress=_frozen(cols["progress"], float),
        iteration=_frozen(cols["iteration"], float),
        metric=_frozen(cols["metric"], float),
        grad_sqr=_frozen(cols["grad_sqr"], float),
        grad_var=_frozen(cols["grad_var"], float),
    )


@functools.cache
def _template_estimator(model: str, gpu_types: tuple[str, ...],
                        bootstrap: bool) -> ThroughputEstimator:
    est = ThroughputEstimator()
    if bootstrap:
        seeds = load_seed_profiles(model)
        if not seeds:
            raise ValueError(f"{model} has no seed profiles to bootstrap from")
        for t in gpu_types:
            if t in seeds:
                s = seeds[t]
                est.add_profile(t, s.local_bsz, s.step_time, s.sync_time)
    else:
        # "Oracle": every placement the artifact measured, so no type is projected.
        for t in gpu_types:
            if t not in available_types(model):
                continue
            p = load_placements(model, t)
            est.add_observation(t, p.num_nodes, p.num_replicas, p.local_bsz, 0,
                                p.step_time, p.sync_time)
    for t in est.known_types:
        est.time_fn(t)  # fit now, once, so that copies start with warm caches
    return est


def job_model_from_artifact(model: str, *, gpu_types: Iterable[str] | None = None,
                            bootstrap: bool = True, progress: float = 0.0) -> JobGoodputModel:
    """A job model for one of the artifact's applications.

    bootstrap=True: 1-GPU seed profiles only (Sia's bootstrap); False: all the
    type's measured placements (the paper's oracle). Gradient statistics are those
    of the smallest initial batch size's run after `progress` (0..1) of it; the
    batch-size range is the validation files' range; per-type local batch limits are
    the range of local batch sizes measured in that type's placements file. Types
    without a placements file or seed profile are left out (goodput 0).
    Each call returns a model with its own estimator.
    """
    types = tuple(sorted(set(available_types(model) if gpu_types is None else gpu_types)))
    sizes = validation_batch_sizes(model)
    if not sizes:
        raise ValueError(f"{model} has no validation files")
    grad = grad_params_at_progress(load_validation(model, sizes[0]), progress)
    limits = {}
    for t in types:
        if t in available_types(model):
            bsz = load_placements(model, t).local_bsz
            limits[t] = (int(bsz.min()), int(bsz.max()))
    est = copy.deepcopy(_template_estimator(model, types, bootstrap))
    return JobGoodputModel(estimator=est, grad=grad, init_batch_size=sizes[0],
                           max_batch_size=sizes[-1], local_bsz_limits=limits)
