"""The torch back-end with real worker processes: a stand-in worker
(`torch_support.WORKER`, plain Python) speaks the contract in place of
sia_grpc.train: its environment, exit codes and WorkerService reports."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from torch_support import (
    WAIT_S,
    alive,
    command,
    launch,
    make_backend,
    read_json,
    ready_pids,
    report,
    until_dead,
    write_worker,
)

from sia_grpc.api import pb
from sia_grpc.nodeagent.gpus import emulation_pace
from sia_grpc.nodeagent.torchbackend import TorchBackend
from sia_grpc.nodeagent.workerservice import MAX_SOCKET_PATH
from sia_grpc.train import contract

KIND = pb.JobExit
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    return write_worker(tmp_path)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[TorchBackend]:
    b = make_backend(tmp_path)
    yield b
    await b.close()


def ckpt_of(b: TorchBackend, job_id: str) -> Path:
    """Its checkpoint folder: by tenant ("_": none) and uid (none: the job id)."""
    return b.checkpoint_root / "_" / job_id


async def test_env_contract_per_rank_on_emulated_gpus(backend, worker, tmp_path):
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs cores 0 and 1")
    # Ranks 2 and 3 of a 4-rank world (another node holds 0 and 1), on emulated rtx.
    ckpt = tmp_path / "ckpt" / "job-env"
    l = launch("job-env", command(worker, "env"), gpus=(1, 0), world_size=4, rank_offset=2,
               checkpoint_path=str(ckpt), epochs=2.5)
    await backend.start(l, lambda e: None)
    await ready_pids(ckpt, [2, 3])
    envs = [read_json(ckpt / f"env-{r}.json") for r in (2, 3)]
    pace = f"{emulation_pace('rtx', 'cifar10'):.6g}"
    for i, env in enumerate(envs):
        assert env == {
            "RANK": str(2 + i), "WORLD_SIZE": "4", "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "node-a", "MASTER_PORT": str(l.world.master_port),
            contract.ENV_JOB_ID: "job-env", contract.ENV_GENERATION: "1",
            # its generation's gate, in its own folder, and the secret to report with
            contract.ENV_AGENT_SOCKET: str(backend.channel("job-env")[0]),
            contract.ENV_AGENT_TOKEN: env[contract.ENV_AGENT_TOKEN],
            contract.ENV_CHECKPOINT_DIR: str(ckpt), contract.ENV_GPU_TYPE: "rtx",
            contract.ENV_BATCH_SIZE: "128", contract.ENV_ATOMIC_BATCH_SIZE: "32",
            contract.ENV_ACCUM_STEPS: "1", contract.ENV_TARGET_EPOCHS: "2.5",
            contract.ENV_PACE: pace, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
            # emulated GPU g owns core g of the two: local rank 0 runs on GPU 1
            "affinity": [1 - i]}
    assert float(pace) > 1.0  # rtx is slower than the fastest type
    assert (backend.workdir / "jobs" / "job-env" / "gen-1" / "rank-2.log").exists()
    assert [(r.job_id, r.generation, list(r.local_gpus)) for r in backend.running()] == [
        ("job-env", 1, [1, 0])]
    ended = await backend.stop("job-env")
    assert (ended.kind, ended.progress) == (KIND.KIND_CHECKPOINTED, 0.0)
    assert backend.running() == []


async def test_env_on_real_gpus_single_node(tmp_path, worker, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the agent's own GPUs
    monkeypatch.setenv("SIA_PROFILE", "1,2")  # never leaks from the agent's environment
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the agent's own setting
    b = make_backend(tmp_path, emulate=False, num_gpus=4)
    try:
        l = launch("job-gpu", command(worker, "env"), gpus=(3, 1), samples=5000)
        await b.start(l, lambda e: None)
        await ready_pids(ckpt_of(b, "job-gpu"), [0, 1])
        for rank in (0, 1):
            env = read_json(ckpt_of(b, "job-gpu") / f"env-{rank}.json")
            # single node: rendezvous on the loopback, at the directive's port
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (
                "127.0.0.1", str(l.world.master_port))
            assert env["CUDA_VISIBLE_DEVICES"] == "7,5"  # the job's GPUs, local-rank order
            assert env[contract.ENV_TARGET_SAMPLES] == "5000"
            assert contract.ENV_PACE not in env and contract.ENV_PROFILE not in env
            # Not the agent's: a worker gets only the allow-listed part of its environment.
            assert "OMP_NUM_THREADS" not in env
            assert env[contract.ENV_CHECKPOINT_DIR] == str(ckpt_of(b, "job-gpu"))
    finally:
        await b.close()


async def test_stop_sigterms_and_reports_the_checkpoint(backend, worker):
    l = launch("job-1", command(worker, "train"), gpus=(0, 1), restore=0.2)
    await backend.start(l, lambda e: pytest.fail(f"unexpected exit {e}"))
    ckpt = ckpt_of(backend, "job-1")
    pids = await ready_pids(ckpt, [0, 1])
    assert read_json(ckpt / "reply.json") == {"current": True}
    ended = await backend.stop("job-1")
    # rank 0 reported its checkpoint (progress 0.4) on SIGTERM, then both exited 75
    assert (ended.job_id, ended.generation, ended.kind, ended.progress) == (
        "job-1", 1, KIND.KIND_CHECKPOINTED, 0.4)
    assert (ckpt / "terminated-0").exists() and (ckpt / "terminated-1").exists()
    assert not any(alive(p) for p in pids)
    (t,) = backend.telemetry()  # the reports still come up, after the exit
    assert t.checkpoint.progress == 0.4 and t.progress == 0.4
    # restored from 0.2: the start-up time is the measured restore cost
    assert t.checkpoint.restore_s == 1.5
    assert backend.telemetry() == []


async def test_worker_ignoring_sigterm_is_killed_after_the_grace(tmp_path, worker):
    b = make_backend(tmp_path, stop_grace_s=0.5)
    try:
        await b.start(launch("stubborn", command(worker, "ignore-term")), lambda e: None)
        (pid,) = await ready_pids(ckpt_of(b, "stubborn"), [0])
        began = time.monotonic()
        ended = await b.stop("stubborn")
        assert time.monotonic() - began >= 0.5
        assert ended.kind == KIND.KIND_FAILED
        assert ended.message.startswith("rank 0 killed by SIGKILL (still running 0.5 s after "
                                        "SIGTERM)")
        assert not alive(pid)
    finally:
        await b.close()


async def test_a_crashed_rank_stops_its_siblings_and_fails_with_the_log_tail(backend, worker):
    exits: list[pb.JobExit] = []
    l = launch("crashy", command(worker, "crash", "1"), gpus=(0, 1), restore=0.1)
    await backend.start(l, exits.append)
    ckpt = ckpt_of(backend, "crashy")
    pids = await ready_pids(ckpt, [0, 1])
    async with asyncio.timeout(WAIT_S):
        while not exits:
            await asyncio.sleep(0.01)
    (e,) = exits
    assert (e.job_id, e.generation, e.kind, e.progress) == ("crashy", 1, KIND.KIND_FAILED, 0.1)
    first, log_line, *tail = e.message.splitlines()
    assert first == "rank 1 exit code 3"
    assert log_line == f"log {backend.workdir}/jobs/crashy/gen-1/rank-1.log:"
    assert tail[-1] == "Traceback: something broke" and len(tail) == 20
    assert (ckpt / "terminated-0").exists()  # the sibling was stopped with SIGTERM
    assert backend.running() == [] and not any(alive(p) for p in pids)


async def test_completion_reports_completed(backend, worker):
    exits: list[pb.JobExit] = []
    await backend.start(launch("done", command(worker, "complete"), gpus=(0, 1)), exits.append)
    async with asyncio.timeout(WAIT_S):
        while not exits:
            await asyncio.sleep(0.01)
    assert [(e.kind, e.progress) for e in exits] == [(KIND.KIND_COMPLETED, 1.0)]
    assert backend.running() == []


async def test_oom_report_goes_into_the_failure_message(backend, worker):
    exits: list[pb.JobExit] = []
    await backend.start(launch("oom", command(worker, "oom")), exits.append)
    async with asyncio.timeout(WAIT_S):
        while not exits:
            await asyncio.sleep(0.01)
    (e,) = exits
    assert e.kind == KIND.KIND_FAILED
    assert e.message.startswith("rank 0 exit code 1; out of memory at atomic_batch_size=512: "
                                "CUDA out of memory\n")
    assert "RuntimeError: CUDA out of memory" in e.message


async def test_reports_count_for_the_generation_whose_secret_they_carry(backend, worker):
    await backend.start(launch("job-1", command(worker, "sleep"), generation=2), lambda e: None)
    await ready_pids(ckpt_of(backend, "job-1"), [0])
    gen2 = backend.channel("job-1")
    assert (await report(gen2, "job-1", 2)).current is True
    # What the report names does not matter: the secret says who sent it.
    assert (await report(gen2, "nobody", 7)).current is True
    assert (await report((gen2[0], ""), "job-1", 2)).current is False  # no secret
    assert (await report((gen2[0], "forged"), "job-1", 2)).current is False
    assert backend.rejected_reports == 2
    # A start of a newer generation stops the old one first: its secret is void.
    await backend.start(launch("job-1", command(worker, "sleep"), generation=3), lambda e: None)
    assert [(r.job_id, r.generation) for r in backend.running()] == [("job-1", 3)]
    gen3 = backend.channel("job-1")
    assert gen3[1] != gen2[1] and gen3[0] != gen2[0]
    assert (await report((gen3[0], gen2[1]), "job-1", 3)).current is False
    assert (await report(gen3, "job-1", 3)).current is True
    with pytest.raises(ValueError, match="already runs here"):
        await backend.start(launch("job-1", command(worker, "sleep"), generation=3),
                            lambda e: None)


async def test_rebatch_shows_up_in_the_next_reply_once(backend, worker):
    await backend.start(launch("job-1", command(worker, "sleep")), lambda e: None)
    sock = backend.channel("job-1")
    assert await report(sock, "job-1", 1) == pb.WorkerReply(current=True)
    new = pb.Allocation(gpu_type="rtx", num_gpus=1, num_nodes=1, num_replicas=1,
                        batch_size=96, atomic_batch_size=48, accum_steps=1)
    await backend.rebatch("job-1", new)
    assert backend.allocation("job-1") == new
    # Only rank 0 takes it (another rank reports only an out-of-memory error).
    assert await report(sock, "job-1", 1, rank=1) == pb.WorkerReply(current=True)
    assert await report(sock, "job-1", 1) == pb.WorkerReply(
        current=True, batch_size=96, atomic_batch_size=48, accum_steps=1)
    assert await report(sock, "job-1", 1) == pb.WorkerReply(current=True)  # unchanged since


async def test_telemetry_merges_samples_and_keeps_the_latest(backend, worker):
    await backend.start(launch("job-1", command(worker, "sleep")), lambda e: None)
    sock = backend.channel("job-1")
    assert backend.telemetry() == []  # nothing reported yet

    def sample(atomic: int, step: float, count: int) -> pb.ThroughputSample:
        return pb.ThroughputSample(gpu_type="rtx", num_nodes=1, num_replicas=1,
                                   atomic_batch_size=atomic, accum_steps=0, step_time_s=step,
                                   sync_time_s=step / 10, count=count)

    await report(sock, "job-1", 1, telemetry=dict(
        samples=[sample(32, 1.0, 2)], progress=0.1, grad=pb.GradientStats(sqr=1, var=2)),
        startup_s=3.0)
    await report(sock, "job-1", 1, telemetry=dict(
        samples=[sample(32, 2.0, 6), sample(64, 3.0, 1)], progress=0.2,
        grad=pb.GradientStats(sqr=3, var=4)))
    await report(sock, "job-1", 1, rank=1, telemetry=dict(  # not rank 0: not the job's
        samples=[sample(32, 9.0, 9)], progress=0.9))
    (t,) = backend.telemetry()
    assert (t.job_id, t.generation, t.progress, t.profile) == ("job-1", 1, 0.2, False)
    assert t.grad == pb.GradientStats(sqr=3, var=4)
    by_size = {s.atomic_batch_size: s for s in t.samples}
    assert by_size[32].count == 8 and by_size[32].step_time_s == pytest.approx(1.75)
    assert by_size[32].sync_time_s == pytest.approx(0.175)
    assert by_size[64].count == 1 and by_size[64].step_time_s == 3.0
    assert not t.HasField("checkpoint")  # a fresh start (restore 0) restored nothing
    assert backend.telemetry() == []  # merged since the previous call only
    await report(sock, "job-1", 1, telemetry=dict(samples=[sample(32, 1.0, 1)]))
    (t,) = backend.telemetry()
    assert [s.count for s in t.samples] == [1] and t.progress == 0.2  # progress kept


async def test_profile_returns_the_reported_profile(backend, worker):
    spec = pb.JobSpec(name="p", application="cifar10", command=command(worker, "profile"))
    req = pb.ProfileRequest(job_id="job-p", generation=4, spec=spec, local_gpu=1,
                            local_batch_sizes=[32, 64, 128])
    t = await backend.profile(req)
    assert (t.job_id, t.generation, t.profile) == ("job-p", 4, True)
    assert [(s.atomic_batch_size, s.count, s.gpu_type) for s in t.samples] == [
        (32, 3, "rtx"), (64, 3, "rtx"), (128, 3, "rtx")]
    assert t.grad == pb.GradientStats(sqr=1.0, var=2.0)
    assert (backend.workdir / "jobs" / "job-p" / "profile-gen-4-gpu-1.log").exists()
    # A pass that does not end with EXIT_PROFILED, or reports nothing, is an error.
    req.spec.command[:] = command(worker, "exit", "76")
    with pytest.raises(RuntimeError, match="reported no samples"):
        await backend.profile(req)
    req.spec.command[:] = command(worker, "exit", "2")
    with pytest.raises(RuntimeError, match="profiling pass ended with exit code 2, not 76"):
        await backend.profile(req)


async def test_profile_timeout_kills_the_pass(tmp_path, worker):
    b = make_backend(tmp_path, profile_timeout_s=0.5)
    try:
        spec = pb.JobSpec(name="p", command=command(worker, "sleep"))
        with pytest.raises(RuntimeError, match="still running after 0.5 s; killed"):
            await b.profile(pb.ProfileRequest(job_id="slow", spec=spec, local_batch_sizes=[8]))
    finally:
        await b.close()


async def test_check_rejects_what_cannot_start(backend, worker, tmp_path):
    with pytest.raises(ValueError, match="spec.command: empty"):
        backend.check(launch("j", []))
    with pytest.raises(ValueError, match="not found on the agent's PATH"):
        backend.check(launch("j", ["no-such-program-sia"]))
    with pytest.raises(ValueError, match="is not an executable file"):
        backend.check(launch("j", [str(worker)]))  # not executable itself
    with pytest.raises(ValueError, match="GPU 2 does not exist"):
        backend.check(launch("j", command(worker, "sleep"), gpus=(2,)))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        backend.check(launch("j", command(worker, "sleep"), checkpoint_path=str(blocker / "x")))
    multi = dataclasses.replace(launch("j", command(worker, "sleep")),
                                world=pb.WorldLayout(world_size=2))
    with pytest.raises(ValueError, match="multi-node job needs master_addr"):
        backend.check(multi)
    assert backend.running() == []


async def test_close_leaves_no_worker_alive_and_is_idempotent(tmp_path, worker):
    b = make_backend(tmp_path, stop_grace_s=30.0)
    exits: list[pb.JobExit] = []
    await b.start(launch("a", command(worker, "ignore-term"), gpus=(0,)), exits.append)
    await b.start(launch("b", command(worker, "sleep"), gpus=(1,)), exits.append)
    pids = await ready_pids(ckpt_of(b, "a"), [0]) + await ready_pids(ckpt_of(b, "b"), [0])
    sock = b.socket_path
    began = time.monotonic()
    await b.close()
    await b.close()
    assert time.monotonic() - began < 5.0  # no stop grace on close
    for pid in pids:  # reaped by the back-end itself: gone, not even a zombie
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert exits == [] and b.running() == []
    assert sock is not None and not sock.exists()
    with pytest.raises(RuntimeError, match="closed"):
        await b.start(launch("c", command(worker, "sleep")), exits.append)


async def test_one_agent_per_workdir(tmp_path):
    a, b = make_backend(tmp_path), make_backend(tmp_path)
    await a.open()
    try:
        with pytest.raises(RuntimeError, match="in use by another agent"):
            await b.open()
    finally:
        await a.close()
        await b.close()


async def test_a_long_workdir_puts_the_socket_in_a_temporary_directory(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    b = make_backend(tmp_path, workdir=deep)
    await b.open()
    try:
        assert b.socket_path is not None and b.socket_path.exists()
        assert len(os.fsencode(b.socket_path)) <= MAX_SOCKET_PATH
        assert not b.socket_path.is_relative_to(deep)
        tmpdir = b.socket_path.parent
    finally:
        await b.close()
    assert not tmpdir.exists()


AGENT = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {support!r})
    from pathlib import Path
    from torch_support import command, launch, make_backend, ready_pids

    async def main():
        b = make_backend(Path({tmp!r}))
        await b.start(launch("orphan", command(Path({worker!r}), "ignore-term"), gpus=(0, 1)),
                      lambda e: None)
        pids = await ready_pids(b.checkpoint_root / "_" / "orphan", [0, 1])
        print("PIDS", *pids, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


async def test_workers_die_with_a_killed_agent(tmp_path, worker):
    script = tmp_path / "agent.py"
    script.write_text(AGENT.format(support=str(Path(__file__).parent), tmp=str(tmp_path),
                                   worker=str(worker)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    stdout = proc.stdout
    assert stdout is not None
    try:
        async with asyncio.timeout(WAIT_S):
            while not (line := await asyncio.to_thread(stdout.readline)).startswith(b"PIDS"):
                assert line, "the agent ended"
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)  # no chance to clean up: the kernel must
        await until_dead(pids, timeout=5.0)
    finally:
        proc.kill()
        proc.wait()
        stdout.close()


async def test_gpus_held_back_go_to_no_one_until_the_processes_go(backend, worker):
    """Rule: a GPU whose job's processes would not die goes to no other job, and is
    listed as that job's until they do; then it is free and the job is gone."""
    real_leave, tries, gone = backend.isolation.leave, [], asyncio.Event()

    async def stubborn(space):  # something in the run's cgroup lives on until `gone`
        tries.append(space)
        return gone.is_set() and await real_leave(space)

    backend.isolation.leave = stubborn
    backend.held_back_retry_s = 0.05
    await backend.start(launch("job-1", command(worker, "train"), gpus=(0,)), lambda e: None)
    await ready_pids(ckpt_of(backend, "job-1"), [0])
    ended = await backend.stop("job-1")
    assert "held back" in ended.message
    assert [r.job_id for r in backend.running()] == ["job-1"]
    with pytest.raises(ValueError, match="GPU 0 is held back"):
        backend.check(launch("job-2", command(worker, "sleep"), gpus=(0,)))
    gone.set()
    async with asyncio.timeout(WAIT_S):
        while backend.running():
            await asyncio.sleep(0.02)
    assert len(tries) >= 2
    backend.check(launch("job-2", command(worker, "sleep"), gpus=(0,)))  # free again
