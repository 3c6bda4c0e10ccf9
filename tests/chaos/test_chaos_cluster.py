"""The modeled cluster over real loopback gRPC (LocalCluster, 600× real time)
through random faults drawn from a seeded RNG: in-process agents closed and
started again, an agent process SIGKILLed and respawned, controller restarts on
the same store. After every fault: every accepted job is accounted for (live in
the controller with a valid state), no node booked past its GPUs, no agent runs
two jobs on one GPU. At the end every job completes and no agent was ever asked
to start a job on a GPU another job held (`refused` stays 0)."""

from __future__ import annotations

import asyncio
import random
import signal
from dataclasses import replace

import pytest

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster

# Heavy and timing-sensitive: the "heavy" xdist group (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("heavy")

RATE = 600.0
NODES = {"rtx": (2, 4), "aws": (1, 4)}
VALID = set(pb.JobState.values()) - {pb.JOB_STATE_UNSPECIFIED}


def _books(lc: LocalCluster, accepted: list[str]) -> None:
    st = lc.controller.state
    for j in accepted:
        assert j in st.jobs and st.jobs[j].state in VALID, f"{j} not accounted for"
    per_type: dict[str, list[int]] = {}
    for node in st.nodes.values():
        assert all(0 <= g < node.num_gpus for g in node.holder), (node.name, node.holder)
        if node.state == pb.NODE_STATE_READY:
            used = per_type.setdefault(node.gpu_type, [0, 0])
            used[0] += len(node.holder)
            used[1] += node.num_gpus
    for t, (used, cap) in per_type.items():
        assert used <= cap, f"{t}: {used} of {cap} GPUs booked"
    for agent in lc.agents.values():  # ground truth: one job per GPU on every agent
        gpus = [g for r in agent.backend.running() for g in r.local_gpus]
        assert len(gpus) == len(set(gpus)), (agent.config.node_id, agent.backend.running())


@pytest.mark.timeout(150)
async def test_modeled_cluster_survives_random_faults_and_every_job_completes(tmp_path):
    rng = random.Random(6)
    cfg = ControllerConfig(listen="127.0.0.1:0", db_path=str(tmp_path / "sia.db"),
                           store_synchronous="OFF", round_duration=60.0,
                           early_round_delay=5.0, heartbeat_interval=30.0,
                           heartbeat_timeout=240.0, inline_solver=True)
    faults: dict[str, int] = {}
    refused = 0
    async with LocalCluster(NODES, rate=RATE, config=replace(cfg),
                            telemetry_interval=0.05) as lc:
        proc = lc.spawn_agent("aws-p", "aws", 4)
        await lc.wait_registered(4, timeout=30)
        accepted: list[str] = []
        down: dict[str, tuple[str, int]] = {}
        async with AsyncSiaClient(lc.target) as client:
            for k in range(8):
                app = "cifar10" if k % 4 == 0 else "ncf"
                job = await client.submit(pb.JobSpec(
                    name=app, application=app, adaptivity=pb.ADAPTIVITY_ADAPTIVE))
                accepted.append(job.job_id)
        for _ in range(40):
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            kind = rng.choices(["agent-close", "agent-start", "agent-sigkill",
                                "controller-restart"], [4, 4, 1, 2])[0]
            if kind == "agent-close" and len(lc.agents) > 1:
                name = rng.choice(sorted(lc.agents))
                agent = lc.agents.pop(name)
                down[name] = (agent.config.gpu_type, agent.config.num_gpus)
                await agent.close()
            elif kind == "agent-start" and down:
                name = rng.choice(sorted(down))
                await lc.add_agent(name, *down.pop(name))
            elif kind == "agent-sigkill":
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                else:
                    proc = lc.spawn_agent("aws-p", "aws", 4)
            elif kind == "controller-restart":
                refused += lc.controller.state.refused
                await lc.restart_controller()
            else:
                continue
            faults[kind] = faults.get(kind, 0) + 1
            _books(lc, accepted)
        for name, (t, n) in down.items():
            await lc.add_agent(name, t, n)
        if proc.poll() is not None:
            proc = lc.spawn_agent("aws-p", "aws", 4)
        async with AsyncSiaClient(lc.target) as client, asyncio.timeout(90):
            finals = [await client.handle(j).wait() for j in accepted]
        _books(lc, accepted)
        refused += lc.controller.state.refused
    assert [pb.JobState.Name(j.status.state) for j in finals] == ["JOB_STATE_SUCCEEDED"] * 8
    assert refused == 0
    assert sum(faults.values()) >= 20, faults
    print(f"\nfaults: {faults}; restarts per job: {[j.status.restarts for j in finals]}")
