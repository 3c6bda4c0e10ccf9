"""`sia bench isolation`: what node isolation costs a job, measured through the
agent's real `TorchBackend` (emulated GPUs) and real workers
(`sia_grpc.train.examples.mlp`), once per isolation level the host gives.

Per level (`none` always; `user` and `sandbox` where the agent could take them:
root, cgroups, bubblewrap, and a trial that passes; else skipped, with the reason)
and per repetition, a fresh job:

- start: `backend.start()` of a 2-worker generation until the first telemetry
  report of a step done (rank 0 reports right after its first step);
- steady step time: the workers' own step times (telemetry samples) over
  `steady_s` seconds after that first report;
- resize: the 2-worker generation stopped with a checkpoint, a 1-worker one
  started from it, until it reports its first step (the stop's time + the
  restart's; of the restart, the new workers' own start-up as rank 0 measured it:
  its process start to the end of its first step, restore included);
- stop: `backend.stop()` until it returns: the workers checkpointed and exited,
  and (with isolation) the run's cgroup killed and empty. Both stops of a
  repetition count (2 → exit and 1 → exit workers).

Where the time goes, per level: the trial at the agent's start (`build_isolation`,
once), and per run `NodeIsolation.enter` (the job's user, folders, cgroup and the
sandbox's argv) and `NodeIsolation.leave` (kill the cgroup and wait until it is
empty), and per worker process its start through the launcher (`python -c pass`
as a worker starts: setuid, joining the cgroups, bubblewrap; 5 per repetition,
the levels back to back). The levels take turns within each repetition (the
first level rotates), so a slow moment of the machine does not fall on one level
only.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from sia_grpc.api import pb
from sia_grpc.nodeagent.backend import Launch
from sia_grpc.nodeagent.isolation.levels import IsolationUnavailable
from sia_grpc.nodeagent.isolation.node import Limits, NodeIsolation, default_memory_per_gpu
from sia_grpc.nodeagent.isolation.setup import build_isolation
from sia_grpc.nodeagent.torchbackend import TorchBackend, free_port
from sia_grpc.nodeagent.workers import spawn_worker, wait_exit

__all__ = ["LEVELS", "run"]

LEVELS = ("none", "user", "sandbox")
GPU_TYPE = "dgx-ext"  # the fastest type: pace 1.0, the emulation adds no sleep to a step
_ARGS = ("--epochs", "1000", "--batch-size", "64", "--hidden", "512", "--samples", "32768")
_REPORT_INTERVAL_S = "0.5"  # the workers' reports, for the steady step time
_WAIT_S = 120.0  # for a first report, on a busy 2-core machine
_SPAWNS = 5  # bare process starts through the launcher per repetition
METRICS = ("start_s", "resize_s", "stop_s", "step_ms")


def _spec() -> pb.JobSpec:
    return pb.JobSpec(name="bench-iso", application="mlp",
                      command=[sys.executable, "-m", "sia_grpc.train.examples.mlp", *_ARGS],
                      adaptivity=pb.ADAPTIVITY_ADAPTIVE, batch_size=64, max_batch_size=1024,
                      env={"SIA_REPORT_INTERVAL_S": _REPORT_INTERVAL_S})


def _launch(job: str, generation: int, gpus: tuple[int, ...], restore: float) -> Launch:
    n = len(gpus)
    alloc = pb.Allocation(gpu_type=GPU_TYPE, num_gpus=n, num_nodes=1, num_replicas=n,
                          atomic_batch_size=64, accum_steps=0, batch_size=64 * n)
    world = pb.WorldLayout(world_size=n, master_addr="127.0.0.1", master_port=free_port(),
                           nodes=["bench"])
    return Launch(job_id=job, generation=generation, local_gpus=gpus, spec=_spec(),
                  allocation=alloc, world=world, restore_progress=restore)


@dataclass
class _Level:
    """One level's back-end and what was measured of it."""

    name: str
    backend: TorchBackend
    trial_s: float
    samples: dict[str, list[float]] = field(default_factory=lambda: {
        k: [] for k in (*METRICS, "resize_stop_s", "resize_start_s", "resize_worker_s",
                        "enter_ms", "leave_ms", "spawn_ms")})

    async def spawn(self, root: Path, rep: int) -> None:
        """Time one bare process start through the level's launcher: `python -c pass`
        as a job's worker would start (its user, its cgroup, its sandbox), to its exit."""
        iso, key = self.backend.isolation, f"_bench/spawn-{rep}"
        space = iso.enter(key, "", f"s{rep}", num_gpus=1, gpus=(), cpus=None,
                          checkpoint_dir=root / self.name / "spawn" / str(rep))
        try:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **space.env()}
            t0 = time.perf_counter()
            proc = spawn_worker([sys.executable, "-c", "pass"], env,
                                root / self.name / "spawn.log", confine=space.confinement())
            code = await asyncio.wait_for(wait_exit(proc.popen), _WAIT_S)
            dt = time.perf_counter() - t0
        finally:
            # leave, not leave_now: a sandbox's inner processes are not our children,
            # and may still be in the cgroup when bwrap has been reaped. (The class's
            # own leave: this one is not timed, `instrument`.)
            if not await NodeIsolation.leave(iso, space):
                raise RuntimeError(f"{self.name}: the cgroup of a bare process start did "
                                   f"not empty")
        if code != 0:
            raise RuntimeError(f"{self.name}: `python -c pass` through the launcher exited "
                               f"{code}: {(root / self.name / 'spawn.log').read_text()[-500:]}")
        self.samples["spawn_ms"].append(1e3 * dt)

    def instrument(self) -> None:
        """Time every NodeIsolation.enter and .leave of this back-end's runs."""
        iso = self.backend.isolation
        enter, leave = iso.enter, iso.leave

        @functools.wraps(enter)
        def timed_enter(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return enter(*a, **kw)
            finally:
                self.samples["enter_ms"].append(1e3 * (time.perf_counter() - t0))

        @functools.wraps(leave)
        async def timed_leave(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await leave(*a, **kw)
            finally:
                self.samples["leave_ms"].append(1e3 * (time.perf_counter() - t0))

        iso.enter, iso.leave = timed_enter, timed_leave  # type: ignore[method-assign]


async def _reports(backend: TorchBackend, job: str, generation: int, *,
                   past: float | None = None, seconds: float = 0.0) -> list[pb.Telemetry]:
    """The generation's telemetry: until the first report of a step done, one whose
    progress is `past` the progress it started from (a restored generation's rank 0
    reports once before its first step), else for `seconds`. Fails fast, with its
    log, if the generation stops running."""
    got: list[pb.Telemetry] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (_WAIT_S if past is not None else seconds)
    while True:
        got += [t for t in backend.telemetry() if t.job_id == job and t.generation == generation]
        if past is not None and any(t.progress > past for t in got):
            return got
        if loop.time() >= deadline:
            if past is not None:
                raise TimeoutError(f"{job} generation {generation}: no step reported in "
                                   f"{_WAIT_S:.0f} s")
            return got
        if not any(r.job_id == job and r.generation == generation for r in backend.running()):
            log = backend.workdir / "jobs" / job / f"gen-{generation}" / "rank-0.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise RuntimeError(f"{job} generation {generation} ended early; rank 0's log:\n{tail}")
        await asyncio.sleep(0.005)


def _step_ms(reports: Sequence[pb.Telemetry]) -> float | None:
    """The mean step time over `reports`' samples, weighted by their counts."""
    n = sum(s.count for t in reports for s in t.samples)
    if not n:
        return None
    return 1e3 * sum(s.step_time_s * s.count for t in reports for s in t.samples) / n


async def _repetition(lv: _Level, rep: int, steady_s: float) -> None:
    b, s, job = lv.backend, lv.samples, f"iso-{lv.name}-{rep}"
    t0 = time.monotonic()
    await b.start(_launch(job, 1, (0, 1), 0.0), lambda ex: None)
    await _reports(b, job, 1, past=0.0)
    s["start_s"].append(time.monotonic() - t0)
    steady = await _reports(b, job, 1, seconds=steady_s)
    if (step := _step_ms(steady)) is not None:
        s["step_ms"].append(step)
    # Resize: 2 workers → 1, from the checkpoint the stop makes.
    t0 = time.monotonic()
    ex = await b.stop(job)
    t1 = time.monotonic()
    if ex.kind != pb.JobExit.KIND_CHECKPOINTED:
        raise RuntimeError(f"{job}: the stop did not checkpoint: {ex}")
    await b.start(_launch(job, 2, (0,), ex.progress), lambda ex: None)
    first = await _reports(b, job, 2, past=ex.progress)
    t2 = time.monotonic()
    # The new workers' own start-up (process start to the end of the first step, restore
    # included), as rank 0 measured it; the rest of the start is the agent's side.
    if worker := max((t.checkpoint.restore_s for t in first), default=0.0):
        s["resize_worker_s"].append(worker)
    s["resize_s"].append(t2 - t0)
    s["resize_stop_s"].append(t1 - t0)
    s["resize_start_s"].append(t2 - t1)
    s["stop_s"].append(t1 - t0)
    t0 = time.monotonic()
    ex = await b.stop(job)
    s["stop_s"].append(time.monotonic() - t0)
    if ex.kind != pb.JobExit.KIND_CHECKPOINTED:
        raise RuntimeError(f"{job}: the stop did not checkpoint: {ex}")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks; None if empty."""
    if not values:
        return None
    v = sorted(values)
    x = (len(v) - 1) * q / 100.0
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def _summary(levels: dict[str, dict[str, Any]]) -> None:
    """Each measured level's p50/p95 per metric; its p50 over `none`'s (`ratio_p50`);
    and the median of its ratios to `none`'s sample of the same repetition
    (`ratio_paired`: the levels of a repetition ran within seconds of each other, so
    a machine whose load drifts over the run affects this less)."""
    for lv in levels.values():
        if lv["status"] != "measured":
            continue
        lv["summary"] = {k: {"p50": percentile(v, 50), "p95": percentile(v, 95), "n": len(v)}
                         for k, v in lv["samples"].items()}
    none = levels.get("none", {})
    base, base_samples = none.get("summary", {}), none.get("samples", {})
    for lv in levels.values():
        for k, m in lv.get("summary", {}).items():
            b = base.get(k, {}).get("p50")
            m["ratio_p50"] = m["p50"] / b if b and m["p50"] is not None else None
            v, bv = lv["samples"][k], base_samples.get(k, [])
            m["ratio_paired"] = (percentile([x / y for x, y in zip(v, bv, strict=True)], 50)
                                 if v and len(v) == len(bv) and all(bv) else None)


def machine() -> dict[str, Any]:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:  # (the workers need it; the bench would say so)
        torch_version = ""
    return {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "kernel": platform.release(),
            "machine": platform.machine(), "processor": _cpu_model(), "torch": torch_version,
            "euid": os.geteuid()}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


async def _open(name: str, root: Path, num_gpus: int) -> _Level | str:
    """A back-end at level `name`, or why the host cannot give it."""
    workdir = root / name / "agent"
    workdir.mkdir(parents=True)
    t0 = time.monotonic()
    try:  # (as the agent does: `none` has no trial)
        iso = build_isolation(name, run_root=workdir / "run", node_id=f"bench-{name}",
                              limits=Limits(memory_per_gpu=default_memory_per_gpu(num_gpus)))
    except IsolationUnavailable as exc:
        return str(exc)
    trial_s = time.monotonic() - t0
    backend = TorchBackend(GPU_TYPE, num_gpus, workdir=workdir,
                           checkpoint_root=root / name / "ckpt", emulate=True,
                           stop_grace_s=60.0, node_id=f"bench-{name}", isolation=iso)
    await backend.open()
    return _Level(name, backend, trial_s)


async def measure(levels: Sequence[str] = LEVELS, repeats: int = 5, steady_s: float = 3.0,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole bench: {machine, config, levels: {name: {status, ...}}}."""
    out: dict[str, dict[str, Any]] = {}
    opened: list[_Level] = []
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="sia-bench-iso-"))
    os.chmod(root, 0o711)  # the job users pass through it to their folders
    try:
        # Python and torch off the disk once, so the first timed start is not the only cold one.
        subprocess.run([sys.executable, "-c", "import torch, sia_grpc.train"], check=True,
                       timeout=_WAIT_S)
        for name in levels:
            got = await _open(name, root, 2)
            if isinstance(got, str):
                out[name] = {"status": "skipped", "reason": got}
                if progress:
                    progress(f"{name}: skipped: {got}")
                continue
            opened.append(got)
            got.instrument()
            out[name] = {"status": "measured", "trial_s": got.trial_s,
                         "describe": got.backend.isolation.describe()}
        for rep in range(repeats):
            turn = opened[rep % len(opened):] + opened[:rep % len(opened)] if opened else []
            for i in range(_SPAWNS):  # (back to back: the levels see the same moment)
                for lv in turn:
                    await lv.spawn(root, rep * _SPAWNS + i)
            for lv in turn:
                if progress:
                    progress(f"repetition {rep + 1}/{repeats}: {lv.name}")
                await _repetition(lv, rep, steady_s)
    finally:
        for lv in opened:
            await lv.backend.close()
        shutil.rmtree(root, ignore_errors=True)
    for lv in opened:
        out[lv.name]["samples"] = lv.samples
    _summary(out)
    return {"machine": {**machine(), "loadavg_before": load_before,
                        "loadavg_after": os.getloadavg()},
            "config": {"repeats": repeats, "steady_s": steady_s, "gpu_type": GPU_TYPE,
                       "workers": "2, resized to 1", "command": ["-m",
                                                                 "sia_grpc.train.examples.mlp",
                                                                 *_ARGS],
                       "report_interval_s": float(_REPORT_INTERVAL_S)},
            "levels": out}


