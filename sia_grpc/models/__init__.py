"""Goodput models: Pollux's throughput and statistical-efficiency models, Sia's
bootstrapped per-GPU-type estimates, and loaders for the shipped artifact profiles.

The functions `throughput.throughput` and `efficiency.efficiency` are not re-exported:
at package level those names are the submodules (re-exporting would shadow them)."""

from sia_grpc.models.bootstrap import JobGoodputModel
from sia_grpc.models.efficiency import GradParams, gain, grad_params_at_progress
from sia_grpc.models.estimator import ThroughputEstimator
from sia_grpc.models.goodput import (
    GoodputEstimate,
    GoodputFunction,
    choose_batch,
    fixed_batch,
    split_local_batch,
)
from sia_grpc.models.profiles import (
    APPLICATIONS,
    Application,
    StepTimes,
    ValidationTable,
    available_models,
    available_types,
    job_model_from_artifact,
    load_placements,
    load_scalability,
    load_seed_profiles,
    load_validation,
    validation_batch_sizes,
)
from sia_grpc.models.throughput import (
    PerfParams,
    compute_time,
    fit_perf_params,
    network_time,
    step_time,
    sync_time,
)

__all__ = [
    "APPLICATIONS",
    "Application",
    "GoodputEstimate",
    "GoodputFunction",
    "GradParams",
    "JobGoodputModel",
    "PerfParams",
    "StepTimes",
    "ThroughputEstimator",
    "ValidationTable",
    "available_models",
    "available_types",
    "choose_batch",
    "compute_time",
    "fit_perf_params",
    "fixed_batch",
    "gain",
    "grad_params_at_progress",
    "job_model_from_artifact",
    "load_placements",
    "load_scalability",
    "load_seed_profiles",
    "load_validation",
    "network_time",
    "split_local_batch",
    "step_time",
    "sync_time",
    "validation_batch_sizes",
]
