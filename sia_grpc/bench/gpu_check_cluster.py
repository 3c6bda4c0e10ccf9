"""The gpu check's live part: a controller (in this process) and two node agents with
the torch back-end (subprocesses, one GPU each), one real job of the mlp example
(`gpu_check_worker`: it records the sample indices it trains on). The job is profiled
on arrival, started, moved to the other node by draining its node (checkpoint,
restore on the other agent, continue) and run to its target; then its records show
whether any sample of any epoch was lost or trained on twice, and what each worker
process saw of the GPUs (the node isolation).

On a machine without CUDA the agents emulate one `rtx` GPU each (`--emulate rtx:1`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sia_grpc.bench.gpu_check_steps import RECORD, Plan, failed, mlp_spec, skipped
from sia_grpc.testing.localcluster import stop_agents

NODES = ("check-a", "check-b")


def _spawn_agent(target: str, node: str, gpu: int, gpu_type: str, plan: Plan) -> subprocess.Popen:
    workdir = plan.root / node
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "sia_grpc.nodeagent", "--controller", target, "--node-id",
            node, "--backend", "torch", "--workdir", str(workdir), "--stop-grace", "60",
            "--telemetry-interval", "1", "--log-format", "json",
            # The strongest isolation the machine allows, as a production node runs
            # (where none works, e.g. not root, the agent says so in its log).
            "--isolation", "auto"]
    env = dict(os.environ)
    if plan.cuda:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if importlib.util.find_spec("pynvml") is None:  # (the install step says so too)
            argv += ["--gpus", f"{gpu_type}:1"]
    else:
        argv += ["--emulate", f"{gpu_type}:1"]
    with open(workdir / "agent.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def _node(job: Any) -> str:
    gpus = job.status.allocation.gpus
    return gpus[0].node if gpus else ""


async def _wait(client: Any, job_id: str, until: Callable[[Any], bool], seen: list[str],
                timeout_s: float) -> Any:
    """Poll the job until `until(job)`; `seen` collects its states as they change."""
    from sia_grpc.api import state_name
    from sia_grpc.client.sdk import is_terminal

    async with asyncio.timeout(timeout_s):
        while True:
            job = await client.get(job_id)
            state = state_name(job.status.state)
            if not seen or seen[-1] != state:
                seen.append(state)
            if until(job):
                return job
            if is_terminal(job):
                hint = (" (it ended before it could be moved: give it more epochs, "
                        "--job-epochs)" if state == "SUCCEEDED" else "")
                raise RuntimeError(f"job ended {state} before the check's condition{hint}: "
                                   f"{job.status.message or job.status.reason}")
            await asyncio.sleep(0.2)


async def _job_and_move(client: Any, plan: Plan, gpu_type: str) -> dict[str, Any]:
    from sia_grpc.api import pb
    from sia_grpc.client.sdk import is_terminal

    spec = mlp_spec("gpu-check", "sia_grpc.bench.gpu_check_worker",
                    ("--epochs", str(plan.job_epochs), *plan.job_args), plan.job_batch,
                    4 * plan.job_batch)
    spec.max_gpus, spec.epochs, spec.restart_cost_s = 1, plan.job_epochs, 5.0
    spec.env.update(GPU_CHECK_RECORD="1", SIA_REPORT_INTERVAL_S="1")
    spec.type_batch_limits.add(gpu_type=gpu_type, min_local_batch_size=8,
                               max_local_batch_size=plan.job_max_local)
    t0 = time.monotonic()
    job_id = (await client.submit(spec)).job_id
    seen: list[str] = []
    running = pb.JOB_STATE_RUNNING
    job = await _wait(client, job_id, lambda j: j.status.state == running
                      and j.status.progress > 0, seen, 240)
    first, gen = _node(job), job.status.generation
    started_s, progress_at_move = time.monotonic() - t0, job.status.progress
    await client.drain(first, "gpu-check: move the job")
    t1 = time.monotonic()
    job = await _wait(client, job_id, lambda j: j.status.state == running
                      and j.status.generation > gen and _node(j) not in ("", first), seen, 180)
    moved_s, moved_to = time.monotonic() - t1, _node(job)
    await client.undrain(first)
    job = await _wait(client, job_id, is_terminal, seen, 600)
    return {"job_id": job_id, "states_seen": seen, "final_state": seen[-1],
            "first_node": first, "moved_to": moved_to, "first_generation": gen,
            "final_generation": job.status.generation, "restarts": job.status.restarts,
            "submit_to_running_s": started_s, "progress_at_move": progress_at_move,
            "drain_to_running_elsewhere_s": moved_s,
            "restart_seconds_measured": job.status.restart_seconds,
            "total_s": time.monotonic() - t0}


async def _cluster(plan: Plan, gpu_type: str) -> dict[str, Any]:
    """Controller, two agents, the job; the agents are stopped (SIGTERM) at the end."""
    import torch

    from sia_grpc.client import AsyncSiaClient
    from sia_grpc.controller.config import ControllerConfig
    from sia_grpc.controller.shell.server import Controller

    os.chmod(plan.root, 0o711)  # the workers run as job users: the way is open to them
    config = ControllerConfig(
        listen="127.0.0.1:0", db_path=str(plan.root / "controller.db"),
        round_duration=plan.round_s, early_round_delay=0.5, heartbeat_interval=1.0,
        heartbeat_timeout=30.0, checkpoint_root=str(plan.root / "checkpoints"))
    controller = Controller(config)
    await controller.start()
    agents: list[subprocess.Popen] = []
    try:
        target = f"127.0.0.1:{controller.port}"
        second = 1 if plan.cuda and torch.cuda.device_count() > 1 else 0
        agents = [_spawn_agent(target, n, g, gpu_type, plan)
                  for n, g in zip(NODES, (0, second), strict=True)]
        async with asyncio.timeout(90):
            while len(controller.agents) < len(NODES):
                if any(p.poll() is not None for p in agents):
                    raise RuntimeError(f"an agent exited: see {plan.root}/*/agent.log")
                await asyncio.sleep(0.1)
        async with AsyncSiaClient(target) as client:
            return await _job_and_move(client, plan, gpu_type)
    finally:
        await stop_agents(agents)
        await controller.close(grace=1.0)


def step_job(plan: Plan, ctx: dict) -> dict[str, Any]:
    """The job through the controller and the torch agents: profiled on arrival,
    moved once, run to its target."""
    gpu_type = ctx.get("gpu_type", "rtx")
    out = asyncio.run(_cluster(plan, gpu_type))
    out["gpu_type"], out["emulated"] = gpu_type, not plan.cuda
    ctx["job"] = out
    if out["final_state"] != "SUCCEEDED":
        return failed(f"the job ended {out['final_state']}", **out)
    if "PROFILING" not in out["states_seen"]:
        return failed("the job was not seen profiling on arrival", **out)
    return {"status": "ok", **out}


def _record(plan: Plan) -> Path:
    """The job's record folder, in its checkpoint folder (gpu_check_worker)."""
    found = sorted(plan.root.glob(f"checkpoints/*/*/{RECORD}"))
    return found[0] if found else plan.root / "no-record"