_ROWS = (("start_s", "start → first step reported", "s"),
         ("resize_s", "resize 2 → 1 (stop + start → first step reported)", "s"),
         ("resize_stop_s", "  of which the stop", "s"),
         ("resize_start_s", "  of which the start → first step reported", "s"),
         ("resize_worker_s", "    of that in the worker (its start → first step)", "s"),
         ("stop_s", "stop (→ cgroup empty)", "s"),
         ("step_ms", "steady step (workers' telemetry)", "ms"),
         ("enter_ms", "NodeIsolation.enter, per run", "ms"),
         ("leave_ms", "NodeIsolation.leave, per run", "ms"),
         ("spawn_ms", "`python -c pass` through the launcher", "ms"))


def table(res: dict[str, Any]) -> str:
    """The results as a Markdown table: p50 / p95 per level, and the paired ratio to
    none's (`_summary`)."""
    m = res["machine"]
    lines = [f"machine: {m['cpus']} CPUs ({m['processor']}), Python {m['python']}, "
             f"kernel {m['kernel']}, torch {m['torch'] or '?'}; "
             f"{res['config']['repeats']} repetitions, emulated {res['config']['gpu_type']}; "
             f"load average {m['loadavg_before'][0]:.1f} before, "
             f"{m['loadavg_after'][0]:.1f} after"]
    levels = res["levels"]
    measured = [k for k, v in levels.items() if v["status"] == "measured"]
    for k, v in levels.items():
        if v["status"] != "measured":
            lines.append(f"{k}: skipped: {v['reason']}")
    if not measured:
        return "\n".join(lines)
    lines.append("")
    lines.append("| p50 / p95 (× none, paired) | " + " | ".join(measured) + " |")
    lines.append("|---|" + "---|" * len(measured))

    def cell(k: str, unit: str, lv: dict[str, Any]) -> str:
        s = lv["summary"][k]
        if s["p50"] is None:
            return "–"
        fmt = "{:.2f}" if unit == "s" else "{:.1f}"
        text = f"{fmt.format(s['p50'])} / {fmt.format(s['p95'])} {unit}"
        if lv is not levels.get("none") and s.get("ratio_paired") is not None:
            text += f" (×{s['ratio_paired']:.2f})"
        return text

    for k, label, unit in _ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(k, unit, levels[n]) for n in measured)
                     + " |")
    lines.append("| trial at the agent's start (once) | "
                 + " | ".join(f"{levels[n]['trial_s']:.2f} s" for n in measured) + " |")
    return "\n".join(lines)


def run(*, levels: Sequence[str] = LEVELS, repeats: int = 5, steady_s: float = 3.0,
        as_json: bool = False) -> int:
    from sia_grpc.observability import configure_logging

    configure_logging(level="warning")
    res = asyncio.run(measure(levels, repeats, steady_s, progress=None if as_json else (
        lambda line: print(line, file=sys.stderr, flush=True))))
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        print(table(res))
    return 0
