"""What the live bridge tests share (test_live.py, test_live_moves.py): waiting for
Slurm, submitting opted-in and Slurm's own jobs, checking jobs run as Sia decided.
Their fixtures (`cluster`, `slurm`) are in conftest.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from sia_grpc.cli import main as sia
from sia_grpc.slurm.bridge import Bridge, in_process_optimizer
from sia_grpc.slurm.commands import Slurm
from sia_grpc.slurm.translate import SlurmJob, read_jobs

WAIT_S = 30.0  # the most any Slurm state change here may take before a test fails
SPEC = "application: cifar10\nadaptivity: adaptive\nmax_gpus: 4\n"


def bridge(slurm: Slurm) -> Bridge:
    return Bridge(slurm, in_process_optimizer(), clock=lambda: time.time())


def jobs(slurm: Slurm) -> dict[int, SlurmJob]:
    return {j.job_id: j for j in read_jobs(slurm.jobs_json())}


def wait(slurm: Slurm, ready: Callable[[dict[int, SlurmJob]], bool], what: str,
         wait_s: float = WAIT_S) -> dict:
    deadline = time.monotonic() + wait_s
    while True:
        now = jobs(slurm)
        if ready(now):
            return now
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm did not reach: {what}; jobs: "
                        f"{[(j.job_id, j.state, dict(j.gpus)) for j in now.values()]}")
        time.sleep(0.2)


def submit(capsys, tmp_path, name: str) -> int:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\n{SPEC}")
    capsys.readouterr()
    assert sia(["slurm", "submit", str(spec), "--", "sleep", "300"]) == 0
    return int(capsys.readouterr().out.strip())


def own_job(slurm: Slurm, gres: str) -> int:
    out = slurm.run("sbatch", "--parsable", "-o", "/dev/null", f"--gres={gres}",
                    "--wrap", "sleep 300")
    return int(out.strip().split(";")[0])


def node_types(cluster) -> dict[str, str]:
    return {n: t for n, (t, _) in cluster.nodes.items()}


def running_as_decided(jobs: dict[int, SlurmJob], report, cluster) -> None:
    """Every opted-in job runs on the GPU type (in Slurm's name) and count Sia chose,
    on the nodes Sia placed it on (the bridge pins them)."""
    decided = {d.job_id: d.allocation for d in report.response.decisions
               if d.HasField("allocation")}
    carriers = {j.ticket.id: j for j in jobs.values() if j.ticket is not None}
    assert decided and set(decided) <= set(carriers)
    types = node_types(cluster)
    for sia_id, alloc in decided.items():
        j = carriers[sia_id]
        assert j.state == "RUNNING"
        assert sum(j.gpus.values()) == alloc.num_gpus and len(j.gpus) == alloc.num_nodes
        assert set(j.gpus) == {g.node for g in alloc.gpus}
        assert {types[n] for n in j.gpus} == {j.ticket.shape.gres_type}
        assert j.ticket.shape.gpu_type == alloc.gpu_type


def all_run(jobs: dict[int, SlurmJob]) -> bool:
    return all(j.state == "RUNNING" for j in jobs.values())


def live_in(jobs: dict[int, SlurmJob]) -> dict[int, SlurmJob]:
    return {i: j for i, j in jobs.items() if j.state in ("RUNNING", "PENDING")}
