"""`make gpu-check`: the GPU path, proved in one run (docs/gpu-check.md).

    python -m sia_grpc.bench.gpu_check [--dry] [--out DIR]

On a machine with an NVIDIA GPU: NVML discovery by the agent and the GPU type it
registers; the library's per-step overhead against a plain torch loop; a profiling
pass of the mlp example up to an out-of-memory error; Pollux's throughput model
fitted to the measured step times and its error on sizes held back; a controller and
two torch agents running one real job that is profiled on arrival, moved (checkpoint,
restore, continue) and run to its target with no sample lost or repeated; and the
node isolation of its GPU. Every figure goes to DIR/result.json, a summary to
DIR/summary.txt and stdout.

`--dry` (or no CUDA device): tiny sizes; the agents emulate GPUs on the CPU; the
steps that need CUDA report "no CUDA device: skipped". Exit status 0 when no step
failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sia_grpc.bench import gpu_check_cluster as cluster
from sia_grpc.bench import gpu_check_steps as steps
from sia_grpc.bench.gpu_check_steps import Plan

Step = Callable[[Plan, dict], dict[str, Any]]

# (name, what it shows, the step): in order; later steps read what earlier ones found.
STEPS: tuple[tuple[str, str, Step], ...] = (
    ("install", "torch, its CUDA build, nvidia-ml-py, this package", steps.step_install),
    ("nvml", "NVML discovery by the agent; the GPU type registered", steps.step_nvml),
    ("overhead", "sia_grpc.train's per-step overhead vs a plain loop", steps.step_overhead),
    ("profile", "a profiling pass of the mlp example over batch sizes", steps.step_profile),
    ("oom", "the pass ends at the first size out of memory", steps.step_oom),
    ("fit", "throughput model fitted; error on held-back sizes", steps.step_fit),
    ("job", "controller + 2 torch agents: profile, move, finish", cluster.step_job),
    ("samples", "no sample lost or repeated across the move", cluster.step_samples),
    ("isolation", "each worker sees only its own GPU", cluster.step_isolation),
)


def make_plan(cuda: bool, root: Path, job_epochs: int = 0) -> Plan:
    """Sizes: on a GPU, a pass whose largest sizes cannot fit (an MLP 131072 wide, about
    2 MB of activations per sample: 2^16 samples need more than an H200's 141 GB); on
    the CPU, tiny ones. The job is long enough to be moved before it ends (raise
    `job_epochs` where it is not: the job step fails saying so)."""
    from sia_grpc.controller.machine.validation import profile_batch_sizes

    if cuda:
        return Plan(cuda=True, root=root, overhead=(300, 256, 1024),
                    profile_sizes=tuple(profile_batch_sizes(16, 2**17, 10)),
                    profile_args=("--hidden", str(2**17), "--samples", str(2**17)),
                    job_args=("--hidden", "4096", "--samples", "32768"),
                    job_epochs=job_epochs or 60, job_batch=128, job_max_local=256, round_s=3.0)
    return Plan(cuda=False, root=root, overhead=(100, 64, 64),
                profile_sizes=tuple(profile_batch_sizes(8, 512, 8)),
                profile_args=("--hidden", "64", "--samples", "2048"),
                job_args=("--hidden", "4096", "--samples", "4096"),
                job_epochs=job_epochs or 25, job_batch=32, job_max_local=64, round_s=2.0)


def run_step(name: str, step: Step, plan: Plan, ctx: dict) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        out = step(plan, ctx)
    except Exception as exc:  # a step's failure is a figure, not the end of the run
        out = steps.failed(f"{type(exc).__name__}: {exc}",
                           traceback=traceback.format_exc()[-4000:])
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def _line(name: str, r: dict[str, Any]) -> str:
    """One summary line: the step's status and its headline figures."""
    if r["status"] != "ok":
        return f"{name:10s} {r['status'].upper()}: {r.get('reason', '')}"[:400]
    f = {
        "install": lambda: f"torch {r['torch']} (CUDA {r['torch_cuda_build']}), "
                           f"nvidia-ml-py {r['nvidia_ml_py']}",
        "nvml": lambda: f"{r['discovered']['count']} x {r['discovered']['names'][0]} "
                        f"({r['gpus'][0]['memory_total_mib']} MiB) -> type {r['gpu_type']}"
                        + ("" if r["profiled_type"] else " (no shipped profile)"),
        "overhead": lambda: f"plain {r['plain_step_ms']:.2f} ms, library "
                            f"{r['library_step_ms']:.2f} ms "
                            f"({100 * r['library_overhead_fraction']:+.0f}%), grad stats "
                            f"{r['grad_stats_ms_per_step']:.2f} ms; {r['world']} workers: "
                            f"agreement {r['workers']['agreement_ms_per_step']:.2f} ms/step",
        "profile": lambda: f"{len(r['samples'])}/{len(r['sizes_requested'])} sizes timed on "
                           f"{'emulated ' if r['emulated'] else ''}{r['gpu_type']}",
        "oom": lambda: f"out of memory at micro-batch {r['first_size_not_timed']}",
        "fit": lambda: f"held-back step-time error mean "
                       f"{100 * r['mean_abs_relative_error']:.1f}%, max "
                       f"{100 * r['max_abs_relative_error']:.1f}%",
        "job": lambda: f"{' -> '.join(r['states_seen'])}; {r['first_node']} -> "
                       f"{r['moved_to']} in {r['drain_to_running_elsewhere_s']:.1f} s; "
                       f"{r['total_s']:.0f} s in all",
        "samples": lambda: f"{r['fetched']} samples over {r['epochs']} epochs in "
                           f"{len(r['generations'])} generations: 0 lost, 0 repeated",
        "isolation": lambda: f"{len(r['workers'])} worker(s), each saw 1 GPU",
    }.get(name, lambda: "")
    return f"{name:10s} ok: {f()}"


def summarize(result: dict[str, Any]) -> str:
    lines = [f"sia gpu-check ({'dry run, no CUDA' if not result['cuda'] else result['device']})"
             f": {result['verdict']} in {result['seconds']:.0f} s"]
    lines += [_line(name, r) for name, r in result["steps"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-check",
                   help="where result.json and summary.txt go (default $OUT, else gpu-check)")
    p.add_argument("--dry", action="store_true",
                   help="the CPU path even where CUDA is available (tiny sizes, emulated GPUs)")
    p.add_argument("--keep", action="store_true", help="keep the work files (in OUT/work)")
    p.add_argument("--job-epochs", type=int, default=0,
                   help="the cluster job's target (default: 60 on a GPU, 25 dry)")
    args = p.parse_args(argv)
    import torch

    from sia_grpc.observability import configure_logging

    configure_logging(level="error")
    cuda = torch.cuda.is_available() and not args.dry
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sia-gpu-check-") as tmp:
        root = out / "work" if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        plan = make_plan(cuda, root, args.job_epochs)
        ctx: dict[str, Any] = {}
        results = {}
        for name, what, step in STEPS:
            print(f"gpu-check: {name}: {what} ...", file=sys.stderr, flush=True)
            results[name] = {"what": what, **run_step(name, step, plan, ctx)}
    failures = [n for n, r in results.items() if r["status"] == "failed"]
    result = {"cuda": cuda, "dry": not cuda,
              "device": torch.cuda.get_device_name(0) if cuda else None,
              "verdict": "FAILED: " + ", ".join(failures) if failures else "passed",
              "seconds": round(time.monotonic() - t0, 1),
              "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": results}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    text = summarize(result)
    (out / "summary.txt").write_text(text)
    print(text, end="")
    print(f"gpu-check: figures in {out / 'result.json'}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
