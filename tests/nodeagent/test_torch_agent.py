"""A NodeAgent with the torch back-end, against the scripted controller over a
real stream; and the command line that selects it."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest
from nodeagent_support import SPEC, run, started_agent, stop
from torch_support import WAIT_S, alive, command, read_json, ready_pids, write_worker

from sia_grpc.api import pb
from sia_grpc.nodeagent.__main__ import main
from sia_grpc.nodeagent.torchbackend import TorchBackend

KIND = pb.JobExit
pytestmark = pytest.mark.timeout(60)


def spec_running(cmd: list[str]) -> pb.JobSpec:
    spec = pb.JobSpec()
    spec.CopyFrom(SPEC)
    spec.command[:] = cmd
    return spec


async def test_agent_runs_reports_and_stops_real_workers(controller, clock, tmp_path):
    ctl, port = controller
    worker = write_worker(tmp_path)
    backend = TorchBackend("rtx", 8, workdir=tmp_path / "agent", emulate=True, stop_grace_s=5.0,
                           cpus=[0])
    async with started_agent(port, clock, backend=backend) as agent:
        s = await ctl.stream()
        s.directive(**run(1, spec=spec_running(command(worker, "train")), restore=0.25))
        (ack,) = await s.wait("ack")
        assert ack.ok, ack.error
        ckpt = backend.checkpoint_root / "_" / "job-1"  # no tenant, no uid
        await ready_pids(ckpt, [0, 1])
        assert read_json(ckpt / "reply.json") == {"current": True}  # rank 0 reported
        await clock.advance(1.0)  # the agent's telemetry interval
        (t,) = await s.wait("telemetry", lambda t: t.job_id == "job-1")
        assert (t.generation, t.progress) == (1, 0.3)
        assert (t.checkpoint.progress, t.checkpoint.restore_s) == (0.25, 1.5)  # the restore
        # A RUN with an empty command is refused in its ack.
        s.directive(**run(2, job_id="job-2", gpus=(2,), spec=SPEC))
        (refused,) = await s.wait("ack", lambda a: a.directive_id == 2)
        assert not refused.ok and refused.error.startswith("spec.command: empty")
        s.directive(**stop(3))
        await s.wait("ack", lambda a: a.directive_id == 3)
        assert [(e.kind, e.progress) for e in s.of("exit")] == [(KIND.KIND_CHECKPOINTED, 0.4)]
        assert s.index("exit") < s.index("ack", lambda a: a.directive_id == 3)
        assert agent.backend.running() == []


async def test_agent_reports_a_failed_job(controller, clock, tmp_path):
    ctl, port = controller
    worker = write_worker(tmp_path)
    backend = TorchBackend("rtx", 8, workdir=tmp_path / "agent", emulate=True, stop_grace_s=5.0,
                           cpus=[0])
    async with started_agent(port, clock, backend=backend):
        s = await ctl.stream()
        s.directive(**run(1, spec=spec_running(command(worker, "crash", "0"))))
        (e,) = await s.wait("exit")
        assert (e.job_id, e.kind) == ("job-1", KIND.KIND_FAILED)
        assert e.message.startswith("rank 0 exit code 3\n")


# -- the command line ------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "error"), [
    (["--gpus", "rtx:2,a100:2"], "run one agent per type"),
    (["--backend", "torch", "--emulate", "rtx:2,a100:2"], "run one agent per type"),
    (["--backend", "torch", "--emulate", "rtx:2", "--gpus", "rtx:2"], "not both"),
    (["--emulate", "rtx:2"], "--emulate: only with --backend torch"),
    (["--backend", "modeled"], "--gpus TYPE:COUNT is required with --backend modeled"),
    (["--backend", "gpu", "--gpus", "rtx:2"], "invalid choice: 'gpu'"),
    (["--backend", "torch", "--emulate", "rtx:2", "--stop-grace", "-1"],
     "expected seconds >= 0"),
])
def test_bad_torch_arguments_exit_2(argv, error, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--controller", "ctl:1", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and error in err


def test_unknown_emulated_type_and_missing_gpus_are_explained(capsys):
    assert main(["--controller", "ctl:1", "--backend", "torch", "--emulate", "h100:2"]) == 2
    assert "cannot emulate GPU type 'h100'" in capsys.readouterr().err
    # No NVML here (pynvml is not installed): real GPUs must be declared.
    assert main(["--controller", "ctl:1", "--backend", "torch"]) == 2
    assert "no GPUs found" in capsys.readouterr().err


async def test_emulating_agent_process_runs_and_stops_workers(controller, tmp_path):
    ctl, port = controller
    worker = write_worker(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.nodeagent", "--controller", f"127.0.0.1:{port}",
        "--node-id", "emu", "--backend", "torch", "--emulate", "rtx:2",
        "--workdir", str(tmp_path / "agent"), "--stop-grace", "5", "--log-format", "json",
        "--isolation", "none",  # (tests/nodeagent/test_isolation.py: the other levels)
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60):
            while not ctl.streams:
                await asyncio.sleep(0.05)
        s = ctl.streams[0]
        assert list(s.register.gpus) == [pb.GpuInventory(gpu_type="rtx", count=2)]
        s.directive(**run(1, spec=spec_running(command(worker, "train"))))
        (ack,) = await s.wait("ack")
        assert ack.ok, ack.error
        pids = await ready_pids(tmp_path / "agent" / "checkpoints" / "_" / "job-1", [0, 1])
        proc.send_signal(signal.SIGTERM)  # the agent checkpoints its jobs as it closes
        async with asyncio.timeout(WAIT_S):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert [(e.kind, e.progress) for e in s.of("exit")] == [(KIND.KIND_CHECKPOINTED, 0.4)]
        assert not any(alive(p) for p in pids)
        assert b"EMULATION: this agent has no GPUs" in err
        # --log-format json holds for the back-end's lines too (it was built, and
        # bound its logger, before the logging was configured).
        lines = [json.loads(line) for line in err.decode().splitlines()]
        assert {"worker service listening", "EMULATION: no GPU is used; workers run on the "
                "CPU, paced as GPU type 'rtx'"} <= {line["event"] for line in lines}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
