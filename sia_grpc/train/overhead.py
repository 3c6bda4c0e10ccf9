"""Measure what sia_grpc.train costs a training step.

    python -m sia_grpc.train.overhead [--world 2] [--steps 400] [--batch 64] [--hidden 64]
                                      [--device cpu|cuda]

1. In this process: an MLP (16 → hidden → hidden → 8) on the mlp example's data,
   trained for `--steps` steps by a plain PyTorch loop and by the same loop
   through sia_grpc.train (world 1), best of three runs each: the library's
   total per-step overhead.
2. `--world` gloo workers (subprocesses with the agent's environment) train the
   same MLP with periodic checkpoints; rank 0 prints the measured breakdown:
   gradient statistics and the per-step agreement all-reduce per step, checkpoint
   save time.
3. The same workers again, resuming that checkpoint: restore and start-up time
   (process start to the end of the first step).

`--device cuda` runs every loop on the GPU (the workers on cuda:LOCAL_RANK, nccl):
timed with the device synchronised at both ends. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

HIDDEN = int(os.environ.get("OVERHEAD_HIDDEN", "64"))
DEVICE = os.environ.get("OVERHEAD_DEVICE", "cpu")


def _sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, 8)).to(DEVICE)


def _plain(data, steps: int, batch: int) -> float:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = data.tensors
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    _sync()
    t0 = time.perf_counter()
    for i in range(steps):
        j = order[(i * batch) % (len(x) - batch):][:batch]
        xb, yb = x[j].to(DEVICE), y[j].to(DEVICE)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    _sync()
    return (time.perf_counter() - t0) / steps


def _library(data, steps: int, batch: int) -> tuple[float, dict]:
    import sia_grpc.train as st
    from sia_grpc.train import runtime

    runtime.reset()
    st.init(environ={})
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model = st.AdaptiveDataParallel(model, opt)
    loader = st.AdaptiveDataLoader(data, batch_size=batch)
    done = 0
    _sync()
    t0 = time.perf_counter()
    for _ in st.remaining_epochs_until(steps * batch / len(data)):
        for xb, yb in loader:
            opt.zero_grad()
            xb, yb = xb.to(DEVICE), yb.to(DEVICE)
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            done += 1
    _sync()
    out = (time.perf_counter() - t0) / done, st.overheads()
    runtime.reset()
    return out


def _worker(args) -> None:
    import sia_grpc.train as st
    from sia_grpc.train.examples.mlp import make_dataset

    torch.set_num_threads(1)
    st.init()
    data = make_dataset()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model = st.AdaptiveDataParallel(model, opt)
    loader = st.AdaptiveDataLoader(data, batch_size=args.batch)
    for _ in st.remaining_epochs_until(args.steps * args.batch / len(data)):
        for xb, yb in loader:
            opt.zero_grad()
            xb, yb = xb.to(DEVICE), yb.to(DEVICE)
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    if st.rank() == 0:
        with open(os.environ["OVERHEAD_OUT"], "w") as f:
            json.dump(st.overheads(), f)


def _launch(world: int, generation: int, tmp: str, args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tmp, f"gen{generation}.json")
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   SIA_GENERATION=str(generation), SIA_CHECKPOINT_DIR=os.path.join(tmp, "ckpt"),
                   SIA_CHECKPOINT_INTERVAL_S="0.1", OVERHEAD_OUT=out, OMP_NUM_THREADS="1",
                   OVERHEAD_HIDDEN=str(args.hidden), OVERHEAD_DEVICE=args.device)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sia_grpc.train.overhead", "--worker",
             "--steps", str(args.steps), "--batch", str(args.batch)], env=env))
    codes = [p.wait(600) for p in procs]
    if any(codes):
        raise SystemExit(f"workers failed: {codes}")
    with open(out) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> None:
    global HIDDEN, DEVICE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=HIDDEN, help="the MLP's width")
    p.add_argument("--device", default=DEVICE, choices=("cpu", "cuda"),
                   help="where the loops run (cuda: each worker on cuda:LOCAL_RANK)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    HIDDEN = args.hidden
    DEVICE = args.device
    if args.worker and DEVICE == "cuda":
        DEVICE = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if args.worker:
        _worker(args)
        return
    from sia_grpc.train.examples.mlp import make_dataset

    torch.set_num_threads(1)
    data = make_dataset()
    plain = min(_plain(data, args.steps, args.batch) for _ in range(3))
    runs = [_library(data, args.steps, args.batch) for _ in range(3)]
    lib, breakdown = min(runs, key=lambda r: r[0])
    result = {
        "hidden": args.hidden, "device": args.device,
        "single_process": {
            "plain_step_ms": 1e3 * plain, "library_step_ms": 1e3 * lib,
            "library_overhead_ms": 1e3 * (lib - plain),
            "library_overhead_fraction": (lib - plain) / plain,
            "grad_stats_ms_per_step": breakdown["grad_stats_ms_per_step"],
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        result[f"world_{args.world}"] = _launch(args.world, 1, tmp, args)
        result[f"world_{args.world}_resumed"] = _launch(args.world, 2, tmp, args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
