"""The modeled worker of `sia bench slurm`: a Slurm job that "trains" without GPUs.

It runs as the job's command, `python -m sia_grpc.bench.slurm_worker APP --truth
ADDR ...`, and follows the emulation's ground truth as the bench's process plans it
for its shape (`sia_grpc.bench.slurm_truth`: this module imports only the standard
library, so a copy starts and ends in a fraction of a second, as a real job's
launch would, instead of holding its GPUs for seconds of imports that the time
scale would turn into many modeled minutes). It pays the application's restore
delay, then advances at the progress rate of its shape until the application's
`max_progress`. Modeled time runs `--time-scale` times faster than the clock, from
the moment the worker is ready. Its shape is

- the bridge's (`SIA_GPU_TYPE`, `SIA_NUM_GPUS`, `SIA_NUM_NODES`,
  `SIA_ATOMIC_BATCH_SIZE`, `SIA_ACCUM_STEPS`: `sia-slurm env`), or
- with `--batch-size B --gpus N` (Slurm alone: the N GPUs it asked Slurm for, on
  one node), its node's type (`SLURMD_NODENAME`'s gres type, `--node-type
  NODE=GRES`), B split over the N GPUs as the policies split a fixed batch.

Its progress is a JSON file (`--checkpoint`, or `progress.json` in
`SIA_CHECKPOINT_DIR`), written on SIGTERM (the bridge moving it) and read at start,
so a moved job resumes where it stopped; a SIGTERM during the restore delay loses
nothing and gains nothing. With `SIA_AGENT_ADDRESS`/`SIA_AGENT_TOKEN` it reports
its step times and gradient statistics to the bridge as `sia_grpc.train`'s rank 0
does: at its first step, then every `--report-every` seconds (sent for it by the
bench's process, over gRPC to that address with that token); a reply with another
batch (the bridge changed it where the GPUs stay) re-plans the rest at that batch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["main"]

_MAIN_AT = time.time()  # when this Python got to run the worker (the move's breakdown)

# SIGTERM (the bridge moving the job) is noted from the first moment. (The handler
# only appends: setting a threading.Event from a handler can deadlock on the Event's
# own lock, held by the main thread the handler interrupts.) The loop waits for it
# with sigtimedwait, so a stop is acted on at once, not at the loop's next turn.
_STOPPED_AT: list[tuple[float, float]] = []  # (time.monotonic(), time.time()) of SIGTERM


def _on_sigterm(*_) -> None:
    _STOPPED_AT.append((time.monotonic(), time.time()))


def _wait_for_sigterm(seconds: float) -> None:
    """Sleep up to `seconds`, returning at once on SIGTERM (noted in _STOPPED_AT)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        if not _STOPPED_AT and signal.sigtimedwait({signal.SIGTERM}, max(seconds, 0.0)):
            _on_sigterm()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _launched_at() -> float | None:
    """When this process was started (the time.time() clock), to 1/CLK_TCK s: the job's
    batch script, which `exec`s the worker (None where /proc cannot tell)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in
                    Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _call(truth: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{truth}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)


def _shape(args: argparse.Namespace) -> dict[str, Any]:
    env = os.environ
    if args.batch_size is None:
        return {"gpu_type": env["SIA_GPU_TYPE"], "num_nodes": int(env["SIA_NUM_NODES"]),
                "num_replicas": int(env["SIA_NUM_GPUS"]),
                "atomic_batch_size": int(env["SIA_ATOMIC_BATCH_SIZE"]),
                "accum_steps": int(env.get("SIA_ACCUM_STEPS", "0"))}
    types = dict(kv.split("=", 1) for kv in args.node_type)
    return {"batch_size": args.batch_size, "gpus": args.gpus,
            "gres_type": types[env["SLURMD_NODENAME"]]}


def run(args: argparse.Namespace) -> int:
    ckpt = Path(args.checkpoint or Path(os.environ["SIA_CHECKPOINT_DIR"]) / "progress.json")
    progress = json.loads(ckpt.read_text())["progress"] if ckpt.exists() else 0.0
    copy = os.environ.get("SLURM_JOB_ID", "")  # (the move breakdown's key)
    plan = _call(args.truth, "/plan", {"application": args.application, "progress": progress,
                                       "shape": _shape(args), "slurm_job_id": copy,
                                       "launched_at": _launched_at(), "main_at": _MAIN_AT})
    scale, delay = args.time_scale, plan["restart_delay"]
    started = time.monotonic()  # (modeled time 0: ready, the restore delay to pay)

    def trained_s() -> float:  # modeled seconds of training so far (after the restore)
        now = _STOPPED_AT[0][0] if _STOPPED_AT else time.monotonic()
        return max((now - started) * scale - delay, 0.0)

    report_to = os.environ.get("SIA_AGENT_ADDRESS", "")
    report = {"plan": plan["plan"], "address": report_to,
              "token": os.environ.get("SIA_AGENT_TOKEN", ""),
              "job_id": os.environ.get("SIA_JOB_ID", ""),
              "generation": int(os.environ.get("SIA_GENERATION", "0"))}
    end = started + (delay + plan["duration"]) / scale
    a = plan["allocation"]
    print(f"{args.application}: {plan['gpu_type']} x{a['num_replicas']} on {a['num_nodes']} "
          f"node(s), atomic batch {a['atomic_batch_size']}+{a['accum_steps']} accum, from "
          f"progress {progress:.1f}/{plan['max_progress']:.1f}: "
          f"{plan['duration'] / 3600:.2f} h modeled", flush=True)
    next_report = started + delay / scale if report_to else float("inf")
    while not _STOPPED_AT and (now := time.monotonic()) < end:
        if now >= next_report:
            reply = _call(args.truth, "/report", {**report, "trained_s": trained_s()})
            next_report = now + args.report_every
            if "batch" in reply:  # the bridge changed the batch in place: the rest of
                plan = _call(args.truth, "/rebatch", {  # the way at the new one
                    "plan": plan["plan"], "trained_s": trained_s(), **reply["batch"]})
                report["plan"], started, delay = plan["plan"], now, 0.0
                end = now + plan["duration"] / scale
                print(f"batch changed: atomic {reply['batch']['atomic_batch_size']}"
                      f"+{reply['batch']['accum_steps']} accum, "
                      f"{plan['duration'] / 3600:.2f} h modeled left", flush=True)
        _wait_for_sigterm(min(end, next_report) - now)
    done = _call(args.truth, "/progress", {
        "plan": plan["plan"], "trained_s": trained_s(), "slurm_job_id": copy,
        "stopped_at": _STOPPED_AT[0][1] if _STOPPED_AT else None})["progress"]
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"progress": done}))
    tmp.replace(ckpt)  # (atomic: a kill mid-write leaves the last checkpoint)
    finished = done >= plan["max_progress"]
    print(f"{'finished' if finished else 'stopped'} at progress {done:.1f}", flush=True)
    return 0 if finished else 143


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    p = argparse.ArgumentParser(prog="python -m sia_grpc.bench.slurm_worker",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("application")
    p.add_argument("--truth", required=True, metavar="HOST:PORT",
                   help="the bench's sia_grpc.bench.slurm_truth service")
    p.add_argument("--time-scale", type=float, required=True,
                   help="modeled seconds per real second")
    p.add_argument("--checkpoint", help="progress file (default SIA_CHECKPOINT_DIR/"
                                        "progress.json)")
    p.add_argument("--batch-size", type=int,
                   help="Slurm alone: this global batch on --gpus GPUs of one node")
    p.add_argument("--gpus", type=int, default=1, help="with --batch-size: the job's GPUs")
    p.add_argument("--node-type", action="append", default=[], metavar="NODE=GRES",
                   help="with --batch-size: a node's gres GPU type")
    p.add_argument("--report-every", type=float, default=1.0, metavar="SECONDS")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
