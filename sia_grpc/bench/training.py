"""`sia bench training`: what elastic training costs, measured through the real
agent back-end (TorchBackend) and real workers (`sia_grpc.train.examples.mlp`).

- Resize latency: a 2-worker job is stopped (SIGTERM, checkpoint at the next step,
  exit) and restarted on 1 worker, then back on 2: SIGTERM to the first step at
  the new size = the stop's duration + the new workers' startup (process start to
  the end of their first step, measured in the worker).
- Profiling time per GPU type: one profiling pass (10 micro-batch sizes) on one
  emulated GPU of each type, from the request to its telemetry.
- The library's per-step overheads, as the workers measured them.

On a machine without GPUs everything runs on the CPU with emulated GPU types.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from sia_grpc.api import pb
from sia_grpc.controller.machine.validation import profile_batch_sizes
from sia_grpc.nodeagent.backend import Launch
from sia_grpc.nodeagent.torchbackend import TorchBackend, free_port

_CMD = ["-m", "sia_grpc.train.examples.mlp", "--epochs", "1000", "--batch-size", "64",
        "--hidden", "512", "--samples", "32768"]


def _spec() -> pb.JobSpec:
    return pb.JobSpec(name="bench", application="mlp", command=[sys.executable, *_CMD],
                      adaptivity=pb.ADAPTIVITY_ADAPTIVE, batch_size=64, max_batch_size=1024)


def _launch(generation: int, gpus: tuple[int, ...], gpu_type: str, restore: float,
            ckpt: str) -> Launch:
    n = len(gpus)
    alloc = pb.Allocation(gpu_type=gpu_type, num_gpus=n, num_nodes=1, num_replicas=n,
                          atomic_batch_size=64, accum_steps=0, batch_size=64 * n)
    world = pb.WorldLayout(world_size=n, master_addr="127.0.0.1", master_port=free_port(),
                           nodes=["bench"])
    return Launch(job_id="bench", generation=generation, local_gpus=gpus, spec=_spec(),
                  allocation=alloc, world=world, restore_progress=restore, checkpoint_path=ckpt)


async def _first_steps(backend: TorchBackend, generation: int, resumed: bool,
                       timeout: float = 120.0) -> float:
    """Wait for the workers' first throughput sample (and, after a restart, their
    measured startup); return that startup in seconds (0 for a fresh start)."""
    samples, startup = False, 0.0
    async with asyncio.timeout(timeout):
        while not samples or (resumed and not startup):
            for t in backend.telemetry():
                if t.generation != generation:
                    continue
                samples |= len(t.samples) > 0
                startup = startup or t.checkpoint.restore_s
            await asyncio.sleep(0.05)
    return startup


async def resize_latency(root: Path, gpu_type: str = "dgx-ext") -> list[dict]:
    backend = TorchBackend(gpu_type, 2, workdir=root / "resize", emulate=True,
                           stop_grace_s=60.0)
    await backend.open()
    ckpt = str(root / "ckpt")
    out: list[dict] = []
    restore = 0.0
    try:
        shapes = ((0, 1), (0,), (0, 1))
        for gen, gpus in enumerate(shapes, start=1):
            await backend.start(_launch(gen, gpus, gpu_type, restore, ckpt), lambda ex: None)
            startup = await _first_steps(backend, gen, resumed=bool(out))
            if out:
                out[-1]["startup_s"] = startup
                out[-1]["resize_s"] = out[-1]["stop_s"] + startup
            await asyncio.sleep(2.0)  # train a little at this size
            if gen == len(shapes):
                break
            t0 = time.monotonic()
            ex = await backend.stop("bench")
            if ex.kind != pb.JobExit.KIND_CHECKPOINTED:
                raise RuntimeError(f"stop did not checkpoint: {ex}")
            restore = ex.progress
            out.append({"from": len(gpus), "to": len(shapes[gen]),
                        "stop_s": time.monotonic() - t0})
    finally:
        await backend.close()
    return out


async def profiling_time(root: Path, types: tuple[str, ...]) -> dict[str, dict]:
    out = {}
    for t in types:
        backend = TorchBackend(t, 1, workdir=root / f"profile-{t}", emulate=True)
        await backend.open()
        try:
            sizes = profile_batch_sizes(8, 1024, 10)
            t0 = time.monotonic()
            tel = await backend.profile(pb.ProfileRequest(
                job_id=f"bench-{t}", generation=0, spec=_spec(), local_gpu=0,
                local_batch_sizes=sizes))
            # The speed the type shows: samples per second at the median size timed.
            mid = sorted(tel.samples, key=lambda s: s.atomic_batch_size)[len(tel.samples) // 2]
            out[t] = {"seconds": time.monotonic() - t0, "sizes": len(tel.samples),
                      "micro_batch": mid.atomic_batch_size,
                      "step_ms": 1e3 * mid.step_time_s}
        finally:
            await backend.close()
    return out


def run(*, types: tuple[str, ...] = ("dgx-ext", "rtx", "aws"), as_json: bool = False) -> int:
    async def main() -> dict:
        with tempfile.TemporaryDirectory(prefix="sia-bench-") as tmp:
            root = Path(tmp)
            return {"resize": await resize_latency(root),
                    "profiling": await profiling_time(root, types)}

    from sia_grpc.observability import configure_logging

    configure_logging(level="warning")
    res = asyncio.run(main())
    if as_json:
        print(json.dumps(res, indent=2))
        return 0
    print("resize (mlp, hidden 512, emulated dgx-ext; SIGTERM to the first step at the new size)")
    for r in res["resize"]:
        print(f"  {r['from']} → {r['to']} workers: {r['resize_s']:.2f} s "
              f"(stop {r['stop_s']:.2f} s + startup {r['startup_s']:.2f} s)")
    print("profiling pass (10 micro-batch sizes, one emulated GPU)")
    for t, p in res["profiling"].items():
        print(f"  {t:8s} {p['seconds']:.1f} s, {p['sizes']} sizes timed; step at micro-batch "
              f"{p['micro_batch']}: {p['step_ms']:.1f} ms")
    return 0
