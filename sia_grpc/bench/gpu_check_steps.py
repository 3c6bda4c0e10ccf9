"""The steps of `sia_grpc.bench.gpu_check` that need no controller: the install, NVML
discovery, the library's overhead, a profiling pass with out-of-memory detection, and
the throughput model fitted from it.

Each step takes the run's `Plan` and a shared `ctx` dict (what earlier steps found)
and returns its figures with "status": "ok", "skipped" (and a "reason") or "failed".
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD = "gpu-check-record"  # the training job's record, in its checkpoint folder

NO_CUDA = "no CUDA device: skipped"


@dataclass(frozen=True)
class Plan:
    """What one run does: sizes for a GPU, or tiny ones for a dry run on the CPU."""

    cuda: bool
    root: Path  # work files
    overhead: tuple[int, int, int]  # steps, batch, hidden
    profile_sizes: tuple[int, ...]  # micro-batch sizes of the profiling pass
    profile_args: tuple[str, ...]  # the mlp example's size for the pass
    job_args: tuple[str, ...]  # the cluster job's mlp size (besides epochs, batch)
    job_epochs: int
    job_batch: int
    job_max_local: int
    round_s: float


def skipped(reason: str = NO_CUDA) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def failed(reason: str, **figures: Any) -> dict[str, Any]:
    return {"status": "failed", "reason": reason, **figures}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def nvidia_present() -> bool:
    """An NVIDIA driver on this machine (whether or not torch can use it)."""
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def step_install(plan: Plan, ctx: dict) -> dict[str, Any]:
    """What is installed (the Makefile installed it, or found it there): torch and its
    CUDA build, nvidia-ml-py, this package. With an NVIDIA GPU on the machine a CPU
    build of torch, or a missing NVML binding, is a failure saying what to install."""
    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__,
           "torch_cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "nvidia_driver_present": nvidia_present(), "nvidia_ml_py": _version("nvidia-ml-py"),
           "pynvml_importable": importlib.util.find_spec("pynvml") is not None,
           "sia_grpc": _version("sia-grpc")}
    if out["nvidia_driver_present"] and torch.version.cuda is None:
        return failed(f"torch {torch.__version__} is a CPU build on a machine with an NVIDIA "
                      f"GPU: install the CUDA build (make gpu-check TORCH=torch==<version> "
                      f"with a registry that has it; docs/gpu-check.md)", **out)
    if plan.cuda and not out["pynvml_importable"]:
        return failed("nvidia-ml-py is not installed (pip install nvidia-ml-py)", **out)
    return {"status": "ok", **out}


def step_nvml(plan: Plan, ctx: dict) -> dict[str, Any]:
    """The agent's NVML discovery, each GPU's memory, and the type the agent registers."""
    if not plan.cuda:
        return skipped()
    import pynvml  # type: ignore[import-not-found]

    from sia_grpc.nodeagent.gpus import discover_nvml, resolve_inventory, unknown_type_warning

    found = discover_nvml()
    if found is None:
        return failed("NVML found no GPU (discover_nvml returned None)")
    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_total_mib": mem.total // 2**20})
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    inventory = resolve_inventory(nvml=lambda: found)
    warning = unknown_type_warning(inventory.gpu_type)
    ctx["gpu_type"] = inventory.gpu_type
    return {"status": "ok", "driver": driver if isinstance(driver, str) else driver.decode(),
            "gpus": gpus, "discovered": {"names": list(found.names), "count": found.count},
            "gpu_type": inventory.gpu_type, "profiled_type": warning is None,
            "unknown_type_warning": warning,
            "decision": ("a type with shipped profiles" if warning is None else
                         f"registered as {inventory.gpu_type!r}, a type with no shipped profile: "
                         f"jobs that name it in type_batch_limits are profiled on it on "
                         f"arrival (docs/gpu-check.md)")}


def step_overhead(plan: Plan, ctx: dict) -> dict[str, Any]:
    """`python -m sia_grpc.train.overhead` on this device: the plain loop against the
    same loop through sia_grpc.train, and the workers' breakdown (gradient statistics,
    agreement all-reduce; the agreement needs 2 replicas: 2 gloo processes on the CPU,
    2 GPUs on CUDA)."""
    import torch

    steps, batch, hidden = plan.overhead
    world = 2 if not plan.cuda else min(2, torch.cuda.device_count())
    cmd = [sys.executable, "-m", "sia_grpc.train.overhead", "--world", str(world),
           "--steps", str(steps), "--batch", str(batch), "--hidden", str(hidden),
           "--device", "cuda" if plan.cuda else "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode:
        return failed(f"{' '.join(cmd[1:])} exited {proc.returncode}: {proc.stderr[-2000:]}")
    text = proc.stdout
    result = json.loads(text[text.index("{"):])
    single = result["single_process"]
    workers = result[f"world_{world}"]
    return {"status": "ok", "command": " ".join(cmd[1:]), "world": world,
            "plain_step_ms": single["plain_step_ms"],
            "library_step_ms": single["library_step_ms"],
            "library_overhead_fraction": single["library_overhead_fraction"],
            "grad_stats_ms_per_step": single["grad_stats_ms_per_step"],
            "workers": workers, "resumed": result[f"world_{world}_resumed"]}


def mlp_spec(name: str, module: str, args: tuple[str, ...], batch: int, max_batch: int):
    """A job running the mlp example (or its recording wrapper) as the agent runs it."""
    from sia_grpc.api import pb

    return pb.JobSpec(name=name, application="mlp",
                      command=[sys.executable, "-m", module, "--batch-size", str(batch), *args],
                      adaptivity=pb.ADAPTIVITY_ADAPTIVE, batch_size=batch,
                      max_batch_size=max(max_batch, batch))


async def _profile(plan: Plan, gpu_type: str) -> tuple[Any, Path]:
    from sia_grpc.api import pb
    from sia_grpc.nodeagent.torchbackend import TorchBackend

    workdir = plan.root / "profile-agent"
    backend = TorchBackend(gpu_type, 1, workdir=workdir, emulate=not plan.cuda,
                           profile_timeout_s=240.0)
    await backend.open()
    try:
        spec = mlp_spec("gpu-check-profile", "sia_grpc.train.examples.mlp",
                        ("--epochs", "1", *plan.profile_args), plan.profile_sizes[0],
                        plan.profile_sizes[-1])
        tel = await backend.profile(pb.ProfileRequest(
            job_id="gpu-check-profile", generation=0, spec=spec, local_gpu=0,
            local_batch_sizes=list(plan.profile_sizes)))
    finally:
        await backend.close()
    return tel, workdir


def step_profile(plan: Plan, ctx: dict) -> dict[str, Any]:
    """One profiling pass of the mlp example through the agent's torch back-end, over
    `plan.profile_sizes` (on CUDA they reach sizes that cannot fit, to end in an OOM)."""
    gpu_type = ctx.get("gpu_type", "rtx")
    tel, workdir = asyncio.run(_profile(plan, gpu_type))
    samples = sorted(((s.atomic_batch_size, s.step_time_s, s.sync_time_s)
                      for s in tel.samples), key=lambda s: s[0])
    ctx["profile"] = samples
    logs = sorted(workdir.glob("jobs/*/profile-*.log"))
    ctx["profile_log"] = "".join(p.read_text(errors="replace") for p in logs)
    return {"status": "ok", "gpu_type": gpu_type, "emulated": not plan.cuda,
            "sizes_requested": list(plan.profile_sizes),
            "samples": [{"micro_batch": b, "step_ms": 1e3 * t, "sync_ms": 1e3 * s}
                        for b, t, s in samples],
            "grad": {"sqr": tel.grad.sqr, "var": tel.grad.var}}


def step_oom(plan: Plan, ctx: dict) -> dict[str, Any]:
    """The profiling pass ran out of memory at a size too large for the GPU: it ended
    there, exited EXIT_PROFILED with the smaller sizes' samples (not a failure)."""
    if not plan.cuda:
        return skipped()
    if "profile" not in ctx:
        return failed("no profiling pass to look at")
    timed = [b for b, _, _ in ctx["profile"]]
    untimed = [b for b in plan.profile_sizes if b not in timed]
    said = "out of memory" in ctx.get("profile_log", "").lower()
    figures = {"sizes_timed": timed, "first_size_not_timed": untimed[0] if untimed else None,
               "log_mentions_oom": said}
    if not untimed:
        return failed("every size fit in memory: no out-of-memory error was provoked",
                      **figures)
    if untimed != [b for b in plan.profile_sizes if b > max(timed, default=0)]:
        return failed("the pass skipped a size below the largest one timed", **figures)
    return {"status": "ok", **figures}


