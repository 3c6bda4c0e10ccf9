"""Node isolation (issue 36): a tenant's job can touch nothing but itself.

Real processes, real users, real cgroups, as root: for each isolation level that
separates jobs (user, sandbox), a hostile job of tenant B (`hostile.py`) tries
every attack of the issue against a running job of tenant A and against the
agent, and fails; the victim trains on to SUCCEEDED; after the hostile job is
stopped nothing of it is left; a job over its memory limit is killed and says so;
a job id reused after a delete finds nothing of the old job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from torch_support import alive, launch, make_backend, until_dead, wait_file

from sia_grpc.api import pb
from sia_grpc.nodeagent.isolation.levels import IsolationUnavailable
from sia_grpc.nodeagent.isolation.node import Limits
from sia_grpc.nodeagent.isolation.sandbox import python_paths
from sia_grpc.nodeagent.isolation.setup import build_isolation
from sia_grpc.nodeagent.torchbackend import TorchBackend
from sia_grpc.nodeagent.torchworkers.workdir import safe_name

KIND = pb.JobExit
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("heavy"),
              pytest.mark.skipif(os.geteuid() != 0,
                                 reason="needs root: job users, cgroups and sandboxes")]
HOSTILE = Path(__file__).with_name("hostile.py")
LEVELS = ["user", "sandbox"]


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the jobs' users can pass through (pytest's tmp_path is 0700, like /root)."""
    d = Path(tempfile.mkdtemp(prefix="sia-iso-"))
    os.chmod(d, 0o711)
    (d / "code").mkdir(mode=0o755)
    shutil.copy(HOSTILE, d / "code" / "hostile.py")
    os.chmod(d / "code" / "hostile.py", 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def isolated(base: Path, level: str, **limits: object) -> TorchBackend:
    try:
        iso = build_isolation(level, run_root=base / "agent" / "run", node_id="iso",
                              limits=Limits(sandbox_ro=(str(base / "code"),), **limits),
                              log=structlog.get_logger())
    except IsolationUnavailable as exc:
        if "searchable by other users" in str(exc):  # the runner's Python, not our code
            pytest.skip(f"the job users cannot start this Python: {exc}")
        raise
    return make_backend(base, checkpoint_root=base / "ckpt", isolation=iso)


def job(job_id: str, tenant: str, cmd: list[str], *, uid: str, gpus: tuple[int, ...] = (0,),
        **env: str) -> object:
    l = launch(job_id, cmd, gpus=gpus, tenant=tenant, env=env)
    return dataclasses.replace(l, job_uid=uid)


def mlp(epochs: str = "1") -> list[str]:
    return [sys.executable, "-m", "sia_grpc.train.examples.mlp", "--epochs", epochs,
            "--samples", "2048"]


@pytest.fixture
async def exits() -> AsyncIterator[list[pb.JobExit]]:
    yield []


@pytest.mark.parametrize("level", LEVELS)
async def test_a_hostile_job_touches_nothing_but_itself(base, level, monkeypatch, exits):
    # What the agent holds that a job must never see.
    key = base / "agent-key.pem"
    key.write_text("PRIVATE KEY")
    os.chmod(key, 0o640)
    monkeypatch.setenv("SIA_TLS_KEY", str(key))
    monkeypatch.setenv("AGENT_SECRET", "hunter2")
    b = isolated(base, level)
    assert b.isolation_level == level
    try:
        victim = job("train-1", "team-a", mlp("3"), uid="a" * 32, gpus=(0,))
        await b.start(victim, exits.append)
        v_socket, _ = b.channel("train-1")
        v_ckpt = base / "ckpt" / "team-a" / ("a" * 32)
        v_pid = b._groups["train-1"].procs[0].pid
        v_log = b.workdir / "jobs" / "train-1" / "gen-1" / "rank-0.log"
        hostile = job("train-1", "team-b", [sys.executable, str(base / "code" / "hostile.py")],
                      uid="b" * 32, gpus=(1,), VICTIM_PID=str(v_pid), VICTIM_CKPT=str(v_ckpt),
                      VICTIM_SOCKET=str(v_socket), VICTIM_LOG=str(v_log),
                      AGENT_WORKDIR=str(b.workdir), AGENT_KEY=str(key),
                      AGENT_PID=str(os.getpid()), FORKS="5000")
        hostile = dataclasses.replace(hostile, job_id="train-1-b")
        await b.start(hostile, exits.append)
        h_ckpt = base / "ckpt" / "team-b" / ("b" * 32)
        report = json.loads(await wait_file(h_ckpt / "attacks.json", timeout=120))
        attacks = {k: v for k, v in report.items() if isinstance(v, str)
                   and not k.startswith(("home", "tmp"))}
        assert attacks, report
        # In the sandbox the agent's folder path is a folder of the job's private /tmp:
        # writing there is allowed, and reaches nothing (checked below).
        harmless = {"write into the agent's work folder"} if level == "sandbox" else set()
        assert not {k: v for k, v in attacks.items()
                    if not v.startswith("blocked") and k not in harmless}
        assert report["uid"] not in (0, os.getuid())
        assert report["home"] == str(b.workdir / "run" / "team-b" / ("b" * 32))
        if level == "sandbox":
            # A private /tmp: nothing of the host's, only the way to its own folders
            # and to the read-only code (a checkout under /tmp, as a CI clone is).
            bound = {Path(p).relative_to("/tmp").parts[0] for p in python_paths()
                     if p.startswith("/tmp/")}
            assert report["tmp"] == "/tmp"
            assert set(report["tmp_entries"]) <= {base.name} | bound
        orphan = report["orphan_pid"]
        ended = await b.stop("train-1-b")
        assert ended.kind in (KIND.KIND_CHECKPOINTED, KIND.KIND_FAILED)
        if level == "user":  # (in the sandbox the pid is in its namespace)
            await until_dead([orphan], timeout=10)
        # The victim trains on to its end; nothing the hostile job did reached it.
        async with asyncio.timeout(180):
            while not any(e.job_id == "train-1" for e in exits):
                await asyncio.sleep(0.1)
        (done,) = [e for e in exits if e.job_id == "train-1"]
        assert done.kind == KIND.KIND_COMPLETED, done.message
        assert not (v_ckpt / "ckpt-gen99.pt").exists()
        assert not (b.workdir / "planted").exists()
        assert b"forged" not in v_log.read_bytes()
        assert b.rejected_reports == 0  # its only way to the agent was its own gate
        # Nothing of it runs: the whole cgroup was killed at its stop (a SIGKILLed
        # process may take a moment to go; its GPU is held back until it has).
        await until_dead(_processes_of(report["uid"]), timeout=10)
        assert not _processes_of(report["uid"])
    finally:
        await b.close()


def _processes_of(uid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid and alive(int(entry)):
                    out.append(int(entry))
            except FileNotFoundError:
                pass
    return out


@pytest.mark.parametrize("level", LEVELS)
async def test_a_job_over_its_memory_limit_is_killed_and_says_so(base, level, exits):
    b = isolated(base, level, memory_per_gpu=256 << 20)
    try:
        hog = job("hog", "team-b", [sys.executable, str(base / "code" / "hostile.py")],
                  uid="c" * 32, VICTIM_PID="1", VICTIM_CKPT="/nonexistent",
                  VICTIM_SOCKET="/nonexistent", VICTIM_LOG="/nonexistent",
                  AGENT_WORKDIR=str(b.workdir), AGENT_KEY="/nonexistent", AGENT_PID="1",
                  FORKS="1", THEN="oom", HOG_MIB="1024")
        await b.start(hog, exits.append)
        async with asyncio.timeout(120):
            while not exits:
                await asyncio.sleep(0.05)
        (e,) = exits
        assert e.kind == KIND.KIND_FAILED
        assert e.message.startswith("killed for memory: the job used all the host memory it "
                                    "may use on this node (256 MiB"), e.message
        assert b.running() == []
    finally:
        await b.close()


@pytest.mark.parametrize("level", LEVELS)
async def test_a_reused_job_id_sees_nothing_of_the_old_job(base, level, exits):
    b = isolated(base, level)
    b.isolation.linger_s = 0.2  # (a job's uid and folders outlive its last run that long)
    try:
        first = job("again", "team-a", [sys.executable, "-c", (
            "import os; d = os.environ['SIA_CHECKPOINT_DIR']; "
            "open(os.path.join(d, 'ckpt-gen1.pt'), 'w').write('weights')")], uid="d" * 32)
        await b.start(first, exits.append)
        async with asyncio.timeout(120):
            while not exits:
                await asyncio.sleep(0.05)
        assert exits[0].kind == KIND.KIND_COMPLETED, exits[0].message
        old = base / "ckpt" / "team-a" / ("d" * 32)
        assert any(old.iterdir())  # it left checkpoints
        async with asyncio.timeout(30):  # handed back once the linger is over
            while old.stat().st_uid != os.geteuid():
                await asyncio.sleep(0.05)
        assert old.stat().st_mode & 0o777 == 0o700
        # Deleted, and created again under the same id: a new uid, a new, empty folder.
        second = job("again", "team-a", [sys.executable, "-c", (
            "import os, sys; d = os.environ['SIA_CHECKPOINT_DIR']; "
            f"sys.exit(3 if os.listdir(d) else (4 if os.access({str(old)!r}, os.R_OK) "
            "else 0))")], uid="e" * 32)
        await b.start(second, exits.append)
        async with asyncio.timeout(60):
            while len(exits) < 2:
                await asyncio.sleep(0.05)
        assert exits[1].kind == KIND.KIND_COMPLETED, exits[1].message
    finally:
        await b.close()


async def test_an_agent_that_cannot_isolate_refuses_to_start(tmp_path):

    # Not root, no capabilities: strict refuses, and says how to run without it.
    code = await asyncio.to_thread(_run_agent_as_nobody, tmp_path)
    if "No module named 'sia_grpc'" in code[1]:
        pytest.skip("nobody cannot read this checkout (a folder on its path is not "
                    "readable by other users, e.g. a `mktemp -d` clone), so the agent "
                    "cannot be run as nobody here")
    assert code[0] == 2, code
    assert "--isolation none" in code[1]


async def test_an_agent_whose_cgroups_fail_its_trial_refuses_with_the_reason(tmp_path):
    """Root with the unit's six capabilities and not CAP_SYS_ADMIN: on cgroup v1 the
    devices controller refuses the job cgroup's rules. The agent must say so and exit
    2 (no restart), not die with a traceback; where the host allows it, it starts."""
    import subprocess

    caps = "-all,+setuid,+setgid,+chown,+fowner,+dac_override,+kill"
    proc = await asyncio.to_thread(subprocess.Popen, [
        "setpriv", "--bounding-set", caps, sys.executable, "-m", "sia_grpc.nodeagent",
        "--controller", "127.0.0.1:1", "--backend", "torch", "--emulate", "rtx:1",
        "--workdir", str(tmp_path / "w")], stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = await asyncio.to_thread(proc.communicate)
        assert "Traceback" not in err
        return  # isolated and running (trying to reach the controller)
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "a trial job failed" in err


def _run_agent_as_nobody(tmp_path: Path) -> tuple[int, str]:
    import subprocess

    os.chmod(tmp_path, 0o777)
    proc = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         sys.executable, "-m", "sia_grpc.nodeagent", "--controller", "127.0.0.1:1",
         "--backend", "torch", "--emulate", "rtx:1", "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=60, cwd="/")
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("level", LEVELS)
async def test_profiling_a_resize_and_a_move_between_two_agents_under_different_users(
        base, level, exits):
    """Profiling under isolation, a resize (1 GPU to 2 on one agent: a new generation
    in a new cgroup, the same uid), then the job checkpointed on that agent and resumed
    on another (one machine, two agents, a uid each)."""
    a = isolated(base, level)
    b_base = base / "other"
    b_base.mkdir(mode=0o711)
    b = make_backend(b_base, checkpoint_root=base / "ckpt", isolation=build_isolation(
        level, run_root=b_base / "agent" / "run", node_id="iso-b",
        uid_range=(210_000, 210_100), limits=Limits(sandbox_ro=(str(base / "code"),))))
    # (20 epochs: an epoch is ~0.1 s of steps, and with 4 a loaded machine saw the
    # resized generation finish before the stop that was to checkpoint it)
    command = mlp("20")
    try:
        spec = pb.JobSpec(name="mover", application="cifar10", tenant="team-a",
                          command=command)
        t = await a.profile(pb.ProfileRequest(job_id="mover", generation=1, spec=spec,
                                              job_uid="f" * 32, local_gpu=0,
                                              local_batch_sizes=[16, 32]))
        assert t.profile and {s.atomic_batch_size for s in t.samples} == {16, 32}
        first = job("mover", "team-a", command, uid="f" * 32)
        await a.start(first, exits.append)
        ckpt = base / "ckpt" / "team-a" / ("f" * 32)
        async with asyncio.timeout(120):  # trains a while, then is moved
            while a.telemetry() == []:
                await asyncio.sleep(0.2)
        stopped = await a.stop("mover")  # checkpoints on the way out
        assert stopped.kind == KIND.KIND_CHECKPOINTED, stopped.message
        assert any(ckpt.glob("ckpt-gen*.pt"))
        owner = ckpt.stat().st_uid
        assert owner != os.geteuid()  # the job's, lingering for its next run here
        resized = dataclasses.replace(
            job("mover", "team-a", command, uid="f" * 32, gpus=(0, 1)), generation=2,
            restore_progress=stopped.progress)
        await a.start(resized, exits.append)
        async with asyncio.timeout(120):
            while not any(t.generation == 2 for t in a.telemetry()):
                await asyncio.sleep(0.2)
        stopped = await a.stop("mover")
        assert stopped.kind == KIND.KIND_CHECKPOINTED, stopped.message
        assert not exits
        assert ckpt.stat().st_uid == owner  # the resize kept the job's uid and files
        second = dataclasses.replace(job("mover", "team-a", command, uid="f" * 32),
                                     generation=3, restore_progress=stopped.progress)
        await b.start(second, exits.append)
        async with asyncio.timeout(180):
            while not exits:
                await asyncio.sleep(0.1)
        assert exits[0].kind == KIND.KIND_COMPLETED, exits[0].message
        log = (b.workdir / "jobs" / safe_name("mover") / "gen-3" / "rank-0.log").read_text()
        assert "restored" in log.lower() or stopped.progress > 0
    finally:
        await a.close()
        await b.close()