def _generations(record: Path) -> list[int]:
    return sorted(int(p.name[3:].split("-")[0]) for p in record.glob("gen*-rank0.idx"))


def step_samples(plan: Plan, ctx: dict) -> dict[str, Any]:
    """No sample lost or repeated across the move: the indices the job's generations
    fetched, in order, make up each epoch of the target exactly once."""
    if "job" not in ctx:
        return failed("the job did not run")
    record = _record(plan)
    gens = _generations(record)
    per_gen = {g: [int(x) for x in (record / f"gen{g}-rank0.idx").read_text().split()]
               for g in gens}
    order = [i for g in gens for i in per_gen[g]]
    n = int(plan.job_args[plan.job_args.index("--samples") + 1])
    figures = {"generations": gens, "samples_per_generation": {str(g): len(v)
                                                               for g, v in per_gen.items()},
               "dataset": n, "epochs": plan.job_epochs, "fetched": len(order)}
    problems = []
    for e in range(plan.job_epochs):
        counts = Counter(order[e * n:(e + 1) * n])
        lost = n - len(counts)
        repeated = sum(c - 1 for c in counts.values())
        if lost or repeated:
            problems.append({"epoch": e, "lost": lost, "repeated": repeated})
    extra = len(order) - plan.job_epochs * n
    if len(gens) < 2:
        return failed("fewer than two generations recorded: the job did not move", **figures)
    if problems or extra:
        return failed(f"samples lost or repeated: {problems}, {extra:+d} beyond the target",
                      problems=problems, **figures)
    return {"status": "ok", "lost": 0, "repeated": 0, **figures}


def step_isolation(plan: Plan, ctx: dict) -> dict[str, Any]:
    """Each training process of the job saw only its own GPU: CUDA_VISIBLE_DEVICES
    names one device and torch.cuda.device_count() is 1 (the job's GPUs per node)."""
    if not plan.cuda:
        return skipped()
    views = [json.loads(p.read_text()) for p in sorted(_record(plan).glob("gen*.json"))]
    if not views:
        return failed("no worker recorded what it saw")
    wrong = [v for v in views if v["device_count"] != 1
             or len((v["cuda_visible_devices"] or "").split(",")) != 1]
    if wrong:
        return failed("a worker saw other GPUs than its own", views=views)
    return {"status": "ok", "workers": views}
