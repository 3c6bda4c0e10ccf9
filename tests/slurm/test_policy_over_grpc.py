"""The bridge's two ways to the policy give the same decisions: in this process
(`optimize_request`), and over real gRPC to a PolicyService as a controller serves it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc

from sia_grpc.api import add_PolicyServiceServicer_to_server
from sia_grpc.controller.service.policy_service import PolicyService
from sia_grpc.slurm.bridge import grpc_optimizer, in_process_optimizer
from sia_grpc.slurm.translate import build_round, read_jobs, read_nodes

DATA = Path(__file__).parent / "data"


async def test_the_policy_over_grpc_decides_as_the_one_in_process():
    sinfo = json.loads((DATA / "sinfo.json").read_text())
    sinfo["nodes"] = [{**n, "state_flags": []} for n in sinfo["nodes"]]  # all three nodes
    nodes, _ = read_nodes(sinfo)
    rnd = build_round(nodes, read_jobs(json.loads((DATA / "squeue.json").read_text())),
                      1796146600.0)
    server = grpc.aio.server()
    add_PolicyServiceServicer_to_server(PolicyService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        remote = await asyncio.to_thread(grpc_optimizer(f"127.0.0.1:{port}", timeout_s=30),
                                         rnd.request)
    finally:
        await server.stop(None)
    local = in_process_optimizer()(rnd.request)
    assert len(remote.decisions) == 3
    assert list(remote.decisions) == list(local.decisions)