def step_fit(plan: Plan, ctx: dict) -> dict[str, Any]:
    """Pollux's throughput model (sia_grpc.models.throughput.fit_perf_params) fitted
    to every other profiled size, and its error on the sizes held back."""
    from sia_grpc.models.throughput import fit_perf_params, step_time

    points = ctx.get("profile", [])
    if len(points) < 4:
        return failed(f"{len(points)} profiled sizes: need 4 to fit and hold some back")
    # Every other interior size held back (the ends stay in: no extrapolation).
    held_back = set(range(1, len(points) - 1, 2))
    fit = [p for i, p in enumerate(points) if i not in held_back]
    held = [points[i] for i in sorted(held_back)]
    b, t, s = (list(col) for col in zip(*fit, strict=True))
    params = fit_perf_params(1, 1, b, [tt - ss for tt, ss in zip(t, s, strict=True)], t)
    errors = []
    for bsz, measured, _ in held:
        predicted = float(step_time(params, 1, 1, bsz))
        errors.append({"micro_batch": bsz, "measured_ms": 1e3 * measured,
                       "predicted_ms": 1e3 * predicted,
                       "relative_error": (predicted - measured) / measured})
    worst = max(abs(e["relative_error"]) for e in errors)
    return {"status": "ok", "fitted_sizes": b, "held_back": errors,
            "mean_abs_relative_error": sum(abs(e["relative_error"]) for e in errors)
            / len(errors), "max_abs_relative_error": worst,
            "params": {"alpha_c_ms": 1e3 * params.alpha_c, "beta_c_ms": 1e3 * params.beta_c,
                       "gamma": params.gamma}}
